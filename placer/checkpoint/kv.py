"""The KV cache llama.cpp allocates for a model at a context: its bytes from the model's config
(a config.json, or a GGUF inventory's metadata), per layer.

Sources, all ggml-org/llama.cpp 0c1e57098bba43ac29e6e3b677cdceebdd22334f (the tree
llama-cpp-python 0.3.36 vendors):

- `src/llama-kv-cache.cpp` (llama_kv_cache::llama_kv_cache): every layer with KV gets a K
  tensor of `type_k`, n_embd_k_gqa(il) x kv_size (x streams), and a V tensor of `type_v`,
  n_embd_v_gqa(il) x kv_size, except under MLA (`has_v = !is_mla`: V is read out of K);
  n_embd_k_gqa(il) = n_embd_head_k(il) x n_head_kv(il) (`src/llama-hparams.cpp`): the head
  width given (head_dim, GGUF `attention.key_length`), else n_embd / n_head.
- MLA (DeepSeek-V2/V3): `conversion/deepseek.py` writes the GGUF as MQA with wider heads,
  head_count_kv 1, key_length = kv_lora_rank + qk_rope_head_dim, value_length =
  kv_lora_rank, and key_length_mla (which makes `hparams.is_mla()` true,
  `src/models/deepseek2.cpp`): so a token costs kv_lora_rank + qk_rope_head_dim values of
  type_k per layer and no V.
- Sliding-window layers (`src/llama-kv-cache-iswa.cpp`): the non-SWA layers hold the padded
  context; the SWA layers a cache of GGML_PAD(min(n_ctx, n_swa x (unified ? n_seq_max : 1) +
  n_ubatch), 256) cells per stream. Which layers are SWA: the GGUF's
  `attention.sliding_window_pattern` (a per-layer array, or a period), else the period the
  architecture's loader sets (`load_swa_pattern(ml, N[, dense_first])` in `src/models/*.cpp`,
  SWA_PATTERNS below) where `attention.sliding_window` is set; from a config.json,
  transformers' `layer_types` ("sliding_attention" / "full_attention", what its cache classes,
  `DynamicSlidingWindowLayer` and `DynamicLayer` in `cache_utils.py`, are chosen by) with
  `sliding_window`. A config.json's `sliding_window` without `layer_types` (Qwen2/3-MoE's
  `use_sliding_window: false`, Mixtral) is not read: llama.cpp's loaders for those
  architectures set no window.
- Hybrid models (Qwen3-Next, Qwen3.5): `src/llama-memory-hybrid.cpp` builds the KV cache for
  the layers with `!hparams.is_recr(il)` only; a recurrent (linear-attention, gated
  delta-net) layer keeps a state of fixed size per sequence in `llama_memory_recurrent`,
  whatever the context, so it holds no KV here. Which layers are recurrent: the GGUF's
  `attention.recurrent_layers` array, else `(il + 1) % full_attention_interval != 0` with an
  interval of 4 by default (`src/models/qwen35moe.cpp`, `qwen35.cpp`, `qwen3next.cpp`); from a
  config.json, transformers' `layer_types` "linear_attention", else its
  `full_attention_interval`.
- The context (`src/llama-context.cpp`): n_ctx is padded to a multiple of 256; with a
  unified cache (llama-server's default: `tools/server/server.cpp` sets n_parallel 4 and
  kv_unified when -np is not given) one stream of n_ctx cells, else n_seq_max streams of
  GGML_PAD(n_ctx / n_seq_max, 256) cells. n_ubatch defaults to 512 (`common/common.h`).
- Type sizes (`ggml/src/ggml.c` type_traits, `ggml/src/ggml-common.h` block structs,
  ggml_row_size = type_size x n / blck_size): f32 4 bytes, f16 and bf16 2 bytes a value;
  q8_0 34 bytes per 32 values (a half scale + 32 int8), q4_0 18 per 32 (a half + 16 bytes of
  nibbles), q4_1 20 per 32, q5_0 22 per 32, q5_1 24 per 32, iq4_nl 18 per 32: the cache types
  `common/arg.cpp` accepts for -ctk / -ctv (kv_cache_types).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from placer.errors import PlacerError
from traces.options import MAX_CTX  # a context past 16M tokens is a typo (the --ctx rule)

# ggml type name -> (values a block, bytes a block): ggml/src/ggml.c type_traits at 0c1e5709.
KV_TYPES = {"f32": (1, 4), "f16": (1, 2), "bf16": (1, 2), "q8_0": (32, 34), "q4_0": (32, 18),
            "q4_1": (32, 20), "iq4_nl": (32, 18), "q5_0": (32, 22), "q5_1": (32, 24)}
DEFAULT_KV_TYPE = "f16"
CTX_PAD = 256          # llama_context pads n_ctx (and the SWA cache) to a multiple of this
SERVER_PARALLEL = 4    # llama-server's n_parallel when -np is not given (kv_unified then)
UBATCH = 512           # common_params.n_ubatch
# GGUF architecture -> (period, dense_first) its loader passes to load_swa_pattern where the
# GGUF sets attention.sliding_window (src/models/<arch>.cpp at 0c1e5709).
SWA_PATTERNS = {"gpt-oss": (2, False), "gemma2": (2, False), "gemma3": (6, False),
                "gemma3n": (5, False), "cohere2": (4, False), "cohere2moe": (4, True),
                "afmoe": (4, False), "exaone-moe": (4, False), "exaone4": (4, False),
                "llama4": (4, False), "smallthinker": (4, True), "olmo2": (4, False)}
# Hybrid architectures whose loader marks every 4th layer full attention by default.
HYBRID = ("qwen3next", "qwen35", "qwen35moe")
SHAPE_KEY = "kv_shape"  # a plan's model section: the KV shape it records (kv_shape)


@dataclass(frozen=True)
class LayerKv:
    """One layer's cache: values of K and of V per token (all its `heads` KV heads), and its
    sliding window in tokens (None: full attention)."""

    k: int
    v: int
    window: int | None = None
    heads: int = 1


def check_kv_type(kv_type: str, what: str = "--kv-type") -> str:
    """`kv_type` in lower case, or a PlacerError naming `what` and the types llama.cpp takes."""
    name = str(kv_type).strip().lower()
    if name not in KV_TYPES:
        raise PlacerError(f"{what}: expected a KV cache type llama.cpp takes "
                          f"({', '.join(KV_TYPES)}), got {kv_type!r}")
    return name


def check_ctx(ctx: Any, what: str = "--ctx") -> int:
    """`ctx` as a context length in 1..MAX_CTX tokens, or a PlacerError naming `what`."""
    if isinstance(ctx, bool) or not isinstance(ctx, int) or not 1 <= ctx <= MAX_CTX:
        raise PlacerError(f"{what}: expected a context of 1..{MAX_CTX} tokens, got {ctx!r}")
    return ctx


def row_bytes(values: int, kv_type: str, heads: int = 1) -> int:
    """ggml_row_size(kv_type, values): bytes of `values` values in whole blocks; each of
    `heads` heads a whole number of blocks, or llama.cpp refuses the type
    (`src/llama-context.cpp`: n_embd_head_k(il) % ggml_blck_size(type_k), and for V)."""
    block, size = KV_TYPES[check_kv_type(kv_type)]
    if values % (block * heads):
        raise PlacerError(f"KV type {kv_type}: a head of {values // heads} values is not a "
                          f"whole number of its {block}-value blocks (llama.cpp refuses it)")
    return values // block * size


def kv_shape(config: dict) -> dict | None:
    """What a plan records of its model's KV cache (its `model.kv_shape`, SHAPE_KEY): each
    layer's [k, v, window, heads] (kv_layers) and the trained context (trained_context), so a
    plan's model section sizes the cache as the config does (`evaluate PLAN --flags '-c N'`);
    None where the config lacks the attention shape."""
    layers = kv_layers(config)
    if layers is None:
        return None
    return {"layers": [[x.k, x.v, x.window, x.heads] for x in layers],
            "trained_context": trained_context(config)}


def kv_layers(config: dict) -> tuple[LayerKv, ...] | None:
    """Each layer's KV shape from a config.json (or a GGUF inventory's config: its "gguf"
    metadata; or a plan's model section: its recorded `kv_shape`), as llama.cpp caches it
    (module docstring); None where the config lacks the attention shape."""
    if isinstance(config.get(SHAPE_KEY), dict):
        return tuple(LayerKv(*layer) for layer in config[SHAPE_KEY]["layers"])
    if isinstance(config.get("gguf"), dict):
        return _gguf_layers({**config["gguf"], "num_hidden_layers": config.get(
            "num_hidden_layers")}, str(config.get("model_type", "")))
    layers, heads = config.get("num_hidden_layers"), config.get("num_attention_heads")
    hidden = config.get("hidden_size")
    if not all(_positive(x) for x in (layers, heads)) or not (
            _positive(config.get("head_dim")) or _positive(hidden)):
        return None
    if _positive(config.get("kv_lora_rank")):  # MLA: the compressed KV and the rope key, no V
        width = config["kv_lora_rank"] + (config.get("qk_rope_head_dim") or 0)
        return tuple(LayerKv(width, 0) for _ in range(layers))
    head_dim = config.get("head_dim") or hidden // heads
    kv_heads = config.get("num_key_value_heads") or heads
    windows = _hf_windows(config, layers)
    types = config.get("layer_types")
    recurrent = ([t == "linear_attention" for t in types] if isinstance(types, list)
                 and len(types) == layers else _interval(config.get("full_attention_interval"),
                                                         layers, 0))
    return tuple(LayerKv(0, 0) if r else LayerKv(kv_heads * head_dim, kv_heads * head_dim, w,
                                                   kv_heads)
                 for w, r in zip(windows, recurrent, strict=True))


def _interval(interval: Any, layers: int, default: int) -> list[bool]:
    """Which layers are recurrent when every `interval`-th one (1-based) is full attention
    (`default` where not given; 0: none are)."""
    every = interval if _positive(interval) else default
    return [bool(every) and (il + 1) % every != 0 for il in range(layers)]


def _hf_windows(config: dict, layers: int) -> list[int | None]:
    """The window of each layer from transformers' layer_types and sliding_window."""
    types, window = config.get("layer_types"), config.get("sliding_window")
    if types is None or window is None:
        return [None] * layers
    if not (isinstance(types, list) and len(types) == layers
            and all(isinstance(t, str) for t in types)):
        raise PlacerError(f"config.json: layer_types must list one attention type per layer "
                          f"({layers}), got {str(types)[:60]}")
    if not _positive(window):
        raise PlacerError(f"config.json: sliding_window must be a positive integer, got "
                          f"{window!r}")
    return [window if t == "sliding_attention" else None for t in types]


