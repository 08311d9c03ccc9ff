"""The plan's `prefetch`: whether placer's runtime copies the next MoE layer's predicted experts
into the cache slots ahead of time, with what parameters, and why (issue #54, "solved for").

`placer solve` decides it after the cache split (placer.plan.cache) where the calibration
traces record speculative routing (`spec_experts`, traces/storing/speculative.py) and the
plan stages cold experts into cache slots on one card: every split candidate with slots is
replayed without and with prefetch at each slot share of solvers/cache/prefetch_choice.py's
grid, and the best with prefetch is set beside the best without (the chosen split under its
own policy, or a candidate under LRU; solvers/cache/prefetch_choice.py says the rule). Where
prefetch pays, the plan takes that candidate's pins and slots, and its caches serve LRU per
layer: the eviction the prefetch replay models, so the predicted stall is the one it runs.
Otherwise prefetch is off and the plan says why. The replays walk the first decode tokens of
each calibration set (in sequence order, one token a step: batch 1), as many as
prefetch_choice.WORK selections over all of them allow (about 20 s); the plan says how many.

The copy stream's figures (`prefetch_link`) are the one model evaluate's prefetch section
uses too: a copy is the card's latency plus an expert's bytes over its host link; a layer's
window is one decoder layer's share of the base decode step at batch 1.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from placer.checkpoint.inventory import Inventory
from placer.hardware.spec import HardwareSpec
from placer.plan.cache import cache_params
from placer.plan.options import SolveOptions
from placer.plan.traffic import Traffic
from solvers.cache.prefetch import Link, Prefetch
from solvers.cache.prefetch_choice import (
    WORK,
    Candidate,
    PrefetchChoice,
    Serving,
    choose_prefetch,
)
from solvers.cache.split import Split
from solvers.cache_table import policy_row
from solvers.staging import slot_unit
from traces.storing.speculative import has_speculative_dir, speculative_steps

EVICTION = "lru"  # the eviction solvers/cache/prefetch.py replays prefetch under


def prefetch_link(spec: HardwareSpec, expert_bytes: int, num_layers: int, card: int = 0
                  ) -> Link:
    """The copy stream of the spec's card `card` for experts of `expert_bytes`, a layer's
    window one of `num_layers` decoder layers' share of the base step at batch 1: a model
    from the spec, not a measurement (a plan's: placer.predict.copy_link.plan_link)."""
    link = spec.cards[card]
    return Link(copy_s=link.latency_s + expert_bytes / link.h2d_bandwidth,
                window_s=spec.base_step_s(1) / num_layers, expert_bytes=expert_bytes)


def off(reason: str, prefetch: Prefetch = Prefetch()) -> dict:
    """The plan's prefetch, off for `reason`, with the parameters it would run with."""
    return {"on": False, "reason": reason, **params_json(prefetch), "eviction": EVICTION,
            "predicted": None}


def params_json(prefetch: Prefetch) -> dict:
    return {"depth": prefetch.depth, "max_per_layer": prefetch.max_per_layer,
            "slot_share": prefetch.slot_share}


def plan_prefetch(section: dict | None) -> Prefetch | None:
    """The parameters a plan's `prefetch` records (None: the plan has none, an older plan)."""
    if not section:
        return None
    return Prefetch(section["depth"], section["max_per_layer"], section["slot_share"])


def why_not(spec: HardwareSpec, traffic: list[Traffic]) -> str | None:
    """Why a staged, cached solve does not weigh prefetch (None: it does)."""
    if len(spec.cards) != 1:
        return "the prefetch replay models one card's copy stream; this spec has several"
    if not traffic or not all(t.path is not None and has_speculative_dir(t.path)
                              for t in traffic):
        return ("the calibration traces record no speculative routing (spec_experts: "
                "`placer collect --model` records it), so there is no predictor to replay")
    return None


def solve_prefetch(inv: Inventory, spec: HardwareSpec, home: np.ndarray,
                   traffic: list[Traffic], split: Split, info: dict, opts: SolveOptions
                   ) -> tuple[Split, dict]:
    """(the split the plan serves, the plan's `prefetch`); `info` (the plan's `cache`) is
    updated where prefetch changes the candidate or the policy."""
    reason = why_not(spec, traffic)
    if reason is not None:
        return split, off(reason)
    steps = [speculative_steps(t.path) for t in traffic]
    unit = int(slot_unit(inv.expert_bytes(), home, 1)[0])
    link = prefetch_link(spec, unit, int(inv.num_layers or len(inv.moe_layers)))
    chosen = next(i for i, c in enumerate(split.candidates) if c["chosen"])
    candidates = [Candidate(c["name"], f.pinned, f.quotas[0])
                  for c, f in zip(split.candidates, split.layouts, strict=True)]
    choice = choose_prefetch(steps, candidates, chosen, link, serving_of(split, info))
    section = {"on": choice.on, "reason": choice.reason, **params_json(choice.prefetch),
               "eviction": EVICTION,
               "predicted": predicted_json(choice, candidates, link, steps, opts)}
    if not choice.on:
        return split, section
    return served(split, info, choice, candidates), section


def serving_of(split: Split, info: dict) -> Serving:
    """The policy the split's caches serve without prefetch, its parameters included (as
    placer.plan.placement.plan_policy reads them from the plan)."""
    params = cache_params(split) or {}
    options = {"pooled": bool(info.get("pooled", False))}
    if policy_row(info["policy"]).fitted:
        options |= {k: params.get(k) for k in ("weights", "calibration", "transition")}
    return Serving(info["policy"], options)


def served(split: Split, info: dict, choice: PrefetchChoice, candidates: list[Candidate]
           ) -> Split:
    """The split with prefetch on: the chosen candidate's pins and slots, served by LRU per
    layer (no fitted parameters); `info` says so."""
    layout = split.layouts[choice.candidate]
    name = candidates[choice.candidate].name
    before = f"{info['policy']} {'pooled' if info.get('pooled') else 'per layer'}"
    info["notes"] = [*info.get("notes", []),
                     f"prefetch is on: the caches serve {EVICTION} per layer (the eviction "
                     f"the prefetch replay models) on {name}'s pins and slots, in place of "
                     f"{before} on {info['chosen']}'s; the held-out figures were judged "
                     "without prefetch, under the policy that priced the split"]
    info |= {"policy": EVICTION, "pooled": False, "chosen": name,
             "held_out_stall_ms_per_step": info["candidates"][choice.candidate][
                 "held_out_stall_ms_per_step"]}
    for i, c in enumerate(info.get("candidates", [])):
        c["chosen"] = i == choice.candidate
    return replace(split, pinned=layout.pinned, quotas=layout.quotas, staging=layout.staging,
                   kind=split.candidates[choice.candidate]["kind"], policy=None)


def predicted_json(choice: PrefetchChoice, candidates: list[Candidate], link: Link,
                   steps: list, opts: SolveOptions) -> dict:
    """What the decision replayed and found, stalls in ms per token."""
    others = ("" if opts.concurrency == (1,) else
              "; the other --concurrency values are not modelled with prefetch")
    return {"tokens": choice.tokens, "of_tokens": sum(len(a) for a, _ in steps),
            "judged": "in sample: the first decode tokens of each calibration trace set in "
                      f"sequence order (the replays walk at most {WORK:.0e} selections in "
                      f"all), one token a step (batch 1{others})",
            "copy_ms": link.copy_s * 1e3, "window_ms": float(link.window_s) * 1e3,
            "recall": choice.recall,
            "without_ms_per_token": choice.without_s * 1e3,
            "best_without_ms_per_token": choice.best_without_s * 1e3,
            "with_ms_per_token": None if choice.with_s is None else choice.with_s * 1e3,
            "rows": [{"candidate": candidates[r.candidate].name, "slot_share": r.slot_share,
                      "stall_ms_per_token": r.stall_s * 1e3, "prefetched": r.counts.prefetched,
                      "useful": r.counts.useful, "late": r.counts.late,
                      "wasted": r.counts.wasted, "misses": r.counts.misses}
                     for r in choice.rows]}
