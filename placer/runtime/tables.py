"""Per-layer expert tables: what makes a resident expert cost nothing at a forward.

At load, each MoE layer's resident experts (those with no cold bytes) are written once into
the parameters of the layer's original experts module (`gate_up_proj` [rows, 2I, H],
`down_proj`, gpt-oss biases...), one row per resident expert in ascending expert id, followed
by `spare` rows that the layer's selected cold experts are staged into. The runtime's own
device copy of those experts is then dropped (its `fetch` returns views of the table rows),
so the resident bytes are held once.

A forward then costs, per layer:

- **every expert resident** (no cold expert in the layer): the original module's forward on
  the table with the router's own indices. No host sync, no copy, no index remap: the same
  kernels on the same operands as plain transformers, and a CUDA graph could capture it.
- **some experts cold**: one host sync (how often each expert was selected); no cold expert
  selected: the original forward with the indices mapped to table rows (a device gather,
  order-preserving). Otherwise the selected cold experts are fetched from the runtime (staged
  by their card's `CardStager`, cache slots included, counted per card) and copied into the
  spare rows, one device copy per tensor; resident experts are never copied.
- **the compact path** of `StagedExperts` (the selected experts' rows built afresh, in expert
  order) when more cold experts are selected than there are spare rows (prefill, large
  batches), or when computing on rows out of expert order could change the rounding. Spare
  rows follow the resident ones, so a selected cold expert with a smaller id than a selected
  resident one is out of order. `batched_mm` computes every (token, expert) pair on its own
  and sums in top-k order: any order is exact. `grouped_mm` sorts the pairs by row with an
  unstable sort, and the order of equal rows within a group changes which rows a matmul
  computes in its tail block (measured: 9e-8 apart); with each expert selected once (one
  sequence decoding) there are no equal rows, so it is exact. `eager` (and any other
  implementation) sums in row order: exact only in expert order.

`spare` defaults to the model's top-k per layer (a layer that has that many cold experts):
one token's cold experts always fit, so one sequence's decode never takes the compact path;
the spare rows cost top-k rows of device memory per layer with cold experts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
import torch

from placer.runtime.experts import StagedExperts
from placer.runtime.loader import EXPERT_PREFIX, PlacedRuntime


class LayerTable:
    """The table of MoE layer `module.layer` (see module docstring)."""

    def __init__(self, module: StagedExperts, runtime: PlacedRuntime, spare: int | None
                 ) -> None:
        layer, num_experts = module.layer, module.num_experts
        entries = [runtime.experts[(layer, e)] for e in range(num_experts)]
        resident = [e for e, eb in enumerate(entries) if eb.cold is None]
        cold = [e for e, eb in enumerate(entries) if eb.cold is not None]
        top_k = int(runtime.plan.model["top_k"])
        self.layer = layer
        self.runtime = runtime
        self.layout = module.layout
        self.resident = len(resident)
        self.spare = min(len(cold), top_k if spare is None else spare)
        self.identity = not cold
        device = runtime.device
        shapes = {EXPERT_PREFIX.sub("", t["name"]): t["shape"] for t in entries[0].tensors}
        self.params = {p: torch.empty((self.resident + self.spare, *shape),
                                      dtype=module.weight_dtype, device=device)
                       for p, shape in module.layout.row_shapes(shapes).items()}
        for row, weights in enumerate(runtime.fetch(layer, resident)):
            module.layout.fill(self.params, row, weights)
        for row, e in enumerate(resident):  # the runtime keeps views of the rows, not a copy
            runtime.experts[(layer, e)] = dataclasses.replace(
                entries[e], resident=(), whole=module.layout.split(self.params, row, shapes))
        self.view = module.original_view(self.params, self.resident + self.spare)
        self.slot_of = torch.zeros(num_experts, dtype=torch.long, device=device)
        self.slot_of[resident] = torch.arange(self.resident, device=device)
        self.cold_np = np.zeros(num_experts, dtype=bool)
        self.cold_np[cold] = True
        self.cold_mask = torch.from_numpy(self.cold_np).to(device)

    def route(self, top_k_index: torch.Tensor, implementation: str) -> torch.Tensor | None:
        """Table rows for `top_k_index`, the selected cold experts staged into spare rows;
        None when the compact path must compute this forward. One host sync."""
        on_device = torch.bincount(top_k_index.reshape(-1), minlength=self.cold_mask.numel())
        counts = on_device.cpu().numpy()
        selected = counts > 0
        cold = np.flatnonzero(selected & self.cold_np)
        if cold.size:
            if cold.size > self.spare or not exact_out_of_order(
                    implementation, counts, np.flatnonzero(selected & ~self.cold_np), cold):
                return None
            self._stage(cold, (on_device > 0) & self.cold_mask)
        return self.slot_of[top_k_index]

    def _stage(self, cold: np.ndarray, mask: torch.Tensor) -> None:
        """Stage the selected cold experts `cold` (ascending; `mask` on the device) into the
        spare rows, in order, and point their slots there (no second sync)."""
        for j, weights in enumerate(self.runtime.fetch(self.layer, cold.tolist())):
            self.layout.fill(self.params, self.resident + j, weights)
        rows = self.resident + torch.cumsum(mask, 0) - 1
        self.slot_of.copy_(torch.where(mask, rows, self.slot_of))

    def nbytes(self) -> tuple[int, int]:
        """(resident rows' bytes, spare rows' bytes) on the device."""
        per_row = sum(t[0].numel() * t.element_size() for t in self.params.values()) \
            if self.resident + self.spare else 0
        return self.resident * per_row, self.spare * per_row


def exact_out_of_order(implementation: str, counts: np.ndarray, resident: np.ndarray,
                       cold: np.ndarray) -> bool:
    """Whether `implementation` computes the selected experts (`counts` per expert; the
    selected `resident` and `cold` ids) bit for bit on table rows: resident rows in expert
    order, then the cold ones (see module docstring)."""
    if implementation == "batched_mm" or resident.size == 0 or resident.max() < cold.min():
        return True
    return implementation == "grouped_mm" and int(counts.max()) == 1


def bind_tables(modules: Sequence[StagedExperts], runtime: PlacedRuntime,
                spare: int | None = None) -> list[LayerTable]:
    """Give every staged experts module of a model its table over `runtime` (layer by layer,
    so loading holds at most one layer's resident experts twice)."""
    if spare is not None and spare < 0:
        raise ValueError(f"spare rows must be >= 0, got {spare}")
    tables = []
    for module in modules:
        table = LayerTable(module, runtime, spare)
        module.use_table(table)
        tables.append(table)
    return tables


def tables_json(tables: Sequence[LayerTable]) -> dict:
    """What the tables hold: layers computed with no sync, resident and spare bytes."""
    sizes = [t.nbytes() for t in tables]
    return {"layers": len(tables), "all_resident_layers": sum(t.identity for t in tables),
            "resident_bytes": sum(r for r, _ in sizes), "spare_bytes": sum(s for _, s in sizes),
            "spare_rows": [t.spare for t in tables]}
