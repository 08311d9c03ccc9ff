"""Materialise an inventory as a sparse checkpoint: real headers, data made with truncate.

Used to show that header-only reading scales to DeepSeek-V3-sized checkpoints (hundreds of
GB) without reading or even storing their bytes. Sparse files take no disk for their data.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

from placer.checkpoint.inventory import Inventory

HEADER_ALIGN = 8


def write_sparse_checkpoint(inv: Inventory, out_dir: Path, config: dict, shards: int) -> Path:
    """Write `inv`'s tensors (names, dtypes, shapes) into `shards` sparse safetensors files
    with an index, plus `config` as config.json."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tensors = [(t.name, t.dtype, t.shape, t.length) for t in inv.dense_tensors]
    tensors += [(r.name, r.dtype, r.shape, r.length) for e in inv.experts for r in e.tensors]
    tensors.sort(key=lambda t: t[0])
    total = sum(t[3] for t in tensors)
    per_shard = -(-total // shards)
    groups: list[list[tuple]] = [[]]
    size = 0
    for t in tensors:
        if size >= per_shard and len(groups) < shards:
            groups.append([])
            size = 0
        groups[-1].append(t)
        size += t[3]
    weight_map = {}
    for i, group in enumerate(groups):
        name = f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors"
        _write_sparse_file(out_dir / name, group)
        weight_map.update({t[0]: name for t in group})
    (out_dir / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}))
    (out_dir / "config.json").write_text(json.dumps(config, indent=2))
    return out_dir


def _write_sparse_file(path: Path, tensors: list[tuple]) -> None:
    header, cursor = {}, 0
    for name, dtype, shape, length in tensors:
        header[name] = {"dtype": dtype, "shape": list(shape),
                        "data_offsets": [cursor, cursor + length]}
        cursor += length
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % HEADER_ALIGN)
    with path.open("wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        f.truncate(8 + len(raw) + cursor)
