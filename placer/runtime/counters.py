"""Staging counters per MoE layer and card: bytes staged, copies, cache hits, time spent."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch


@dataclass
class StagingCounters:
    """Counters of a runtime; row i of every array is MoE layer `layers[i]`, column a card.

    `seconds` is the time the staging copies of a fetch took: measured with CUDA events on
    the staging stream (resolved when read, so counting never blocks a fetch), or the wall
    time of the copies on a CPU device.
    """

    layers: tuple[int, ...]
    num_cards: int
    bytes: np.ndarray = field(init=False)
    copies: np.ndarray = field(init=False)
    hits: np.ndarray = field(init=False)
    fetches: np.ndarray = field(init=False)
    _seconds: np.ndarray = field(init=False, repr=False)
    _pending: list[tuple[int, int, torch.cuda.Event, torch.cuda.Event]] = field(
        init=False, default_factory=list, repr=False)

    def __post_init__(self) -> None:
        shape = (len(self.layers), self.num_cards)
        self.bytes, self.copies, self.hits, self.fetches = (
            np.zeros(shape, dtype=np.int64) for _ in range(4))
        self._seconds = np.zeros(shape, dtype=np.float64)

    def record(self, row: int, card: int, *, nbytes: int, copies: int, hits: int) -> None:
        """Count one fetch's staging on `card` at MoE layer row `row`."""
        self.bytes[row, card] += nbytes
        self.copies[row, card] += copies
        self.hits[row, card] += hits
        self.fetches[row, card] += 1

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
        """Totals, per card and per (layer, card) rows with anything fetched."""
        seconds = self.seconds

        def row(sel: tuple) -> dict:
            return {"bytes": int(self.bytes[sel].sum()), "copies": int(self.copies[sel].sum()),
                    "cache_hits": int(self.hits[sel].sum()),
                    "fetches": int(self.fetches[sel].sum()),
                    "seconds": float(seconds[sel].sum())}

        return {
            "total": row((slice(None), slice(None))),
            "per_card": [{"card": c, **row((slice(None), c))} for c in range(self.num_cards)],
            "per_layer": [{"layer": layer, "card": c, **row((i, c))}
                          for i, layer in enumerate(self.layers) for c in range(self.num_cards)
                          if self.fetches[i, c]],
        }
