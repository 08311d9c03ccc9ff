"""Per-layer expert tables: what makes a resident or cached expert cost nothing at a forward.

At load, each MoE layer's resident experts (those with no cold bytes) are written once into
the parameters of the layer's original experts module (`gate_up_proj` [rows, 2I, H],
`down_proj`, gpt-oss biases...), one row per resident expert in ascending expert id, followed
by one row per cache slot the layer has on each card (its partition, `CachePolicy.partition`:
the table holds the slots, the stagers keep none) and by `spare` rows for the selected cold
experts the cache does not keep. The runtime's own device copy of the resident experts is
then dropped (its `fetch` returns views of the table rows), so they are held once.

A forward then costs, per layer:

- **every expert resident** (no cold expert in the layer): the original module's forward on
  the table with the router's own indices. No host sync, no copy, no index remap: the same
  kernels on the same operands as plain transformers, and a CUDA graph could capture it.
- **some experts cold**: one host sync (how often each expert was selected); the selected
  cold experts go through their cards' caches (`PlacedRuntime.stage`): a hit is already in
  its slot's row and costs nothing; a miss is staged (one host-to-device copy of its cold
  bytes) and written into its slot's row when the cache keeps it, else into a spare row. The
  original forward then runs with the indices mapped to table rows (a device gather). Resident
  and cached experts are never copied.
- **rows out of expert order** (cached and spare rows follow the resident ones in slot order)
  are computed as they lie only where the order cannot change the rounding: `batched_mm`
  computes every (token, expert) pair on its own and sums in top-k order, so any order is
  exact; `grouped_mm` sorts the pairs by row with an unstable sort, and the order of equal
  rows within a group changes which rows a matmul computes in its tail block (measured: 9e-8
  apart), so it is exact only with each expert selected once (one sequence decoding);
  `eager` (and any other implementation) sums in row order. Otherwise the selected rows are
  gathered into expert order first (one device copy of the selected experts).
- **the compact path** of `StagedExperts` (the selected experts' rows built afresh) when more
  selected cold experts miss the cache than there are spare rows (prefill, large batches):
  the runtime's `fetch` stages them the same way, cached ones kept in their rows.

`spare` defaults to the model's top-k per layer (a layer that has that many cold experts):
one token's cold experts always fit, so one sequence's decode never takes the compact path;
the spare rows cost top-k rows of device memory per layer with cold experts. Every miss passes
through its card's staging buffer, which the plan sized for the misses the cache does not
keep: it grows once to a fetch's misses (`CardStager.grown`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import numpy as np
import torch
from torch import nn

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
        self.module = module
        self.layout = module.layout
        self.resident = len(resident)
        self.first_row: dict[int, tuple[int, int]] = {}  # card -> (first slot, its row)
        row = self.resident
        for card in (range(len(runtime.plan.cards)) if cold else ()):
            slots = runtime.cache.partition(card, runtime.row[layer])
            self.first_row[card] = (slots.start, row)
            row += len(slots)
        self.cached = row - self.resident
        self.spare = min(len(cold), top_k if spare is None else spare)
        self.identity = not cold
        device = runtime.device
        self.shapes = {EXPERT_PREFIX.sub("", t["name"]): t["shape"] for t in entries[0].tensors}
        self.params = {p: torch.empty((row + self.spare, *shape), dtype=module.weight_dtype,
                                      device=device)
                       for p, shape in module.layout.row_shapes(self.shapes).items()}
        for r, weights in enumerate(runtime.fetch(layer, resident)):
            module.layout.fill(self.params, r, weights)
        for r, e in enumerate(resident):  # the runtime keeps views of the rows, not a copy
            runtime.experts[(layer, e)] = dataclasses.replace(
                entries[e], resident=(), whole=module.layout.split(self.params, r, self.shapes))
        self.view = module.original_view(self.params, row + self.spare)
        self.row_np = np.zeros(num_experts, dtype=np.int64)  # expert -> its row (host mirror)
        self.row_np[resident] = np.arange(self.resident)
        self.row_of = torch.from_numpy(self.row_np).to(device)
        self.cold_np = np.zeros(num_experts, dtype=bool)
        self.cold_np[cold] = True
        self.card_np = np.array([eb.card for eb in entries], dtype=np.int64)
        runtime.hold(layer, self)

    def cache_row(self, card: int, slot: int) -> int:
        first_slot, first_row = self.first_row[card]
        return first_row + slot - first_slot

    def keep(self, card: int, slot: int, weights: Mapping[str, torch.Tensor]) -> None:
        self.layout.fill(self.params, self.cache_row(card, slot), weights)

    def weights(self, card: int, slot: int) -> dict[str, torch.Tensor]:
        return self.layout.split(self.params, self.cache_row(card, slot), self.shapes)

    def route(self, top_k_index: torch.Tensor, implementation: str
              ) -> tuple[nn.Module, torch.Tensor] | None:
        """The module to run and its indices for `top_k_index`: the table and the rows of the
        selected experts (cold ones staged), or the selected rows gathered in expert order;
        None when the compact path must compute this forward. One host sync."""
        counts = torch.bincount(top_k_index.reshape(-1),
                                minlength=self.cold_np.size).cpu().numpy()
        selected = counts > 0
        cold = np.flatnonzero(selected & self.cold_np)
        if cold.size > self.spare and self._misses(cold) > self.spare:
            return None
        if cold.size:
            self._stage(cold)
        device = top_k_index.device
        rows = self.row_np[selected]
        if (implementation == "batched_mm" or np.all(np.diff(rows) > 0)
                or (implementation == "grouped_mm" and int(counts.max()) == 1)):
            return self.view, self.row_of[top_k_index]
        order = torch.from_numpy(rows).to(device, non_blocking=True)
        params = {p: t.index_select(0, order) for p, t in self.params.items()}
        compact = np.full(self.cold_np.size, -1, dtype=np.int64)
        compact[selected] = np.arange(rows.size)
        index = torch.from_numpy(compact).to(device, non_blocking=True)
        return self.module.original_view(params, rows.size), index[top_k_index]

    def _misses(self, cold: np.ndarray) -> int:
        """How many of the selected cold experts `cold` their cards' caches do not hold (at
        most this many need a spare row)."""
        cache, base = self.runtime.cache, self.runtime.row[self.layer] * self.cold_np.size
        return sum(not cache.holds(int(self.card_np[e]), base + int(e)) for e in cold)

    def _stage(self, cold: np.ndarray) -> None:
        """Stage the selected cold experts `cold` (ascending) through their cards' caches:
        hits stay in their rows, kept misses are written into theirs (by the runtime), the
        others into the spare rows, in order; then point their rows there."""
        spare = self.resident + self.cached
        for e, staged in zip(cold.tolist(), self.runtime.stage(self.layer, cold.tolist()),
                             strict=True):
            if staged.found.slot is not None:
                self.row_np[e] = self.cache_row(staged.card, staged.found.slot)
            else:
                self.layout.fill(self.params, spare, staged.weights)
                self.row_np[e] = spare
                spare += 1
        update = torch.from_numpy(np.stack([cold, self.row_np[cold]]))
        update = update.to(self.row_of.device, non_blocking=True)
        self.row_of.index_copy_(0, update[0], update[1])

    def nbytes(self) -> tuple[int, int, int]:
        """(resident rows', cache rows', spare rows' bytes) on the device."""
        rows = self.resident + self.cached + self.spare
        per_row = sum(t[0].numel() * t.element_size() for t in self.params.values()) \
            if rows else 0
        return self.resident * per_row, self.cached * per_row, self.spare * per_row


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
    """What the tables hold: layers computed with no sync, resident, cache and spare bytes."""
    sizes = [t.nbytes() for t in tables]
    return {"layers": len(tables), "all_resident_layers": sum(t.identity for t in tables),
            "resident_bytes": sum(r for r, _, _ in sizes),
            "cache_bytes": sum(c for _, c, _ in sizes),
            "spare_bytes": sum(s for _, _, s in sizes), "spare_rows": [t.spare for t in tables]}
