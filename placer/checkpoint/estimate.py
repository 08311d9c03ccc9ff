"""Planning before download: an inventory estimated from a config alone."""

from __future__ import annotations

import functools
import math
from pathlib import Path

from placer.checkpoint.config import (
    EXPERT_COUNT_KEYS,
    EXPERT_DTYPES,
    config_moe_layers,
    moe_shape,
    read_config,
)
from placer.checkpoint.experts import DenseTensor, Inventory, TensorRange, assemble
from placer.checkpoint.header import DTYPE_BITS, tensor_bytes
from placer.errors import PlacerError
from traces.formats.ggml import block_sizes

FLOAT_DTYPES = {"bf16": "BF16", "fp16": "F16", "fp32": "F32"}  # unquantized: one tensor each
TORCH_DTYPE_NAMES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}
QUANT_METHODS = {"fp8": "fp8", "mxfp4": "mxfp4"}  # quantization_config.quant_method
MAX_ESTIMATED_EXPERTS = 1 << 20  # DeepSeek-V3 has 14,848; Kimi K2 23,040


def _need(config: dict, key: str) -> int:
    """A positive integer the estimate needs (types were checked by `read_config`)."""
    value = config.get(key)
    if not value:
        raise PlacerError(f"config.json: {key} is missing or 0 (needed to estimate sizes)")
    return value


@functools.cache
def ggml_types() -> dict[str, tuple[str, int, int]]:
    """{ggml type name in lower case: (its name, block size, bytes per block)} (traces.formats.ggml,
    built on first use: only a GGUF dtype pays for importing gguf)."""
    return {name.lower(): (name, block, size) for name, (block, size) in block_sizes().items()}


def dtype_bytes(dtype: str, shape: tuple[int, ...]) -> int:
    """Bytes of a tensor of `shape` in the safetensors dtype or ggml type `dtype` (a ggml
    type's rows are whole blocks: `_matrix` checked it)."""
    ggml = ggml_types().get(dtype.lower()) if dtype not in DTYPE_BITS else None
    if ggml is None:
        return tensor_bytes(dtype, shape)
    _, block, size = ggml
    return math.prod(shape) // block * size


def _check_dtype(dtype: str) -> None:
    if dtype not in EXPERT_DTYPES and dtype not in ggml_types():
        raise PlacerError(f"unknown dtype {dtype!r}; choose from {', '.join(EXPERT_DTYPES)} "
                          f"or a ggml type ({', '.join(ggml_types())})")


def _matrix(name: str, rows: int, cols: int, dtype: str) -> list[tuple[str, str, tuple]]:
    """The tensors one weight matrix is stored as in `dtype` (with its quantization scales).
    A ggml type quantizes each row (`cols` elements, ggml's ne[0]) in whole blocks."""
    if dtype not in EXPERT_DTYPES:
        type_name, block, _ = ggml_types()[dtype]
        if cols % block:
            raise PlacerError(f"{dtype} stores rows in blocks of {block} elements, but {name} "
                              f"has rows of {cols}; choose another --expert-dtype / "
                              "--dense-dtype")
        return [(f"{name}.weight", type_name, (rows, cols))]
    if dtype in FLOAT_DTYPES:
        return [(f"{name}.weight", FLOAT_DTYPES[dtype], (rows, cols))]
    if dtype == "fp8":  # DeepSeek-V3 style: 128 x 128 block scales in fp32
        return [(f"{name}.weight", "F8_E4M3", (rows, cols)),
                (f"{name}.weight_scale_inv", "F32",
                 (math.ceil(rows / 128), math.ceil(cols / 128)))]
    if dtype == "mxfp4":  # OCP MX: 32-element blocks of fp4 (16 bytes) + one E8M0 scale
        blocks = math.ceil(cols / 32)
        return [(f"{name}_blocks", "U8", (rows, blocks, 16)), (f"{name}_scales", "U8",
                                                               (rows, blocks))]
    raise PlacerError(f"unknown dtype {dtype!r}; choose from {', '.join(EXPERT_DTYPES)}")


