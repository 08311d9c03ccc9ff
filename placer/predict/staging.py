"""What the runtime loaded from a plan stages for given selections: the plan's cold bytes and
homes fed to the cache replay the runtime itself runs (`solvers.cache`)."""

from __future__ import annotations

import numpy as np

from placer.plan.placement import Plan
from solvers.cache import StagingCounts, simulate_lru


def plan_cold_bytes(plan: Plan) -> np.ndarray:
    """[L, E] bytes of each expert a plan leaves cold (its non-resident suffix of pages)."""
    return plan.matrix("bytes") - plan.matrix("resident_bytes")


def expected_staging(plan: Plan, selected: np.ndarray, cache_slots: int = 0) -> StagingCounts:
    """What the runtime loaded from `plan` stages for `selected` ([S, L, E] bool)."""
    return simulate_lru(selected, plan_cold_bytes(plan), plan.matrix("card"), len(plan.cards),
                        cache_slots)
