"""`placer evaluate`'s prefetch section: the plan's cache replayed with and without prefetching
from the held-out traffic's speculative routing (solvers/cache/prefetch.py).

For a trace directory whose files record `spec_experts` (traces.storing.schema) and a plan
that stages cold experts into cache slots on one card: every decode token once (batch 1), in
sequence order, through the plan's pinned experts and its slots (per MoE layer, or pooled as
the plan runs them), four lines: LRU and Belady's MIN eviction, each without and with
prefetch; and the predictor's recall and precision per MoE layer. A copy takes the card's
latency plus the largest cold expert's bytes over its host link; a layer's window is one
decoder layer's share of the plan's base decode step at batch 1 (the previous layer's
experts and this layer's attention, roughly one layer's compute): a model, not a
measurement, and the one `placer solve` decides prefetch with (placer/predict/copy_link.py).
The prefetch lines run with the plan's prefetch parameters where it records them. The lines
replay with LRU, not the plan's own policy, so they set prefetch beside no prefetch under one
policy (a plan with prefetch on serves LRU); the main table's lines stay the plan's.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from placer.plan.placement import Plan, plan_quotas
from placer.plan.prefetch import plan_prefetch
from placer.predict.copy_link import plan_link
from solvers.cache.prefetch import Prefetch, quality, replay
from traces.storing.speculative import has_speculative_dir, speculative_steps

LINES = (("lru", "lru", False), ("lru+prefetch", "lru", True),
         ("belady", "min", False), ("belady+prefetch", "min", True))


def why_not(plan: Plan, quotas: np.ndarray) -> str | None:
    """Why the prefetch section is left out for this plan (None: it is not)."""
    if plan.engine is not None or plan.execution != "stage":
        return "the plan does not stage cold experts into cache slots"
    if len(plan.cards) != 1:
        return "the prefetch replay models one card's copy stream; this plan has several"
    if plan.page_size is not None:
        return "the plan keeps experts partly resident (pages); the replay copies whole experts"
    if not quotas.any():
        return "the plan has no cache slots"
    return None


def prefetch_section(plan: Plan, trace_dir: Path, cache_slots: int | None = None
                     ) -> tuple[dict | None, str | None]:
    """(the section, None), or (None, a note saying why there is none) for a trace dir
    that records speculative routing, or (None, None) for one that does not. The prefetch
    lines run with the plan's prefetch parameters (its `prefetch`, on or off), or where it
    has none (a plan written before them) solvers/cache/prefetch.py's defaults."""
    if not has_speculative_dir(trace_dir):
        return None, None
    quotas = plan_quotas(plan, cache_slots)
    reason = why_not(plan, quotas)
    if reason is not None:
        return None, f"{trace_dir}: no prefetch lines: {reason}"
    actual, predicted = speculative_steps(trace_dir)
    pinned = plan.matrix("resident_pages") > 0
    link = plan_link(plan)
    prefetch = plan_prefetch(plan.prefetch) or Prefetch()
    pooled = bool((plan.cache_params or {}).get("pooled", False))
    slots = int(quotas[0].sum()) if pooled else quotas[0]
    lines = {}
    for name, eviction, on in LINES:
        counts = replay(actual, predicted if on else None, slots, link, prefetch,
                        pinned=pinned, eviction=eviction)
        lines[name] = {**vars(counts), "stall_ms_per_token": counts.stall_s * 1e3 / len(actual)}
    q = quality(actual, predicted)
    return {"traces": str(trace_dir), "tokens": len(actual), "pooled": pooled,
            "copy_ms": link.copy_s * 1e3, "window_ms": float(link.window_s) * 1e3,
            "params": vars(prefetch), "plan_prefetch": None if plan.prefetch is None
            else {"on": plan.prefetch["on"], "reason": plan.prefetch["reason"]},
            "lines": lines,
            "recall": _per_layer(plan, q.recall()), "precision": _per_layer(plan, q.precision()),
            "interval": "95% Wilson over selections taken as independent (optimistic); the "
                        "lines are exact replays of this traffic, without an interval"}, None


def _per_layer(plan: Plan, figures: list) -> list[dict]:
    return [{"layer": layer, **({"share": None} if f is None else
                                {"share": f[0], "ci95": [f[1], f[2]]})}
            for layer, f in zip(plan.moe_layers, figures, strict=True)]
