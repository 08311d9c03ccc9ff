"""The inventory's data: every routed expert's tensors as exact byte ranges, how the ranges
read from a checkpoint (safetensors, inventory.py; GGUF, gguf.py) or estimated from a config
(estimate.py) are assembled into one Inventory, and its fingerprint.

An expert's bytes are its tensors' ranges in tensor-name order (`Expert.tensors`); pages are
cut over that byte stream. Quantization scales belong to their expert; shared experts and
routers are dense.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from placer.errors import PlacerError

if TYPE_CHECKING:
    from traces.storing.schema import ModelIdentity

EXPERT_PREFIX = re.compile(r"^.*\.experts\.(?:\d+\.)?")  # what differs between experts' names
# Config keys that say nothing about the model itself (written by whichever tool saved it).
VOLATILE_CONFIG_KEYS = ("_name_or_path", "transformers_version", "torch_dtype", "dtype")



@dataclass(frozen=True)
class TensorRange:
    """One expert's bytes within one checkpoint tensor.

    `name` is the tensor's name in the checkpoint (the fused name for a fused tensor),
    `offset` the absolute byte offset of this expert's bytes in `file`, `shape` the shape of
    this expert's part. For a fused tensor `fused_shape` is the whole tensor's shape and
    `tensor_offset` where this expert's part starts within the tensor's bytes.
    `file` and `offset` are None in an inventory estimated from a config alone.
    """

    name: str
    file: str | None
    offset: int | None
    length: int
    dtype: str
    shape: tuple[int, ...]
    fused_shape: tuple[int, ...] | None = None
    tensor_offset: int = 0

    def to_json(self) -> dict:
        d = {"name": self.name, "file": self.file, "offset": self.offset,
             "length": self.length, "dtype": self.dtype, "shape": list(self.shape)}
        if self.fused_shape is not None:
            d["fused_shape"] = list(self.fused_shape)
            d["tensor_offset"] = self.tensor_offset
        return d


@dataclass(frozen=True)
class Expert:
    """A routed expert: `layer` is the decoder layer index, `expert` its id in that layer."""

    layer: int
    expert: int
    tensors: tuple[TensorRange, ...]

    @property
    def bytes(self) -> int:
        return sum(t.length for t in self.tensors)

    def to_json(self) -> dict:
        return {"layer": self.layer, "expert": self.expert, "bytes": self.bytes,
                "tensors": [t.to_json() for t in self.tensors]}


@dataclass(frozen=True)
class DenseTensor:
    """A non-expert tensor (attention, norms, routers, shared experts, embeddings)."""

    name: str
    file: str | None
    offset: int | None
    length: int
    dtype: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class SourceFile:
    name: str
    size: int


ExpertRanges = list[tuple[tuple[int, int], TensorRange]]  # [((layer, expert), its range)]


@dataclass(frozen=True)
class Inventory:
    """What a checkpoint holds, as the solver, emitter and runtime need it.

    `experts` is sorted by (layer, expert) and holds every routed expert of every MoE layer
    exactly once; `moe_layers` lists decoder layer indices with routed experts.
    """

    architecture: str
    model_type: str
    num_layers: int
    moe_layers: tuple[int, ...]
    experts_per_layer: int
    top_k: int
    shared_experts: int
    experts: tuple[Expert, ...]
    dense_tensors: tuple[DenseTensor, ...]
    files: tuple[SourceFile, ...]
    fingerprint: str
    estimated: bool = False
    config: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def dense_layers(self) -> tuple[int, ...]:
        moe = set(self.moe_layers)
        return tuple(i for i in range(self.num_layers) if i not in moe)

    @property
    def dense_bytes(self) -> int:
        return sum(t.length for t in self.dense_tensors)

    @property
    def expert_bytes_total(self) -> int:
        return sum(e.bytes for e in self.experts)

    def expert(self, layer: int, expert: int) -> Expert:
        """The expert `expert` of decoder layer `layer`."""
        ordinal = self.moe_layers.index(layer)
        return self.experts[ordinal * self.experts_per_layer + expert]

    def identity(self) -> ModelIdentity:
        """What traces record about this model (fingerprint, layers, experts, top-k)."""
        from traces.storing.schema import ModelIdentity

        return ModelIdentity(fingerprint=self.fingerprint, num_layers=self.num_layers,
                             moe_layers=tuple(self.moe_layers),
                             experts_per_layer=self.experts_per_layer, top_k=self.top_k)

    def expert_bytes(self) -> np.ndarray:
        """[L, E] int64 bytes of each expert; row i is the i-th MoE layer."""
        sizes = np.array([e.bytes for e in self.experts], dtype=np.int64)
        return sizes.reshape(len(self.moe_layers), self.experts_per_layer)

    def to_json(self, *, with_experts: bool = True) -> dict:
        sizes = self.expert_bytes()
        d = {
            "architecture": self.architecture,
            "model_type": self.model_type,
            "fingerprint": self.fingerprint,
            "estimated": self.estimated,
            "num_layers": self.num_layers,
            "moe_layers": list(self.moe_layers),
            "dense_layers": list(self.dense_layers),
            "experts_per_layer": self.experts_per_layer,
            "top_k": self.top_k,
            "shared_experts": self.shared_experts,
            "bytes_per_expert": {"min": int(sizes.min()), "max": int(sizes.max())},
            "expert_bytes_total": self.expert_bytes_total,
            "dense_bytes": self.dense_bytes,
            "files": [{"name": f.name, "size": f.size} for f in self.files],
        }
        if with_experts:
            d["experts"] = [e.to_json() for e in self.experts]
        return d



def sort_tensors(tensors: Iterable[tuple[DenseTensor, ExpertRanges | None]], where: str
                 ) -> tuple[tuple[int, ...], dict[tuple[int, int], list[TensorRange]],
                            list[DenseTensor]]:
    """Every tensor of a checkpoint (as a DenseTensor, with its routed experts' ranges or None
    when it is dense) sorted into (MoE layers, {(layer, expert): ranges}, dense tensors);
    PlacerError when no tensor is a routed expert's (`where`: the checkpoint, as named)."""
    experts: dict[tuple[int, int], list[TensorRange]] = {}
    dense: list[DenseTensor] = []
    for tensor, ranges in tensors:
        if ranges is None:
            dense.append(tensor)
        for key, r in ranges or ():
            experts.setdefault(key, []).append(r)
    moe_layers = tuple(sorted({layer for layer, _ in experts}))
    if not moe_layers:
        raise PlacerError(f"not an MoE model: no routed expert tensors in {where}")
    return moe_layers, experts, dense


