"""Tiny GGUF model files as llama.cpp's converter lays them out, written with the `gguf`
package's GGUFWriter: fused expert tensors `blk.N.ffn_{gate,up,down}_exps.weight` whose ggml
ne is {n_embd, n_ff, n_expert} (numpy shape reversed, the expert outermost), any ggml type,
the data random bytes of each type's exact size."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFWriter

PROJECTIONS = ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")


def row_bytes(kind: GGMLQuantizationType, cols: int) -> int:
    """Bytes of one row of `cols` elements of ggml type `kind` (the size arithmetic the tests
    check the inventory against)."""
    block, size = GGML_QUANT_SIZES[kind]
    assert cols % block == 0
    return cols // block * size


def add_tensor(writer: GGUFWriter, name: str, shape: tuple[int, ...], kind: GGMLQuantizationType,
               rng: np.random.Generator) -> np.ndarray:
    """Add tensor `name` of row-major element `shape` and ggml type `kind` with random bytes;
    the bytes as a uint8 array of shape shape[:-1] + (row bytes,)."""
    data = rng.integers(0, 256, size=(*shape[:-1], row_bytes(kind, shape[-1])), dtype=np.uint8)
    writer.add_tensor(name, data, raw_dtype=kind)
    return data


def write_moe_gguf(path: Path, *, arch: str = "qwen3moe", layers: int = 2, experts: int = 4,
                   top_k: int = 2, hidden: int = 256, ff: int = 512,
                   types: tuple[GGMLQuantizationType, ...] = (
                       GGMLQuantizationType.Q4_K, GGMLQuantizationType.Q6_K,
                       GGMLQuantizationType.Q8_0),
                   dense_layers: tuple[int, ...] = (), shared: bool = False,
                   biases: bool = False, nextn: int = 0, split_max_tensors: int = 0,
                   seed: int = 0, heads: tuple[int, int] | None = None,
                   ) -> dict[str, np.ndarray]:
    """A tiny MoE GGUF at `path`: gate, up, down experts in `types` (one per projection),
    dense attention/norm/router tensors; `heads`: (attention heads, KV heads) recorded, which
    size its KV cache (else it has no attention shape); {tensor name: its bytes as written}."""
    rng = np.random.default_rng(seed)
    writer = GGUFWriter(path, arch, split_max_tensors=split_max_tensors)
    writer.add_block_count(layers)
    writer.add_embedding_length(hidden)
    writer.add_expert_count(experts)
    writer.add_expert_used_count(top_k)
    writer.add_expert_feed_forward_length(ff)
    if heads is not None:
        writer.add_head_count(heads[0])
        writer.add_head_count_kv(heads[1])
    if shared:
        writer.add_expert_shared_count(1)
    if nextn:
        writer.add_nextn_predict_layers(nextn)  # the last `nextn` of `layers` blocks are MTP
    writer.add_token_list([f"tok{i}" for i in range(5000)])  # skipped, not decoded
    F32 = GGMLQuantizationType.F32
    data = {"token_embd.weight": add_tensor(writer, "token_embd.weight", (64, hidden),
                                            GGMLQuantizationType.Q8_0, rng)}
    for layer in range(layers):
        b = f"blk.{layer}"
        data[f"{b}.attn_norm.weight"] = add_tensor(writer, f"{b}.attn_norm.weight", (hidden,),
                                                   F32, rng)
        data[f"{b}.attn_q.weight"] = add_tensor(writer, f"{b}.attn_q.weight", (hidden, hidden),
                                                GGMLQuantizationType.Q6_K, rng)
        if layer in dense_layers:
            for proj in ("ffn_gate", "ffn_up"):
                data[f"{b}.{proj}.weight"] = add_tensor(writer, f"{b}.{proj}.weight",
                                                        (ff, hidden), F32, rng)
            continue
        data[f"{b}.ffn_gate_inp.weight"] = add_tensor(writer, f"{b}.ffn_gate_inp.weight",
                                                      (experts, hidden), F32, rng)
        for proj, kind in zip(PROJECTIONS, types, strict=True):
            shape = (experts, hidden, ff) if proj == "ffn_down_exps" else (experts, ff, hidden)
            data[f"{b}.{proj}.weight"] = add_tensor(writer, f"{b}.{proj}.weight", shape, kind,
                                                    rng)
            if biases:
                name = f"{b}.{proj}.bias"
                data[name] = add_tensor(writer, name, shape[:-1], F32, rng)
        if shared:
            data[f"{b}.ffn_up_shexp.weight"] = add_tensor(writer, f"{b}.ffn_up_shexp.weight",
                                                          (ff, hidden), F32, rng)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return data


def names_gguf(path: Path, names: list[str], blocks: int = 2) -> Path:
    """A qwen3moe GGUF of `blocks` blocks, 4 experts, one F32 expert tensor per name."""
    writer = GGUFWriter(path, "qwen3moe")
    writer.add_block_count(blocks)
    writer.add_expert_count(4)
    writer.add_expert_used_count(2)
    for name in names:
        writer.add_tensor(name, np.zeros((4, 8, 32), np.float32))
    for step in (writer.write_header_to_file, writer.write_kv_data_to_file,
                 writer.write_tensors_to_file, writer.close):
        step()
    return path
