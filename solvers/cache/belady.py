"""Belady's MIN: a lower bound on the misses of any cache policy with given slots and pins.

The runtime's caches serve a fetch (one layer's selected cold experts on one card, needed
all at once) and never evict an expert of the fetch being served. Relax that: serve the
fetch's experts one after another (ascending ids), any cached expert evictable. Every
strategy of the real cache is one of the relaxed cache too, so the relaxed optimum is at
most the real one. For one request at a time the optimum is Belady's MIN with bypass: a miss
takes a free slot, else evicts the cached expert whose next use lies furthest ahead if that
is beyond the miss's own next use, else goes through the staging buffer uncached. So MIN
on the serialized requests bounds the misses of every policy, online or offline, with the
same slots and the same pinned set (exact MIN on the fetches themselves is not: keeping a
fetch's experts apart breaks Belady's exchange argument; tests/test_cache.py checks both
statements against exhaustive search).

What that bounds: the copies of each card. When every cold part on a card has one size
(whole experts of one shape) a copy costs the same, so the staged bytes and, on one card,
the stall are bounded too. With several cards a layer's stall is the max over cards, which
per-card MIN does not minimize: the `belady` line is then the stall of MIN's misses, an
estimate of the limit rather than a proof of it.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
from numba import njit

NEVER = np.iinfo(np.int64).max


@njit(cache=True)
def _min_hits(keys, slots, num_keys):
    """[n] bool hits of one card's requests `keys` [n], served one at a time in order, under
    MIN with bypass and `slots` slots."""
    n = len(keys)
    hit = np.zeros(n, dtype=np.bool_)
    if slots == 0:
        return hit
    nxt = np.empty(n, dtype=np.int64)
    last = np.full(num_keys, NEVER, dtype=np.int64)
    for i in range(n - 1, -1, -1):
        nxt[i] = last[keys[i]]
        last[keys[i]] = i
    slot_key = np.full(slots, -1, dtype=np.int64)
    slot_next = np.full(slots, -1, dtype=np.int64)
    key_slot = np.full(num_keys, -1, dtype=np.int64)
    used = 0
    for a in range(n):
        s = key_slot[keys[a]]
        if s >= 0:
            hit[a] = True
            slot_next[s] = nxt[a]
            continue
        if used < slots:
            s = used
            used += 1
        else:
            s = np.argmax(slot_next)
            if slot_next[s] <= nxt[a]:
                continue
            key_slot[slot_key[s]] = -1
        slot_key[s] = keys[a]
        key_slot[keys[a]] = s
        slot_next[s] = nxt[a]
    return hit


class BeladyReplay:
    """MIN over a whole traffic given in chunks of steps, read back chunk by chunk.

    The accesses (selected cold experts, in the runtime's order) of every chunk are kept,
    12 bytes each, since MIN needs all of the future before the first decision."""

    def __init__(self, chunks: Iterable[np.ndarray], cold_bytes: np.ndarray, home: np.ndarray,
                 slots: np.ndarray) -> None:
        cold = np.asarray(cold_bytes) > 0
        home = np.asarray(home, dtype=np.int64)
        self.shape = cold.shape
        layers, experts = cold.shape
        parts, start = [], 0
        for sel in chunks:
            s, layer, e = np.nonzero(np.asarray(sel, dtype=bool) & cold)
            parts.append(((start + s) * layers + layer, layer * experts + e))
            start += len(sel)
        fetch = np.concatenate([p[0] for p in parts]) if parts else np.zeros(0, np.int64)
        keys = np.concatenate([p[1] for p in parts]) if parts else np.zeros(0, np.int64)
        card = home.ravel()[keys]
        self.hit = np.zeros(len(keys), dtype=np.bool_)
        for c in range(len(slots)):
            mine = np.flatnonzero(card == c)
            self.hit[mine] = _min_hits(keys[mine], int(slots[c]), layers * experts)
        self.step_of = fetch // layers
        self.keys = keys.astype(np.int32)

    def hits(self, start: int, stop: int) -> np.ndarray:
        """[stop - start, L, E] bool hits of steps start .. stop - 1."""
        layers, experts = self.shape
        out = np.zeros((stop - start, layers, experts), dtype=np.bool_)
        lo, hi = np.searchsorted(self.step_of, [start, stop])
        mine = slice(lo, hi)
        out.reshape(stop - start, -1)[self.step_of[mine] - start,
                                      self.keys[mine]] = self.hit[mine]
        return out