def _gguf_layers(meta: dict, arch: str) -> tuple[LayerKv, ...] | None:
    """Each layer's KV shape from GGUF metadata (`<arch>.` keys, llama.cpp's LLM_KV names)."""
    def get(key: str) -> Any:
        return meta.get(f"{arch}.{key}")

    layers, hidden = meta.get("num_hidden_layers"), get("embedding_length")
    heads, kv_heads = get("attention.head_count"), get("attention.head_count_kv")
    if not _positive(layers) or not (_positive(hidden) or get("attention.key_length")):
        return None
    heads_at = _per_layer(heads, layers, f"{arch}.attention.head_count")
    kv_at = _per_layer(kv_heads, layers, f"{arch}.attention.head_count_kv") or heads_at
    if heads_at is None or kv_at is None:
        return None
    mla = _positive(get("attention.key_length_mla"))
    windows = _gguf_windows(meta, arch, layers)
    marked = get("attention.recurrent_layers")
    recurrent = ([bool(x) for x in marked[:layers]] if isinstance(marked, list)
                 and len(marked) >= layers else _interval(
                     get("full_attention_interval"), layers, 4 if arch in HYBRID else 0))
    out = []
    for il in range(layers):
        k_head = get("attention.key_length") or (hidden // heads_at[il] if heads_at[il] else 0)
        v_head = get("attention.value_length") or k_head
        out.append(LayerKv(0, 0) if recurrent[il] else LayerKv(
            k_head * kv_at[il], 0 if mla else v_head * kv_at[il], windows[il], kv_at[il]))
    return tuple(out)


def _gguf_windows(meta: dict, arch: str, layers: int) -> list[int | None]:
    """The window of each layer: load_swa_pattern's reading of the GGUF (module docstring)."""
    window = meta.get(f"{arch}.attention.sliding_window")
    pattern = meta.get(f"{arch}.attention.sliding_window_pattern")
    if not _positive(window):
        return [None] * layers
    if isinstance(pattern, list):
        if len(pattern) < layers:
            raise PlacerError(f"GGUF {arch}.attention.sliding_window_pattern: {len(pattern)} "
                              f"entries for {layers} layers")
        return [window if flag else None for flag in pattern[:layers]]
    period, dense_first = SWA_PATTERNS.get(arch, (0, False))
    if _positive(pattern):
        period = pattern
    if not period:
        return [None] * layers
    return [window if (il % period != 0 if dense_first else il % period < period - 1)
            else None for il in range(layers)]


def _per_layer(value: Any, layers: int, key: str) -> list[int] | None:
    """A GGUF count given once or per layer, as a list of `layers` (None: absent)."""
    if value is None:
        return None
    if isinstance(value, list):
        if len(value) < layers or not all(isinstance(x, int) for x in value):
            raise PlacerError(f"GGUF {key}: expected {layers} counts, got {str(value)[:60]}")
        return list(value[:layers])
    if not isinstance(value, int) or isinstance(value, bool):
        raise PlacerError(f"GGUF {key}: expected a count, got {value!r}")
    return [value] * layers


def _positive(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x > 0


def _pad(n: int) -> int:
    return -(-n // CTX_PAD) * CTX_PAD


def kv_cells(ctx: int, window: int | None, *, parallel: int = SERVER_PARALLEL,
             unified: bool = True, ubatch: int = UBATCH) -> int:
    """The cells llama.cpp allocates for a layer (all streams): n_ctx padded to 256 for full
    attention; a sliding-window layer GGML_PAD(min(n_ctx_seq, window x (unified ? parallel
    : 1) + ubatch), 256) per stream (module docstring)."""
    n_ctx = _pad(check_ctx(ctx))
    streams = 1 if unified else parallel
    per_stream = n_ctx if unified else _pad(n_ctx // parallel)
    if not per_stream:
        raise PlacerError(f"a context of {ctx} tokens gives none to each of {parallel} "
                          "sequences (llama.cpp: n_ctx_seq == 0)")
    if window is None:
        return per_stream * streams
    swa = _pad(min(per_stream, window * (parallel if unified else 1) + ubatch))
    return swa * streams


def kv_bytes(config: dict, ctx: int, kv_type: str = DEFAULT_KV_TYPE, *,
             v_type: str | None = None, parallel: int = SERVER_PARALLEL, unified: bool = True,
             ubatch: int = UBATCH) -> int:
    """Bytes of the KV cache llama.cpp allocates for the model of `config` at a context of
    `ctx` tokens, K in `kv_type` and V in `v_type` (default: `kv_type`), for `parallel`
    sequences (-np; `unified`: one shared stream, -kvu, llama-server's default) and micro-batch
    `ubatch` (-ub): sum over layers of cells x (row_bytes(k) + row_bytes(v)). A PlacerError
    where the config lacks the attention shape."""
    layers = kv_layers(config)
    if layers is None:
        raise PlacerError("the model's config gives no attention shape (num_hidden_layers, "
                          "num_attention_heads, hidden_size or head_dim): its KV cache cannot "
                          "be sized")
    v_type = kv_type if v_type is None else v_type
    return sum(kv_cells(ctx, layer.window, parallel=parallel, unified=unified, ubatch=ubatch)
               * (row_bytes(layer.k, kv_type, layer.heads)
                  + row_bytes(layer.v, v_type, layer.heads))
               for layer in layers)


def context_for(config: dict, budget: int, kv_type: str = DEFAULT_KV_TYPE) -> int | None:
    """The longest context, a multiple of 256 (what llama.cpp allocates), whose KV cache
    (kv_bytes: sliding windows and MLA as llama.cpp sizes them) fits `budget` bytes; None
    where the config lacks the attention shape or not even 256 tokens fit. kv_bytes grows
    with the context, so a bisection over multiples of 256 finds it."""
    if kv_layers(config) is None or kv_bytes(config, CTX_PAD, kv_type) > budget:
        return None
    lo, hi = 1, MAX_CTX // CTX_PAD  # in units of 256 tokens: lo fits
    if kv_bytes(config, hi * CTX_PAD, kv_type) <= budget:
        return hi * CTX_PAD
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if kv_bytes(config, mid * CTX_PAD, kv_type) <= budget else (lo, mid)
    return lo * CTX_PAD


def trained_context(config: dict) -> int | None:
    """The context the model was trained with (llama.cpp's n_ctx_train, what -c 0 or no -c
    gives: common/common.h `n_ctx = 0`): a config.json's max_position_embeddings or a GGUF's
    `<arch>.context_length` (a plan's model section: the one its kv_shape records); None where
    neither is given."""
    if isinstance(config.get(SHAPE_KEY), dict):
        return config[SHAPE_KEY].get("trained_context")
    meta = config.get("gguf")
    n = (meta.get(f"{config.get('model_type', '')}.context_length")
         if isinstance(meta, dict) else config.get("max_position_embeddings"))
    return n if _positive(n) else None


@dataclass(frozen=True)
class Context:
    """The context a spec reserves KV for (its `[context]` table): tokens, and the type of
    llama.cpp's K and V cache (-ctk / -ctv)."""

    tokens: int
    kv_type: str = DEFAULT_KV_TYPE


def parse_context(table: Any, where: str) -> Context:
    """A spec's `[context]` table ({tokens = N, kv_type = "q8_0"}), or a PlacerError naming
    `where`'s field."""
    if not isinstance(table, dict):
        raise PlacerError(f"{where}: expected a table ({{ tokens = 8192, kv_type = \"f16\" }}), "
                          f"got {str(table)[:60]}")
    unknown = set(table) - {"tokens", "kv_type"}
    if unknown:
        raise PlacerError(f"{where}: unknown field {sorted(unknown)[0]!r}")
    if "tokens" not in table:
        raise PlacerError(f"{where}.tokens: missing")
    kv_type = table.get("kv_type", DEFAULT_KV_TYPE)
    if not isinstance(kv_type, str):
        raise PlacerError(f"{where}.kv_type: expected a string, got {kv_type!r}")
    return Context(check_ctx(table["tokens"], f"{where}.tokens"),
                   check_kv_type(kv_type, f"{where}.kv_type"))
