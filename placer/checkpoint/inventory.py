"""The checkpoint inventory: every routed expert's tensors as exact byte ranges.

Read from `config.json` and the safetensors headers only, never the tensor bytes. Two on-disk
layouts reduce to the same thing:

- one tensor per expert (`...layers.L.mlp.experts.E.gate_proj.weight`, Qwen/OLMoE/DeepSeek;
  `...layers.L.block_sparse_moe.experts.E.w1.weight`, Mixtral), where expert E's part of the
  tensor is the whole tensor;
- fused tensors whose first dimension is the expert (`...layers.L.mlp.experts.gate_up_proj`,
  its bias, and MXFP4 `*_blocks` / `*_scales`, gpt-oss): in row-major order expert E is the
  contiguous range [E * n, (E + 1) * n) of the tensor's n * experts bytes.

A `.gguf` path is read by placer/checkpoint/gguf.py instead (llama.cpp's fused tensors); both
return the Inventory of placer/checkpoint/experts.py.
"""

from __future__ import annotations

import re
from pathlib import Path

from placer.checkpoint.config import config_moe_layers, moe_shape, read_config
from placer.checkpoint.experts import (
    DenseTensor,
    ExpertRanges,
    Inventory,
    SourceFile,
    TensorRange,
    assemble,
    sort_tensors,
)
from placer.checkpoint.header import FileHeader, TensorHeader, read_header
from placer.errors import PlacerError
from placer.files import plain_file_name
from traces.formats.bounded import read_bounded
from traces.formats.jsontext import loads_json

INDEX_FILE = "model.safetensors.index.json"
_LAYER = r"(?:^|\.)layers\.(?P<layer>\d+)\.(?:mlp|block_sparse_moe|feed_forward)\.experts\."
PER_EXPERT = re.compile(_LAYER + r"(?P<expert>\d+)\.(?P<rest>.+)$")
FUSED = re.compile(_LAYER + r"(?P<rest>[A-Za-z_][\w.]*)$")


def read_inventory(checkpoint: Path, *, gguf: bool = True) -> Inventory:
    """The inventory of the checkpoint directory `checkpoint`, or of the GGUF model file
    `checkpoint` (a `.gguf` path: its first part where it is split), from headers only.
    `gguf` False refuses a GGUF file (what reads safetensors bytes: emit, verify, run)."""
    checkpoint = Path(checkpoint)
    if checkpoint.suffix.lower() == ".gguf":
        if not gguf:
            raise PlacerError(f"{checkpoint} is a GGUF model: this command reads a checkpoint "
                              "directory (config.json + *.safetensors); a GGUF model is "
                              "planned for llama.cpp (placer solve, placer export llamacpp)")
        from placer.checkpoint.gguf import read_gguf_inventory  # only a GGUF loads gguf

        return read_gguf_inventory(checkpoint)
    if checkpoint.exists() and not checkpoint.is_dir():
        raise PlacerError(f"{checkpoint} is not a directory (a checkpoint directory holds "
                          "config.json and *.safetensors; a GGUF model's name ends in .gguf)")
    if not checkpoint.is_dir():
        raise PlacerError(f"checkpoint directory not found: {checkpoint}")
    config = read_config(checkpoint / "config.json")
    num_layers, num_experts, top_k, shared = moe_shape(config)
    weight_map = read_index(checkpoint)
    names = sorted(set(weight_map.values())) if weight_map is not None else _shard_files(checkpoint)
    headers = [read_header(checkpoint / name) for name in names]
    moe_layers, experts, dense = sort_tensors(
        ((DenseTensor(t.name, header.path.name, t.offset, t.length, t.dtype, t.shape),
          _expert_ranges(header, t, num_experts))
         for header, t in _authoritative(headers, weight_map)), str(checkpoint))
    expected = config_moe_layers(config)
    if moe_layers != expected:
        raise PlacerError(f"config.json says MoE layers {list(expected)} but the checkpoint has "
                          f"routed experts in layers {list(moe_layers)}")
    return assemble(config, num_layers, num_experts, top_k, shared, moe_layers, experts, dense,
                     tuple(SourceFile(h.path.name, h.size) for h in headers), estimated=False)


def read_index(checkpoint: Path) -> dict[str, str] | None:
    """The index's weight_map {tensor name: shard file name}, or None without an index. Every
    shard must be a plain file name in `checkpoint` (no directories, nothing outside it)."""
    index = checkpoint / INDEX_FILE
    if not index.is_file():
        return None
    data = loads_json(read_bounded(index, "index", error=PlacerError), str(index), PlacerError)
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict) or not all(
            isinstance(v, str) for v in weight_map.values()):
        raise PlacerError(f"{index}: weight_map must map tensor names to shard file names")
    for name in sorted(set(weight_map.values())):
        if not plain_file_name(name) or "\\" in name:
            raise PlacerError(f"{index}: shard {name!r} is not a file name inside {checkpoint}")
        if not (checkpoint / name).is_file():
            raise PlacerError(f"{INDEX_FILE} names a missing shard: {name}")
    return weight_map


def _shard_files(checkpoint: Path) -> list[str]:
    names = sorted(p.name for p in checkpoint.glob("*.safetensors"))
    if not names:
        raise PlacerError(f"no *.safetensors files in {checkpoint}")
    return names


def _authoritative(headers: list[FileHeader], weight_map: dict[str, str] | None
                   ) -> list[tuple[FileHeader, TensorHeader]]:
    """Every tensor once, with the header of the file it is read from. A tensor held by two
    files is refused unless the index names which one holds it; every tensor the index
    names must be in the file it names."""
    held: dict[str, tuple[FileHeader, TensorHeader]] = {}
    for header in headers:
        for t in header.tensors:
            if t.name not in held:
                held[t.name] = (header, t)
                continue
            other = held[t.name][0].path.name
            owner = (weight_map or {}).get(t.name)
            if owner is None:
                raise PlacerError(
                    f"tensor {t.name!r} is in both {other} and {header.path.name} "
                    f"(a second copy of a shard?); remove one, or name the one to read in "
                    f"{INDEX_FILE}")
            if owner == header.path.name:
                held[t.name] = (header, t)
    for name, file in (weight_map or {}).items():
        if name not in held or held[name][0].path.name != file:
            raise PlacerError(f"{INDEX_FILE} says tensor {name!r} is in {file}, which does not "
                              "hold it")
    return list(held.values())


def _expert_ranges(header: FileHeader, t: TensorHeader, num_experts: int
                   ) -> ExpertRanges | None:
    """The (layer, expert) ranges of tensor `t`, or None when it is not a routed expert's."""
    file = header.path.name
    m = PER_EXPERT.search(t.name)
    if m:
        key = (int(m["layer"]), int(m["expert"]))
        if key[1] >= num_experts:
            raise PlacerError(f"{file}: tensor {t.name!r} names expert {key[1]} but the config "
                              f"has {num_experts} experts per layer")
        return [(key, TensorRange(t.name, file, t.offset, t.length, t.dtype, t.shape))]
    m = FUSED.search(t.name)
    if not m:
        return None
    if not t.shape or t.shape[0] != num_experts:
        raise PlacerError(f"{file}: fused expert tensor {t.name!r} has shape {list(t.shape)}, "
                          f"expected first dimension {num_experts}")
    per = t.length // num_experts
    layer = int(m["layer"])
    return [((layer, e), TensorRange(t.name, file, t.offset + e * per, per, t.dtype,
                                     t.shape[1:], t.shape, e * per))
            for e in range(num_experts)]
