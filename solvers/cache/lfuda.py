"""LFU with dynamic aging, per layer, as BigRig ships it: counts capped, halved on eviction and
kept, the layer's age raised to each victim's priority.

BigRig 0.9.1 (PyPI `bigrig`, Apache-2.0), `bigrig_engine/policies/lfuda.py` (class LFUDA, its
shipped defaults: keep_ghost=True, ghost_decay=0.5, fcap=12, rank_weight=0) over
`bigrig_engine/pool.py`'s per-layer pool (admit, touch, victim, evicted). Its rules, as this
kernel applies them to each partition (one per layer; one per card where pooled):

- every expert key has a count, kept when the expert is evicted: each use adds 1, capped at
  `cap` (12);
- a cached expert's priority is the partition's age L at its last use plus its count then,
  re-anchored at every use;
- the victim is the slot of lowest priority (ties: the least recently used) that no key of
  this fetch holds (BigRig's `victim(exclude=...)`); L rises to the victim's priority (never
  falls), and the victim's kept count is multiplied by `decay` (0.5).

Where placer's fetch differs from BigRig's engine step: a miss that finds no victim (every
slot holds a key of this fetch) is staged, not cached, and its use still counts; BigRig's
rank-weighted credit is off by default and not modelled (a fetch carries no router ranks).
"""

from __future__ import annotations

import numpy as np

from solvers.cache.kernels import LFUDA_SCORE
from solvers.cache.partition import PartitionedCache


class LFUDA(PartitionedCache):
    """Capped counts kept across eviction, aged by the priority of the last victim."""

    name = "lfuda"
    score = LFUDA_SCORE
    keeps = 1  # the count of each key
    cap = 12.0   # BigRig's fcap
    decay = 0.5  # BigRig's ghost_decay

    def params(self) -> np.ndarray:
        return np.array([self.cap, self.decay])
