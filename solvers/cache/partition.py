"""Per-layer caches: each card's slots split into one partition per MoE layer.

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
"""

from __future__ import annotations

import numpy as np

from solvers.cache.policy import CachePolicy


class PartitionedCache(CachePolicy):
    """Per-layer partitions of every card's slots (see module docstring)."""

    @staticmethod
    def new_state(quotas: np.ndarray, num_keys: int) -> tuple[np.ndarray, ...]:
        cards, layers = quotas.shape
        offset = np.zeros_like(quotas)
        offset[:, 1:] = np.cumsum(quotas, axis=1)[:, :-1]
        width = max(1, int(quotas.sum(axis=1).max(initial=0)))
        return (np.array([num_keys // layers], dtype=np.int64), offset, quotas.copy(),
                np.zeros_like(quotas), np.full((cards, width), -1, dtype=np.int64),
                np.full((cards, num_keys), -1, dtype=np.int64),
                np.zeros((cards, width), dtype=np.int64), np.zeros((cards, width)),
                np.zeros((cards, width), dtype=np.int64), np.zeros(cards, dtype=np.int64),
                np.zeros(cards, dtype=np.int64))

    def cached(self, card: int) -> set[int]:
        return {int(k) for k in self.state[4][card] if k >= 0}

    def holds(self, card: int, key: int) -> bool:
        return bool(self.state[5][card, key] >= 0)

    def partition(self, card: int, row: int) -> range:
        start = int(self.state[1][card, row])
        return range(start, start + int(self.quotas[card, row]))
