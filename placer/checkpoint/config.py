"""A model's config.json as placer reads it: the keys it needs, checked for type, and the MoE
shape they describe (layers, routed experts, top-k, shared experts, which layers are MoE)."""

from __future__ import annotations

from pathlib import Path

from placer.errors import PlacerError
from traces.formats.bounded import read_bounded
from traces.formats.jsontext import loads_json

EXPERT_COUNT_KEYS = ("n_routed_experts", "num_local_experts", "num_experts")
# The expert dtypes an estimate from config.json alone takes (placer.checkpoint.estimate), as
# safetensors stores them; here, where `inspect` and `solve` name them in --help at no cost.
EXPERT_DTYPES = ("bf16", "fp16", "fp32", "fp8", "mxfp4")
DTYPE_HELP = f"{', '.join(EXPERT_DTYPES)}, or a GGUF ggml type: q4_k, q6_k, iq4_xs, q8_0, ..."
TOP_K_KEYS = ("num_experts_per_tok", "experts_per_token", "moe_topk")


def read_config(path: Path) -> dict:
    """Read a config.json; for a multimodal wrapper, the text model's config. Every key the
    inventory reads is checked for its type here (CONFIG_INTS, CONFIG_INT_LISTS)."""
    path = Path(path)
    if not path.is_file():
        raise PlacerError(f"no config.json at {path}")
    config = loads_json(read_bounded(path, "config", error=PlacerError), str(path), PlacerError)
    if not isinstance(config, dict):
        raise PlacerError(f"{path}: expected a JSON object, found {type(config).__name__}")
    if isinstance(config.get("text_config"), dict):
        config = {**config["text_config"], "architectures": config.get("architectures")}
    check_config(config, path)
    return config


# Integer keys the inventory reads, each >= 0 when present (null means absent). Layer and expert
# counts are bounded by the trace schema's int16 `layer` and `experts` columns.
CONFIG_INTS = ("num_hidden_layers", "hidden_size", "intermediate_size", "moe_intermediate_size",
               "vocab_size", "num_attention_heads", "num_key_value_heads", "head_dim",
               *EXPERT_COUNT_KEYS, *TOP_K_KEYS, "n_shared_experts", "first_k_dense_replace",
               "moe_layer_freq", "decoder_sparse_step", "kv_lora_rank", "q_lora_rank",
               "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim",
               "shared_expert_intermediate_size")
CONFIG_INT_LISTS = ("mlp_only_layers",)
CONFIG_STRINGS = ("model_type", "torch_dtype", "dtype")
MAX_COUNT = 2**15 - 1  # layers, experts per layer: int16 in traces/storing/schema.py


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_config(config: dict, path: Path) -> None:
    """PlacerError naming the first key of `config` (read from `path`) of the wrong type."""
    for key in CONFIG_INTS:
        value = config.get(key)
        if value is not None and not (_is_int(value) and value >= 0):
            raise PlacerError(f"{path}: {key} must be a non-negative integer, got {value!r}")
    for key in CONFIG_INT_LISTS:
        value = config.get(key)
        if value is not None and not (isinstance(value, list) and all(map(_is_int, value))):
            raise PlacerError(f"{path}: {key} must be a list of integers, got {value!r}")
    for key in CONFIG_STRINGS:
        value = config.get(key)
        if value is not None and not isinstance(value, str):
            raise PlacerError(f"{path}: {key} must be a string, got {value!r}")
    archs = config.get("architectures")
    if archs is not None and not (isinstance(archs, list)
                                  and all(isinstance(a, str) for a in archs)):
        raise PlacerError(f"{path}: architectures must be a list of strings, got {archs!r}")


def check_heads(config: dict, where: str = "config.json") -> None:
    """PlacerError naming the field where the attention head counts cannot shape attention:
    num_key_value_heads more than num_attention_heads or not dividing them (grouped-query
    attention repeats each key/value head num_attention_heads / num_key_value_heads times),
    hidden_size not a multiple of the heads where no head_dim is given (the head's width is
    then hidden_size / heads), or an odd head width (rotary embeddings turn pairs of
    dimensions: qk_rope_head_dim for MLA, else the head's width). Checked before a model is
    built from the config, not in its first forward."""
    heads, kv = config.get("num_attention_heads"), config.get("num_key_value_heads")
    hidden, head_dim = config.get("hidden_size"), config.get("head_dim")
    if heads and kv and (kv > heads or heads % kv):
        raise PlacerError(f"{where}: num_key_value_heads {kv} does not divide "
                          f"num_attention_heads {heads} (each key/value head serves a whole "
                          "group of attention heads)")
    if heads and hidden and not head_dim and hidden % heads:
        raise PlacerError(f"{where}: hidden_size {hidden} is not a multiple of "
                          f"num_attention_heads {heads} (and no head_dim is given)")
    rope_key = "qk_rope_head_dim" if config.get("kv_lora_rank") else "head_dim"
    named = rope_key if config.get(rope_key) else "hidden_size / num_attention_heads"
    width = config.get(rope_key) or (hidden // heads if heads and hidden else None)
    if width and width % 2:
        raise PlacerError(f"{where}: {named} is {width}, odd: rotary embeddings turn pairs "
                          "of dimensions")


def moe_shape(config: dict) -> tuple[int, int, int, int]:
    """(num_layers, experts per layer, top_k, shared experts) from a config checked by
    `check_config`, or a PlacerError."""
    experts = next((config[k] for k in EXPERT_COUNT_KEYS if config.get(k)), None)
    top_k = next((config[k] for k in TOP_K_KEYS if config.get(k)), None)
    if not experts or not top_k:
        kind = config.get("model_type", "unknown")
        raise PlacerError(f"not an MoE model: config of model_type {kind!r} names no routed "
                          f"experts ({'/'.join(EXPERT_COUNT_KEYS)}) and top-k")
    layers = config.get("num_hidden_layers")
    if not layers:
        raise PlacerError("config.json has no num_hidden_layers")
    if layers > MAX_COUNT or experts > MAX_COUNT:
        raise PlacerError(f"config.json: {layers} layers x {experts} experts per layer; at most "
                          f"{MAX_COUNT} of each")
    if top_k > experts:
        raise PlacerError(f"config.json: each token selects {top_k} experts "
                          f"(num_experts_per_tok) but a layer has only {experts}")
    shared = config.get("n_shared_experts") or 0
    if not shared and config.get("shared_expert_intermediate_size"):
        shared = 1
    return int(layers), int(experts), int(top_k), int(shared)


def config_moe_layers(config: dict) -> tuple[int, ...]:
    """Decoder layers with routed experts, as the config describes them."""
    layers = int(config["num_hidden_layers"])
    first_dense = int(config.get("first_k_dense_replace") or 0)
    freq = int(config.get("moe_layer_freq") or config.get("decoder_sparse_step") or 1)
    dense_only = set(config.get("mlp_only_layers") or [])
    return tuple(i for i in range(layers)
                 if i >= first_dense and i % freq == 0 and i not in dense_only)
