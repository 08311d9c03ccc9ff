"""What every cache policy is: per-card state held in numpy arrays, run by one compiled
walk of fetches (`replay_requests`, solvers/cache/kernels.py) under the policy's victim rule.

A card's cache holds cold experts staged earlier, each in one device slot, `quotas[c, l]`
slots for MoE layer l (a layer's fetch uses only its own: solvers/cache/partition.py says
why; or, `pooled`, the card's slots are one pool every layer's fetch shares). Experts are
keys `layer_row * E + expert` (layer_row: the MoE layer's ordinal). The runtime asks a card's
cache about one layer's fetch at a time (`CachePolicy.lookup`), and the replay
(`solvers.cache.replay`) walks recorded steps through the very same compiled walk (a lookup
is a walk of one fetch), so a prediction and the runtime's counters agree by construction.

A fetch is the set of distinct cold experts one layer of one step needs on one card. Their
weights are used together, so no expert of a fetch is evicted by that fetch. Each key, in
ascending order (classlru: its hits first): a hit stays; a miss takes a free slot of its
partition, else the slot of the victim the policy's score picks among those that hold no
expert of this fetch, else none (every slot holds an expert this fetch needs, or there are no
slots): it is staged into the staging buffer and not cached. Either way a miss costs one copy
of its cold bytes. Policies with memory (lfuda, classlru, learned) keep per-key state across
evictions, and count every use, an uncached miss too; classlru and learned age on the token
clock (solvers/cache/kernels.py), which a lookup takes as `now`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from solvers.cache.kernels import replay_requests


@dataclass(frozen=True)
class Lookup:
    """Where one selected cold expert's weights come from in a fetch: a hit in `slot`
    (nothing staged), or a miss staged into `slot` (which now caches it) or, when `slot` is
    None, into the staging buffer."""

    hit: bool
    slot: int | None


class CachePolicy:
    """One cache per card, `quotas[c, l]` slots for MoE layer l on card c, over the keys
    0 .. num_keys - 1 (num_keys = L x experts per layer)."""

    name: ClassVar[str]
    score: ClassVar[int]  # which victim rule replay_requests applies (solvers/cache/kernels.py)
    keeps: ClassVar[int] = 0  # per-key values the policy keeps across eviction (kept [C, K, F])

    def __init__(self, quotas: np.ndarray, num_keys: int, *, pooled: bool = False) -> None:
        self.quotas = np.array(quotas, dtype=np.int64, ndmin=2)
        if self.quotas.ndim != 2 or (self.quotas < 0).any():
            raise ValueError(f"cache slots must be [cards, layers] counts >= 0, got {quotas!r}")
        if num_keys % self.quotas.shape[1]:
            raise ValueError(f"{num_keys} keys do not split into {self.quotas.shape[1]} layers")
        self.num_keys = int(num_keys)
        self.pooled = bool(pooled)
        self.state = self.new_state()
        width = self.num_keys // self.quotas.shape[1]
        self._hit = np.zeros(width, dtype=np.bool_)  # a fetch's answers, reused
        self._slot = np.zeros(width, dtype=np.int64)
        self._cacheable = np.ones(self.num_keys, dtype=np.bool_)
        self._time = np.zeros(1, dtype=np.int64)  # a lookup's token time, reused
        self._offsets = [np.array([0, n], dtype=np.int64) for n in range(width + 1)]
        self._none = np.zeros(0, dtype=np.int64)  # misses: not counted
        self._on_card: dict[int, np.ndarray] = {}  # card -> [num_keys] home: that card

    @property
    def slots(self) -> np.ndarray:
        """[C] slots of each card."""
        return self.quotas.sum(axis=1)

    def params(self) -> np.ndarray:
        """The policy's constants as the kernel reads them (solvers/cache/kernels.py)."""
        return np.zeros(0)

    def calibration(self) -> np.ndarray:
        """[K] per-key calibration frequencies the kernel reads (empty where unused)."""
        return np.zeros(0)

    def new_state(self) -> tuple[np.ndarray, ...]:
        raise NotImplementedError

    @property
    def now(self) -> int:
        """The token time of the last step walked (solvers/cache/kernels.py: the token
        clock); a replay's steps continue from it."""
        return int(self.state[0][2])

    @property
    def kept(self) -> np.ndarray:
        """[C, K, F] the per-key values the policy keeps across eviction (lfuda's counts,
        classlru's CRF, learned's decayed counts; F = `keeps`; K = 0 where none)."""
        return self.state[7]

    def reset(self) -> None:
        """Empty every card's cache (the memory kept across eviction too)."""
        self.state = self.new_state()

    def lookup(self, card: int, keys: Sequence[int], now: int | None = None) -> list[Lookup]:
        """Look up one fetch's distinct keys on `card` (any order); admit the misses. The
        answer is in the order of `keys`: a walk of this one fetch (solvers/cache/kernels.py)
        at token time `now` (the tokens served so far, this forward's included; None: the
        last one, no tokens since). (The runtime calls this once per layer and card of every
        forward: plain Python on a handful of keys, no numpy beyond the kernel's arguments.)"""
        ordered = sorted(int(k) for k in keys)
        if not ordered:
            return []
        if len(set(ordered)) != len(ordered):
            raise ValueError("keys of one fetch must be distinct")
        if not (0 <= ordered[0] and ordered[-1] < self.num_keys):
            raise ValueError(f"keys must lie in [0, {self.num_keys})")
        width = self.num_keys // self.quotas.shape[1]
        if ordered[0] // width != ordered[-1] // width:
            raise ValueError("keys of one fetch must belong to one layer")
        if not 0 <= card < len(self.quotas):
            raise ValueError(f"card {card} is not one of the {len(self.quotas)} cards")
        if now is not None and now < self.now:
            raise ValueError(f"token time {now} is before the cache's {self.now}")
        n = len(ordered)
        if card not in self._on_card:
            self._on_card[card] = np.full(self.num_keys, card, dtype=np.int64)
        hit, slot = self._hit[:n], self._slot[:n]
        self._time[0] = self.now if now is None else now
        replay_requests(self.state, self.score, np.array(ordered, dtype=np.int32),
                        self._offsets[n], self._time, self._cacheable, self._on_card[card],
                        len(self.quotas), width, hit, slot, self._none)
        found = {k: Lookup(bool(h), s if s >= 0 else None)
                 for k, h, s in zip(ordered, hit.tolist(), slot.tolist(), strict=True)}
        return [found[int(k)] for k in keys]

    def cached(self, card: int) -> set[int]:
        """The keys `card`'s cache holds now."""
        raise NotImplementedError

    def holds(self, card: int, key: int) -> bool:
        """Whether `card`'s cache holds `key` now (a question: nothing changes)."""
        raise NotImplementedError

    def partition(self, card: int, row: int) -> range:
        """The slot ids `card`'s cache gives MoE layer row `row` (`Lookup.slot` lies in it
        for that layer's keys; pooled: all of the card's slots)."""
        raise NotImplementedError
