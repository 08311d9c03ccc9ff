"""Least frequently-recently used, per layer: a miss evicts the slot of its layer with the
lowest freq / (clock - last + 1), hits since admission over the accesses since the last one.

The score of vLLM PR #37190 (a frequency-weighted LRU over each layer's hottest experts; the
score as its reference implementation, tinyserve `src/cache_policy.py` LFRUPolicy, computes
it). Its frequency term keeps a layer's steadily popular experts like a soft static set, its
recency term follows decode's bursts: on ESFT's task text it keeps 88.8% of intent's
selections where an LRU of the same slots keeps 83.5% (benchmarks/bench_routing.py).
"""

from __future__ import annotations

from solvers.cache.kernels import LFRU_SCORE
from solvers.cache.partition import PartitionedCache


class LFRU(PartitionedCache):
    """Frequency over recency within each layer's slots."""

    name = "lfru"
    score = LFRU_SCORE
