"""What the runtime loaded from a plan stages for given selections: the plan's cold bytes,
homes and caches fed to the replay of the runtime's own cache class (`solvers.cache`)."""

from __future__ import annotations

import numpy as np

from placer.plan.placement import Plan, plan_caches
from solvers.cache import StagingCounts, cache_hits, staging_counts


def plan_cold_bytes(plan: Plan) -> np.ndarray:
    """[L, E] bytes of each expert a plan leaves cold (its non-resident suffix of pages)."""
    return plan.matrix("bytes") - plan.matrix("resident_bytes")


def expected_staging(plan: Plan, selected: np.ndarray, cache_slots: int | None = None,
                     tokens: int | np.ndarray = 1) -> StagingCounts:
    """What the runtime loaded from `plan` stages for `selected` ([S, L, E] bool, in the
    order served; `tokens` in each step, one count or [S]: the token clock), with the plan's
    caches (or `cache_slots` on every card, as `placer run --cache-slots` has)."""
    cold, home = plan_cold_bytes(plan), plan.matrix("card")
    hits = cache_hits(plan_caches(plan, cache_slots), selected, cold, home, tokens)
    return staging_counts(selected, hits, cold, home, len(plan.cards))