def assemble(config: dict, num_layers: int, num_experts: int, top_k: int, shared: int,
              moe_layers: tuple[int, ...], experts: dict[tuple[int, int], list[TensorRange]],
              dense: list[DenseTensor], files: tuple[SourceFile, ...], *, estimated: bool
              ) -> Inventory:
    ordered = []
    for layer in moe_layers:
        for e in range(num_experts):
            ranges = experts.get((layer, e))
            if not ranges:
                raise PlacerError(f"layer {layer} has no tensors for expert {e} "
                                  f"(config says {num_experts} experts per layer)")
            ordered.append(Expert(layer, e, tuple(sorted(ranges, key=lambda r: r.name))))
        _check_alike(ordered[-num_experts:])
    dense.sort(key=lambda d: d.name)
    arch = (config.get("architectures") or [config.get("model_type", "unknown")])[0]
    return Inventory(
        architecture=arch, model_type=str(config.get("model_type", "unknown")),
        num_layers=num_layers, moe_layers=moe_layers, experts_per_layer=num_experts,
        top_k=top_k, shared_experts=shared, experts=tuple(ordered), dense_tensors=tuple(dense),
        files=files, fingerprint=fingerprint(config, ordered, dense), estimated=estimated,
        config=config)


def _check_alike(layer: list[Expert]) -> None:
    """Every expert of one MoE layer must have the same tensors (names less the expert's
    prefix), shapes and dtypes; PlacerError naming the first expert that differs."""

    def tensors(ex: Expert) -> dict[str, tuple[str, tuple[int, ...]]]:
        return {EXPERT_PREFIX.sub("", r.name): (r.dtype, r.shape) for r in ex.tensors}

    first = tensors(layer[0])
    for ex in layer[1:]:
        mine = tensors(ex)
        if mine == first:
            continue
        where = f"layer {ex.layer} expert {ex.expert}"
        missing = sorted(set(first) - set(mine))
        if missing:
            raise PlacerError(f"{where}: tensor {missing[0]!r} is missing (expert "
                              f"{layer[0].expert} has it)")
        extra = sorted(set(mine) - set(first))
        if extra:
            raise PlacerError(f"{where}: tensor {extra[0]!r} is not in expert {layer[0].expert}")
        name = next(n for n in sorted(mine) if mine[n] != first[n])
        raise PlacerError(f"{where}: tensor {name!r} is {mine[name][0]}{list(mine[name][1])}, "
                          f"expert {layer[0].expert}'s is {first[name][0]}"
                          f"{list(first[name][1])}")


def fingerprint(config: dict, experts: list[Expert], dense: list[DenseTensor]) -> str:
    """sha256 (hex, 16 chars) of the config (less volatile keys) and every tensor's name,
    dtype and shape: the same model in another file layout keeps its fingerprint."""
    h = hashlib.sha256()
    h.update(json.dumps({k: v for k, v in config.items() if k not in VOLATILE_CONFIG_KEYS},
                        sort_keys=True).encode())
    for ex in experts:
        for r in ex.tensors:
            h.update(f"{ex.layer}/{ex.expert}/{r.name}/{r.dtype}/{r.shape}\n".encode())
    for d in dense:
        h.update(f"{d.name}/{d.dtype}/{d.shape}\n".encode())
    return h.hexdigest()[:16]
