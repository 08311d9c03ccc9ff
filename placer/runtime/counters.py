"""Staging counters per MoE layer and card: bytes staged, copies, cache hits, time spent, and
what prefetching did (placer/runtime/prefetch.py)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import numpy as np
import torch

from solvers.cache.prefetch import Counts

# the prefetch counts kept per MoE layer and card: solvers.cache.prefetch.Counts' own fields
AHEAD = tuple(f.name for f in fields(Counts) if f.name != "staged_bytes")


@dataclass
class StagingCounters:
    """Counters of a runtime; row i of every array is MoE layer `layers[i]`, column a card.

    `seconds` is the time the staging copies of a fetch took: measured with CUDA events on
    the staging stream (resolved when read, so counting never blocks a fetch), or the wall
    time of the copies on a CPU device.

    Prefetching (a runtime's PrefetchCache): `ahead[name]` per solvers.cache.prefetch.Counts
    field (hits and misses there are the demand's, not prefetched for the layer; useful and
    late ones are `hits` here, found in the cache), `ahead_bytes` the prefetch copies' bytes,
    and on CUDA `late_measured`: prefetched experts whose copy had not landed when their layer
    looked them up (the copy event not yet complete; the compute stream then waits for it).
    `ahead["late"]` and `ahead["stall_s"]` follow the replay's clock model (a Link's copy_s and
    window_s), on every device: what the runtime and the replay compare exactly.
    """

    layers: tuple[int, ...]
    num_cards: int
    prefetching: bool = False  # the runtime prefetches: to_json has its `prefetch` section
    bytes: np.ndarray = field(init=False)
    copies: np.ndarray = field(init=False)
    hits: np.ndarray = field(init=False)
    fetches: np.ndarray = field(init=False)
    ahead: dict[str, np.ndarray] = field(init=False)
    ahead_bytes: np.ndarray = field(init=False)
    late_measured: np.ndarray = field(init=False)
    _seconds: np.ndarray = field(init=False, repr=False)
    _pending: list[tuple[int, int, torch.cuda.Event, torch.cuda.Event]] = field(
        init=False, default_factory=list, repr=False)

    def __post_init__(self) -> None:
        shape = (len(self.layers), self.num_cards)
        self.bytes, self.copies, self.hits, self.fetches = (
            np.zeros(shape, dtype=np.int64) for _ in range(4))
        self._seconds = np.zeros(shape, dtype=np.float64)
        self.ahead = {name: np.zeros(shape, dtype=np.float64 if name == "stall_s" else np.int64)
                      for name in AHEAD}
        self.ahead_bytes, self.late_measured = (np.zeros(shape, dtype=np.int64) for _ in range(2))

    def record(self, row: int, card: int, *, nbytes: int, copies: int, hits: int) -> None:
        """Count one fetch's staging on `card` at MoE layer row `row`."""
        self.bytes[row, card] += nbytes
        self.copies[row, card] += copies
        self.hits[row, card] += hits
        self.fetches[row, card] += 1

    def record_ahead(self, row: int, card: int, delta: dict[str, float]) -> None:
        """Add one prefetch step's Counts `delta` (field -> change) at MoE layer row `row`."""
        for name, value in delta.items():
            self.ahead[name][row, card] += value

    def prefetch_counts(self) -> Counts:
        """Every layer's and card's prefetch counts summed, as the replay counts them
        (staged_bytes: the bytes every demand and prefetch copy moved)."""
        return Counts(**{name: (float if name == "stall_s" else int)(a.sum())
                         for name, a in self.ahead.items()},
                      staged_bytes=int(self.bytes.sum() + self.ahead_bytes.sum()))

    def add_seconds(self, row: int, card: int, seconds: float) -> None:
        self._seconds[row, card] += seconds

    def add_events(self, row: int, card: int, start: torch.cuda.Event,
                   end: torch.cuda.Event) -> None:
        """Time between two CUDA events recorded around a fetch's copies, read later."""
        self._pending.append((row, card, start, end))

    @property
    def seconds(self) -> np.ndarray:
        """[L, C] seconds spent staging (waits for the copies still in flight)."""
        for row, card, start, end in self._pending:
            end.synchronize()
            self._seconds[row, card] += start.elapsed_time(end) / 1000.0
        self._pending.clear()
        return self._seconds

    def reset(self) -> None:
        """Zero every counter."""
        self._pending.clear()
        self.__post_init__()

    def to_json(self) -> dict:
        """Totals, per card and per (layer, card) rows with anything fetched (where the
        runtime prefetches, each with its prefetched, useful, late, wasted and prefetch_bytes,
        and `prefetch`: prefetch_json)."""
        seconds = self.seconds

        def row(sel: tuple) -> dict:
            ahead = {name: int(self.ahead[name][sel].sum())
                     for name in ("prefetched", "useful", "late", "wasted")} | {
                "prefetch_bytes": int(self.ahead_bytes[sel].sum())} if self.prefetching else {}
            return {"bytes": int(self.bytes[sel].sum()), "copies": int(self.copies[sel].sum()),
                    "cache_hits": int(self.hits[sel].sum()),
                    "fetches": int(self.fetches[sel].sum()),
                    "seconds": float(seconds[sel].sum()), **ahead}

        return {
            "total": row((slice(None), slice(None))),
            "per_card": [{"card": c, **row((slice(None), c))} for c in range(self.num_cards)],
            "per_layer": [{"layer": layer, "card": c, **row((i, c))}
                          for i, layer in enumerate(self.layers) for c in range(self.num_cards)
                          if self.fetches[i, c]],
            **({"prefetch": self.prefetch_json()} if self.prefetching else {}),
        }

    def prefetch_json(self) -> dict:
        """The prefetch counts summed (prefetch_counts), what the model's clock says of them,
        and on CUDA the late ones measured."""
        counts = self.prefetch_counts()
        return {**vars(counts), "prefetch_bytes": int(self.ahead_bytes.sum()),
                "late_measured": int(self.late_measured.sum()),
                "clock": "late and stall_s: the replay's clock model (solvers.cache.prefetch "
                         "Link: copy_s, window_s), not measured; late_measured: CUDA events "
                         "(0 on a CPU device)"}
