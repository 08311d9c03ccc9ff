"""The copy stream a plan's card gives a prefetch: one `solvers.cache.prefetch.Link`.

A copy takes the card's latency plus the largest cold expert's bytes over its host link; a
layer's window is one decoder layer's share of the plan's base decode step at batch 1 (the
previous layer's experts and this layer's attention, roughly one layer's compute): a model,
not a measurement. One model (placer.plan.prefetch.prefetch_link) for `placer solve`'s
prefetch decision, `placer evaluate`'s prefetch lines (placer/predict/prefetch.py) and the
runtime's clock (placer/runtime/prefetch.py).
"""

from __future__ import annotations

from placer.plan.placement import Plan
from placer.plan.prefetch import prefetch_link
from solvers.cache.prefetch import Link


def plan_link(plan: Plan, card: int = 0) -> Link:
    """The Link of card `card` of `plan` (see module docstring): placer.plan.prefetch's
    model, which `placer solve` decides prefetch with, for the plan's cold experts."""
    pinned = plan.matrix("resident_pages") > 0
    return prefetch_link(plan.hardware, int(plan.matrix("bytes")[~pinned].max(initial=0)),
                         int(plan.model.get("num_layers") or len(plan.moe_layers)), card)
