"""Caches of staged experts: the policies the runtime runs and the replay that predicts them.

One class per policy (`POLICIES`: one per row of solvers/cache_table.py, in its order, where
the names live), each a compiled `fetch` over per-card state
(`solvers.cache.policy`), used both by the runtime (`placer.runtime.staging`) and by the
replay (`solvers.cache.replay`); Belady's offline-optimal replacement (`solvers.cache.belady`)
bounds what any of them could do with the same slots. llama.cpp's own `--moe-cache-mib` cache
(`solvers.llamacpp.lru`) is not one of these per-card, per-layer policies: it keeps one LRU
per group of layers and has its own replay, which `placer solve --engine llamacpp` and
`placer evaluate` of such a plan run.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from solvers.cache.classlru import ClassLRU
from solvers.cache.learned import Learned
from solvers.cache.lfru import LFRU
from solvers.cache.lfuda import LFUDA
from solvers.cache.lru import LRU
from solvers.cache.policy import CachePolicy, Lookup
from solvers.cache.replay import StagingCounts, cache_hits, staging_counts
from solvers.cache_table import DEFAULT_POLICY, POLICY_TABLE, policy_row

_CLASSES = {p.name: p for p in (ClassLRU, Learned, LFRU, LFUDA, LRU)}
POLICIES: dict[str, type[CachePolicy]] = {row.name: _CLASSES[row.name] for row in POLICY_TABLE}

__all__ = ["POLICIES", "DEFAULT_POLICY", "CachePolicy", "Lookup", "StagingCounts", "cache_hits",
           "even_quotas", "make_policy", "simulate", "staging_counts"]


def make_policy(name: str, quotas: np.ndarray, num_keys: int, *, pooled: bool = False,
                **options: Any) -> CachePolicy:
    """A fresh `name` cache on every card, quotas[c, l] slots for layer l of card c (pooled:
    their sum, one pool per card that every layer shares: solvers/cache/partition.py);
    `options` are the policy's own (learned's weights and calibration frequencies)."""
    return POLICIES[policy_row(name).name](quotas, num_keys, pooled=pooled, **options)


def even_quotas(slots: Sequence[int], num_layers: int) -> np.ndarray:
    """[C, L] slots[c] slots of card c split over its layers as evenly as can be (the first
    layers take one more)."""
    slots = np.asarray(slots, dtype=np.int64)
    quotas = np.repeat(slots[:, None] // num_layers, num_layers, axis=1)
    quotas += np.arange(num_layers)[None, :] < (slots % num_layers)[:, None]
    return quotas


def simulate(selected: np.ndarray, cold_bytes: np.ndarray, home: np.ndarray, num_cards: int,
             slots: int | Sequence[int], policy: str = DEFAULT_POLICY, *,
             pooled: bool = False, **options: Any) -> StagingCounts:
    """What the runtime stages for `selected` ([S, L, E] bool, in order, one token per step)
    with `slots` cache slots per card (one count for all cards, or one per card), split
    evenly over the layers (pooled: one pool per card), under `policy` (and its `options`)."""
    selected = np.asarray(selected, dtype=bool)
    per_card = [slots] * num_cards if isinstance(slots, int | np.integer) else list(slots)
    quotas = even_quotas(per_card, selected.shape[1])
    cache = make_policy(policy, quotas, selected.shape[1] * selected.shape[2], pooled=pooled,
                        **options)
    hits = cache_hits(cache, selected, cold_bytes, home)
    return staging_counts(selected, hits, cold_bytes, home, num_cards)
