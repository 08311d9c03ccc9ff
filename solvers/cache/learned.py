"""A learned eviction score: a miss evicts the slot whose key scores lowest under a linear
score over features the runtime keeps cheaply per (card, key), across evictions.

The features, in the order of the weights (`solvers.cache.kernels.FEATURES`), of a cached key
v at token time t (the token clock of solvers/cache/kernels.py: tokens served, this step's
included):

- age: t - the token time of v's last use (0 if never used);
- decayed_4, decayed_16, decayed_64: log2(d + 1/64) (`DECAY_FLOOR`), d = v's uses, each
  weighted 2^(-(t - its time) / h) for the half-lives h = 4, 16 and 64 tokens (a use: v in a
  fetch, a hit or a miss, once per step);
- calibration: v's calibration frequency, given per key (the plan's: log2(share + 1/1024));
- transition: log2(m + 1/64), m = the mean over the fetch's keys k of T[l, k, v], the
  probability (on the calibration, the plan's `transition`) that v is selected at the step
  after one that selected k, layer l's; a candidate of another layer (pooled) takes its share
  for m (2^calibration - 1/1024), and without T every T[l, k, v] is v's share;
- bias: 1.

score = weights[layer of v] . features: one set of weights for every layer ([7]) or one per
MoE layer row ([L, 7]); the victim is the slot of lowest score among those no key of this
fetch holds (ties: the lowest key). Weights (-1, 0, 0, 0, 0, 0, 0) are an LRU on the token
clock.
The weights are fitted offline on the calibration folds (to pick Belady's victims, or to
replay fewer misses) and shipped in the plan and the manifest (`cache_params`), which the
runtime's kernel reads. docs/benchmarks.md ("How much of that gap an online policy could still
close") measured the research version of this score.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from solvers.cache.kernels import FEATURES, LEARNED_SCORE, SHARE_FLOOR
from solvers.cache.partition import PartitionedCache


class Learned(PartitionedCache):
    """A linear score over age, decayed selection counts and calibration frequency (weights
    shared by every layer, or one set per layer)."""

    name = "learned"
    score = LEARNED_SCORE
    keeps = 3  # the decayed counts of each key

    def __init__(self, quotas: np.ndarray, num_keys: int, *, pooled: bool = False,
                 weights: Sequence[float] | None = None,
                 calibration: np.ndarray | None = None,
                 transition: np.ndarray | None = None) -> None:
        if weights is None or calibration is None:
            raise ValueError("the learned cache policy needs its weights and the calibration "
                             "frequency of each key (fitted with the plan)")
        self.weights = np.array(weights, dtype=np.float64)
        layers = np.shape(quotas)[-1] if np.ndim(quotas) else 1
        if self.weights.shape not in ((len(FEATURES),), (layers, len(FEATURES))) \
                or not np.isfinite(self.weights).all():
            raise ValueError(f"learned weights must be {len(FEATURES)} finite numbers "
                             f"({', '.join(FEATURES)}), or {layers} rows of them (one per "
                             f"layer), got {weights!r}")
        self.frequencies = np.array(calibration, dtype=np.float64).ravel()
        if self.frequencies.shape != (num_keys,) or not np.isfinite(self.frequencies).all():
            raise ValueError(f"learned calibration frequencies must be {num_keys} finite "
                             f"numbers, one per key, got shape {np.shape(calibration)}")
        shape = (layers, num_keys // layers, num_keys // layers)
        if transition is None and not self.weights[..., FEATURES.index("transition")].any():
            self.transition = None  # no layer reads it
        else:
            self.transition = shares(self.frequencies, layers) if transition is None \
                else np.array(transition, dtype=np.float64)
        if self.transition is not None and (self.transition.shape != shape
                                            or not np.isfinite(self.transition).all()):
            raise ValueError(f"learned transition probabilities must be {list(shape)} finite "
                             f"numbers, got shape {np.shape(transition)}")
        super().__init__(quotas, num_keys, pooled=pooled)

    def params(self) -> np.ndarray:
        """[L * 7] each layer row's weights in turn (shared weights repeated)."""
        layers = self.quotas.shape[1]
        return np.ascontiguousarray(np.broadcast_to(self.weights, (layers, len(FEATURES)))
                                    ).ravel()

    def calibration(self) -> np.ndarray:
        """[K + L * E * E] each key's calibration feature, then T flat ([K] without T)."""
        if self.transition is None:
            return self.frequencies
        return np.concatenate([self.frequencies, self.transition.ravel()])


def shares(calibration: np.ndarray, layers: int) -> np.ndarray:
    """[L, E, E] the transition of no information: each row the keys' shares (from their
    calibration feature, log2(share + SHARE_FLOOR))."""
    share = np.exp2(np.ravel(calibration)) - SHARE_FLOOR
    experts = len(share) // layers
    return np.broadcast_to(share.reshape(layers, 1, experts), (layers, experts, experts)).copy()
