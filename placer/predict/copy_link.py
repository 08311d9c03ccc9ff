"""The copy stream a plan's card gives a prefetch: one `solvers.cache.prefetch.Link`.

A copy takes the card's latency plus the largest cold expert's bytes over its host link; a
layer's window is one decoder layer's share of the plan's base decode step at batch 1 (the
previous layer's experts and this layer's attention, roughly one layer's compute): a model,
not a measurement. The same figures as `placer evaluate`'s prefetch lines
(placer/predict/prefetch.py), for the runtime's clock (placer/runtime/prefetch.py).
"""

from __future__ import annotations

from placer.plan.placement import Plan
from solvers.cache.prefetch import Link


def plan_link(plan: Plan, card: int = 0) -> Link:
    """The Link of card `card` of `plan` (see module docstring)."""
    pinned = plan.matrix("resident_pages") > 0
    expert_bytes = int(plan.matrix("bytes")[~pinned].max(initial=0))
    spec = plan.hardware.cards[card]
    return Link(copy_s=spec.latency_s + expert_bytes / spec.h2d_bandwidth,
                window_s=plan.hardware.base_step_s(1) / int(
                    plan.model.get("num_layers") or len(plan.moe_layers)),
                expert_bytes=expert_bytes)