def config_dtype(config: dict, *, quantized: bool) -> str | None:
    """The weight dtype a config declares: its quantization method (fp8, mxfp4) when
    `quantized`, else its torch_dtype / dtype (bf16, fp16, fp32); bf16 when it names none,
    None when it names another."""
    quant = config.get("quantization_config")
    method = quant.get("quant_method") if isinstance(quant, dict) else None
    if quantized and method in QUANT_METHODS:
        return QUANT_METHODS[method]
    return TORCH_DTYPE_NAMES.get(config.get("torch_dtype") or config.get("dtype") or "bfloat16")


def _declared(config: dict, path: Path, option: str, *, quantized: bool) -> str:
    dtype = config_dtype(config, quantized=quantized)
    if dtype is None:
        name = config.get("torch_dtype") or config.get("dtype")
        raise PlacerError(f"{path}: torch_dtype {name!r} is not one of "
                          f"{', '.join(TORCH_DTYPE_NAMES)}; give {option}")
    return dtype


def estimate_inventory(config_path: Path, expert_dtype: str | None = None,
                       dense_dtype: str | None = None) -> Inventory:
    """An inventory estimated from `config.json` alone, to size a box before downloading.

    Experts are gate/up/down projections of hidden x moe_intermediate stored in
    `expert_dtype` (fp8 with 128x128 block scales, mxfp4 with 32-element block scales;
    None: what the config declares, see `config_dtype`); dense bytes count embeddings,
    lm_head, attention (MLA or GQA), norms, routers, dense MLP layers and shared experts,
    matrices in `dense_dtype` (None: the config's torch_dtype), vectors and embeddings in the
    config's torch_dtype.
    """
    config = read_config(Path(config_path))
    num_layers, num_experts, top_k, shared = moe_shape(config)
    if expert_dtype is None:
        expert_dtype = _declared(config, config_path, "--expert-dtype", quantized=True)
    if dense_dtype is None:
        dense_dtype = _declared(config, config_path, "--dense-dtype", quantized=False)
    hidden = _need(config, "hidden_size")
    inter = config.get("moe_intermediate_size") or _need(config, "intermediate_size")
    for dtype in (expert_dtype, dense_dtype):
        _check_dtype(dtype)
    moe_layers = config_moe_layers(config)
    if not moe_layers:
        raise PlacerError(f"{config_path}: no decoder layer has routed experts "
                          "(first_k_dense_replace, moe_layer_freq, mlp_only_layers)")
    if len(moe_layers) * num_experts > MAX_ESTIMATED_EXPERTS:
        raise PlacerError(f"{config_path}: {len(moe_layers)} MoE layers x {num_experts} experts "
                          f"is more than the {MAX_ESTIMATED_EXPERTS} routed experts estimated")
    experts: dict[tuple[int, int], list[TensorRange]] = {}
    for layer in moe_layers:
        for e in range(num_experts):
            prefix = f"model.layers.{layer}.mlp.experts.{e}"
            tensors = (_matrix(f"{prefix}.gate_proj", inter, hidden, expert_dtype)
                       + _matrix(f"{prefix}.up_proj", inter, hidden, expert_dtype)
                       + _matrix(f"{prefix}.down_proj", hidden, inter, expert_dtype))
            experts[(layer, e)] = [TensorRange(n, None, None, dtype_bytes(dt, s), dt, s)
                                   for n, dt, s in tensors]
    vector = FLOAT_DTYPES.get(config_dtype(config, quantized=False) or dense_dtype, "BF16")
    dense = [DenseTensor(n, None, None, dtype_bytes(dt, s), dt, s)
             for n, dt, s in _dense_tensors(config, moe_layers, shared, dense_dtype, vector)]
    return assemble(config, num_layers, num_experts, top_k, shared, moe_layers, experts, dense,
                     (), estimated=True)


