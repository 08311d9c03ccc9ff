"""The LRU of staged experts, and what staging a sequence of forwards costs with it.

`ExpertLRU` is the one cache policy: the runtime (`placer.runtime.staging`) keeps one per card
(its slots in spare VRAM hold recently staged cold experts) and `simulate_lru` replays recorded
or sampled selections through the same class, so a prediction and the runtime's counters agree
by construction.

Order matters for an LRU, so both walk the traffic the same way: forward by forward (a decode
step), MoE layer by layer, and within one layer's fetch on one card the selected cold experts
in ascending expert id. With `slots=0` nothing is cached and the prediction is the cost
model's: each forward stages, per layer and card, the cold bytes of the union of experts its
tokens selected, one copy per selected cold expert.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Lookup:
    """Where one selected cold expert's weights come from in a fetch.

    hit: already in cache slot `slot`, nothing staged. A miss is staged: into `slot` (which now
    caches it) or, when `slot` is None, into the staging buffer (every slot holds an expert this
    same fetch needs, or there are no slots).
    """

    hit: bool
    slot: int | None


class ExpertLRU:
    """Least-recently-used cache of cold experts held in `slots` device slots of one card."""

    def __init__(self, slots: int) -> None:
        if slots < 0:
            raise ValueError(f"cache slots must be >= 0, got {slots}")
        self.slots = slots
        self._slot_of: OrderedDict[Hashable, int] = OrderedDict()  # oldest first
        self._free = list(range(slots - 1, -1, -1))

    def __contains__(self, key: Hashable) -> bool:
        return key in self._slot_of

    def lookup(self, keys: Sequence[Hashable]) -> list[Lookup]:
        """Look up the distinct `keys` one fetch needs, in order; admit the misses.

        Hits become most recent. Each miss takes a free slot, else the least recently used slot
        whose expert this fetch does not need; the experts of one fetch are never evicted by
        that fetch, since their weights are all in use together.
        """
        needed = set(keys)
        if len(needed) != len(keys):
            raise ValueError("keys of one fetch must be distinct")
        out: list[Lookup] = []
        for key in keys:
            if key in self._slot_of:
                self._slot_of.move_to_end(key)
                out.append(Lookup(True, self._slot_of[key]))
            else:
                slot = self._take_slot(needed)
                if slot is not None:
                    self._slot_of[key] = slot
                out.append(Lookup(False, slot))
        return out

    def _take_slot(self, protected: set[Hashable]) -> int | None:
        if self._free:
            return self._free.pop()
        victim = next((k for k in self._slot_of if k not in protected), None)
        return None if victim is None else self._slot_of.pop(victim)


@dataclass(frozen=True)
class StagingCounts:
    """Per forward s, MoE layer l (ordinal) and card c: bytes staged, copies, cache hits."""

    bytes: np.ndarray   # [S, L, C] int64
    copies: np.ndarray  # [S, L, C] int64
    hits: np.ndarray    # [S, L, C] int64


def simulate_lru(selected: np.ndarray, cold_bytes: np.ndarray, home: np.ndarray,
                 num_cards: int, slots: int) -> StagingCounts:
    """What the runtime stages for a sequence of forwards, with `slots` cache slots per card.

    selected: [S, L, E] bool, the experts each forward's tokens selected (union over its
    tokens) at each MoE layer; cold_bytes: [L, E] bytes of each expert that are not resident
    (0 = fully resident, never staged nor cached); home: [L, E] card of each expert.
    """
    selected = np.asarray(selected, dtype=bool)
    cold_bytes = np.asarray(cold_bytes, dtype=np.int64)
    home = np.asarray(home, dtype=np.int64)
    if slots == 0:  # nothing is cached: every selected cold expert is one copy
        onehot = np.eye(num_cards, dtype=np.int64)[home]  # [L, E, C]
        chosen = (selected & (cold_bytes > 0)).astype(np.int64)
        return StagingCounts(np.einsum("sle,le,lec->slc", chosen, cold_bytes, onehot),
                             np.einsum("sle,lec->slc", chosen, onehot),
                             np.zeros((*selected.shape[:2], num_cards), dtype=np.int64))
    steps, layers, _ = selected.shape
    staged, copies, hits = (np.zeros((steps, layers, num_cards), dtype=np.int64)
                            for _ in range(3))
    caches = [ExpertLRU(slots) for _ in range(num_cards)]
    for s in range(steps):
        for layer in range(layers):
            chosen = np.flatnonzero(selected[s, layer] & (cold_bytes[layer] > 0))
            for card in np.unique(home[layer, chosen]):
                mine = [int(e) for e in chosen[home[layer, chosen] == card]]
                for e, found in zip(mine, caches[card].lookup([(layer, e) for e in mine]),
                                    strict=True):
                    if found.hit:
                        hits[s, layer, card] += 1
                    else:
                        staged[s, layer, card] += cold_bytes[layer, e]
                        copies[s, layer, card] += 1
    return StagingCounts(staged, copies, hits)
