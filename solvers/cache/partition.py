"""Per-layer caches: each card's slots split into one partition per MoE layer, or pooled.

A layer's fetch only ever uses its own layer's partition (its quota of slots, `quotas[c, l]`).
Partitioning is what makes a cache work at B > 1: one decode step of 8 sequences touches
about 480 (layer, expert) keys of gpt-oss-20b, so a cache shared by all layers sees a cyclic
scan longer than itself and an LRU hits 0.1% of selections at 192-384 slots, where per-layer
partitions of the same slots hit 37-70% (held-out gpt-oss decode routing,
benchmarks/bench_routing.py). Engines partition by layer too (llama.cpp PR #27861: N slots
per layer; vLLM PR #37190: the hottest experts of each layer).

The slots of partition (c, l) are slot ids offset[c, l] .. offset[c, l] + quota[c, l] - 1;
member j of the partition sits in slot offset + j, and an evicted member's slot takes the
new key. A policy is a victim rule over the partition's members (solvers/cache/kernels.py):
the member with the lowest score (ties: the lowest key) that no key of the current fetch
holds. Every access ticks the card's clock; a hit refreshes its key's `last` access and
counts it in `freq`, an admitted key starts at freq 1.

Pooled (`pooled=True`, any policy): one partition per card, all of its slots (the sum of its
layers' quotas), which every layer's fetch shares: a miss may evict any slot of the card that
no key of this fetch holds, whichever layer's expert it keeps. It wins where layers are unequal
and slots many: on gpt-oss-20b's decode routing at B = 1 a pooled LRU beats per-layer LRU at
16 slots per layer and loses at 6 (issue #42); at B > 1 a pool sees each step's scan of
every layer's experts and loses (above). The policy's own memory (lfuda's age) is then one
per card, not one per layer.
"""

from __future__ import annotations

import numpy as np

from solvers.cache.policy import CachePolicy


class PartitionedCache(CachePolicy):
    """Per-layer partitions of every card's slots, or one pool per card (see module
    docstring)."""

    def new_state(self) -> tuple[np.ndarray, ...]:
        quotas, num_keys = self.quotas, self.num_keys
        cards, layers = quotas.shape
        parts = quotas.sum(axis=1, keepdims=True) if self.pooled else quotas
        offset = np.zeros_like(parts)
        offset[:, 1:] = np.cumsum(parts, axis=1)[:, :-1]
        width = max(1, int(quotas.sum(axis=1).max(initial=0)))
        remembered = num_keys if self.keeps else 0
        slot = np.zeros((3, cards, width), dtype=np.int64)
        slot[0] = -1  # no key
        return (np.array([num_keys // layers, int(self.pooled), 0, -1], dtype=np.int64),
                np.stack([offset, parts, np.zeros_like(parts)]), np.zeros(parts.shape), slot,
                np.zeros((cards, width)), np.full((cards, num_keys), -1, dtype=np.int64),
                np.zeros((2, cards), dtype=np.int64), np.zeros((cards, remembered, self.keeps)),
                np.zeros((cards, remembered), dtype=np.int64),
                np.ascontiguousarray(self.params(), dtype=np.float64),
                np.ascontiguousarray(self.calibration(), dtype=np.float64))

    def cached(self, card: int) -> set[int]:
        return {int(k) for k in self.state[3][0, card] if k >= 0}

    def holds(self, card: int, key: int) -> bool:
        return bool(self.state[5][card, key] >= 0)

    def partition(self, card: int, row: int) -> range:
        part = 0 if self.pooled else row
        start, size = self.state[1][:2, card, part].tolist()
        return range(start, start + size)