def _dense_tensors(config: dict, moe_layers: tuple[int, ...], shared: int, dtype: str,
                   vector: str) -> list[tuple[str, str, tuple]]:
    """Every dense tensor's (name, dtype, shape): matrices in `dtype`, vectors, embeddings and
    routers in the safetensors dtype `vector`."""
    hidden = _need(config, "hidden_size")
    vocab = _need(config, "vocab_size")
    heads = _need(config, "num_attention_heads")
    out = [("model.embed_tokens.weight", vector, (vocab, hidden)),
           ("model.norm.weight", vector, (hidden,))]
    if not config.get("tie_word_embeddings"):
        out.append(("lm_head.weight", vector, (vocab, hidden)))
    moe_inter = config.get("moe_intermediate_size") or _need(config, "intermediate_size")
    for layer in range(_need(config, "num_hidden_layers")):
        p = f"model.layers.{layer}"
        out += [(f"{p}.input_layernorm.weight", vector, (hidden,)),
                (f"{p}.post_attention_layernorm.weight", vector, (hidden,))]
        out += _attention(config, p, hidden, heads, dtype, vector)
        if layer in moe_layers:
            out.append((f"{p}.mlp.gate.weight", vector,
                        (int(next(config[k] for k in EXPERT_COUNT_KEYS if config.get(k))),
                         hidden)))
            for name in ("gate_proj", "up_proj"):
                out += _matrix(f"{p}.mlp.shared_experts.{name}", shared * moe_inter, hidden,
                               dtype) if shared else []
            out += _matrix(f"{p}.mlp.shared_experts.down_proj", hidden, shared * moe_inter,
                           dtype) if shared else []
        else:
            inter = _need(config, "intermediate_size")
            out += (_matrix(f"{p}.mlp.gate_proj", inter, hidden, dtype)
                    + _matrix(f"{p}.mlp.up_proj", inter, hidden, dtype)
                    + _matrix(f"{p}.mlp.down_proj", hidden, inter, dtype))
    return out


def _attention(config: dict, p: str, hidden: int, heads: int, dtype: str, vector: str
               ) -> list[tuple[str, str, tuple]]:
    a = f"{p}.self_attn"
    if config.get("kv_lora_rank"):  # multi-head latent attention (DeepSeek-V2/V3)
        kv_rank, rope = _need(config, "kv_lora_rank"), _need(config, "qk_rope_head_dim")
        nope, v = _need(config, "qk_nope_head_dim"), _need(config, "v_head_dim")
        q_rank = config.get("q_lora_rank")
        q = (_matrix(f"{a}.q_a_proj", int(q_rank), hidden, dtype)
             + [(f"{a}.q_a_layernorm.weight", vector, (int(q_rank),))]
             + _matrix(f"{a}.q_b_proj", heads * (nope + rope), int(q_rank), dtype)
             if q_rank else _matrix(f"{a}.q_proj", heads * (nope + rope), hidden, dtype))
        return q + (_matrix(f"{a}.kv_a_proj_with_mqa", kv_rank + rope, hidden, dtype)
                    + [(f"{a}.kv_a_layernorm.weight", vector, (kv_rank,))]
                    + _matrix(f"{a}.kv_b_proj", heads * (nope + v), kv_rank, dtype)
                    + _matrix(f"{a}.o_proj", hidden, heads * v, dtype))
    head_dim = int(config.get("head_dim") or hidden // heads)
    kv = int(config.get("num_key_value_heads") or heads)
    return (_matrix(f"{a}.q_proj", heads * head_dim, hidden, dtype)
            + _matrix(f"{a}.k_proj", kv * head_dim, hidden, dtype)
            + _matrix(f"{a}.v_proj", kv * head_dim, hidden, dtype)
            + _matrix(f"{a}.o_proj", hidden, heads * head_dim, dtype))
