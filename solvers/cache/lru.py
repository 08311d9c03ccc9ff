"""Least recently used, per layer: a miss evicts the slot of its layer used longest ago
(llama.cpp PR #27861's expert cache: N slots per layer, least recently used out)."""

from __future__ import annotations

from solvers.cache.kernels import LRU_SCORE
from solvers.cache.partition import PartitionedCache


class LRU(PartitionedCache):
    """Least recently used within each layer's slots."""

    name = "lru"
    score = LRU_SCORE
