"""A plan's expert VRAM: what the placement and every baseline judged beside it may hold.

One rule (solvers/staging.py): a card's budget is its capacity for expert bytes held in VRAM
(pinned pages and cache slots) plus the staging reserve for the largest concurrency the plan
was solved for (none under cpu execution, which stages nothing). `placer solve`, `placer
evaluate` and `placer export llamacpp` all take the baselines at this capacity, so a ratio to
layer offload never hands the placement more expert VRAM than its baseline, and the layer
offload export prints is the one evaluate judges.
"""

from __future__ import annotations

import numpy as np

from placer.plan.placement import Plan
from solvers.static.baselines import cold_layer_count
from solvers.staging import staging_bytes


def expert_capacity(plan: Plan, execution: str | None = None) -> np.ndarray:
    """[C] bytes of experts each card may hold in VRAM under `execution` (default: the
    plan's): its budget less the staging reserve of a fetch at the plan's largest
    concurrency, recomputed from the homes (a plan written before the reserve was kept whole
    recorded a smaller staging_bytes)."""
    budget = np.array([c.budget_bytes for c in plan.cards], dtype=np.int64)
    if (execution or plan.execution) == "cpu":
        return budget
    return budget - staging_bytes(plan.matrix("bytes"), plan.matrix("card"), len(plan.cards),
                                  max(plan.budget.get("concurrency") or [1]),
                                  int(plan.model["top_k"]))


def layer_offload_cold(plan: Plan, execution: str | None = None) -> int:
    """N: the leading MoE layers the plan's layer-offload baseline leaves cold, at
    expert_capacity (what `placer evaluate` replays as layer offload)."""
    return cold_layer_count(plan.matrix("bytes"), plan.matrix("card"),
                            expert_capacity(plan, execution))
