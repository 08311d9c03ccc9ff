"""A plan's expert VRAM: what the placement and every baseline judged beside it may hold.

One rule (solvers/staging.py): a card's budget is its capacity for expert bytes held in VRAM
(pinned pages and cache slots) plus its staging buffer, the reserve for the largest
concurrency the plan was solved for (none under cpu execution, which stages nothing).
`placer solve`, `placer evaluate` and `placer export llamacpp` all take the baselines at
this capacity, so a ratio to layer offload never hands the placement more expert VRAM than
its baseline, and the layer offload export prints is the one evaluate judges.
"""

from __future__ import annotations

import numpy as np

from placer.plan.placement import Plan
from solvers.static.baselines import cold_layer_count


def expert_capacity(plan: Plan, execution: str | None = None) -> np.ndarray:
    """[C] bytes of experts each card may hold in VRAM under `execution` (default: the
    plan's): its budget less its staging buffer, i.e. exactly what its pinned pages and cache
    slots may take (capacity_bytes + cache_slots x slot_bytes); under cpu execution, which
    stages nothing, the whole budget."""
    budget = np.array([c.budget_bytes for c in plan.cards], dtype=np.int64)
    if (execution or plan.execution) == "cpu":
        return budget
    return budget - np.array([c.staging_bytes for c in plan.cards], dtype=np.int64)


def layer_offload_cold(plan: Plan, execution: str | None = None) -> int:
    """N: the leading MoE layers the plan's layer-offload baseline leaves cold, at
    expert_capacity (what `placer evaluate` replays as layer offload)."""
    return cold_layer_count(plan.matrix("bytes"), plan.matrix("card"),
                            expert_capacity(plan, execution))
