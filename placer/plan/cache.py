"""The bridge from a solve's traffic, budget and cards to the cache split (`solvers.cache.split`).

`placer solve --cache auto` (the default) splits each card's budget between pinned experts
and per-layer cache slots, judged on held-out folds of the calibration sequences, and with
`--cache-policy auto` (the default) chooses on the same folds the policy that serves it
(solvers/cache/choice.py: each policy of solvers/cache_table.py that auto tries, per layer or
pooled; the learned weights fitted on the calibration folds go in the plan's `cache_params`),
guarded by the same folds renamed: the pick serves only where it stalls no more than the
better of the engines' lru and lfuda per layer over the plain cache there beyond the interval
and, unless it is one of them, is 5% below them on its own folds and at most 1.05x them at
the interval's top (else that engine serves, on the plain cache's pins and slots;
`cache.guard` says so).
`--cache-policy NAME` serves the split with NAME per layer, the split priced under it, but
a fitted policy (learned) cannot price a split before its weights are fitted to one: the
split is priced under the default, as auto's is, and the policy fitted to it and judged on
the same folds, per layer and pooled (the better serves; no guard: it was asked for).
`--cache N` gives every card N slots (spread over its layers) and pins the rest;
`--cache 0` is a static placement (`--solver`). Where a cache cannot be predicted, auto
falls back to a static placement and says why (`no_cache_reason`), and N is refused.

Under `--robust` every scenario also has a twin of traffic unlike it: its held-out folds with
each layer's experts renamed (solvers.cache.costs.unlike), which reuse experts as the
calibration does but prefer none of the same ones. The mean regret over both is minimized,
so the split holds up where the serving traffic's experts are not the calibration's (an
unseen task): the held-out folds of one trace set cannot show that, however they are cut.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from placer.checkpoint.inventory import Inventory
from placer.errors import PlacerError
from placer.hardware.spec import HardwareSpec
from placer.plan.options import SolveOptions
from placer.plan.traffic import Traffic, fold_ids, traffic_steps
from solvers.cache.choice import CHOICES
from solvers.cache.costs import unlike
from solvers.cache.replay import Requests
from solvers.cache.split import (
    RENAMED_KEYS,
    Scenario,
    Split,
    SplitProblem,
    replay_count,
    solve_split,
)
from solvers.cache_table import DEFAULT_POLICY, policy_row
from solvers.staging import fetch_limit, slot_unit
from traces.errors import TraceError
from traces.storing.profile import batched_steps


def no_cache_reason(inv: Inventory, opts: SolveOptions, home: np.ndarray,
                    traffic: list[Traffic]) -> str | None:
    """Why this solve cannot have a cache (None when it can)."""
    if opts.execution == "cpu":
        return ("under --execution cpu the host computes cold experts and nothing is staged, "
                "so there is no staged expert to keep; KTransformers' dynamic update "
                "(promoting hot experts to the GPU at run time) is not modelled")
    if opts.solver in ("layer", "uniform"):
        return f"--solver {opts.solver} is a fixed baseline, placed without a cache"
    if opts.page_size is not None:
        return "--page-size keeps experts partly resident; a cache slot holds whole experts"
    if opts.num_steps is not None or not traffic or any(
            t.profile is None or not t.profile.per_token for t in traffic):
        return ("a cache needs the calibration tokens in the order served: imported counts "
                "and --steps samples have no order")
    sizes = inv.expert_bytes()
    if any(len(np.unique(sizes[home == c])) > 1 for c in range(int(home.max()) + 1)):
        return "a card homes experts of different sizes; a cache slot is one expert's size"
    return None


def check_cache_options(opts: SolveOptions, reason: str | None) -> None:
    """Refuse --cache N where no cache can be predicted; --cache-policy must be known."""
    if opts.cache is not None and opts.cache > 0 and reason is not None:
        raise PlacerError(f"--cache {opts.cache}: {reason}")


def solve_cache(inv: Inventory, spec: HardwareSpec, home: np.ndarray, budget: np.ndarray,
                traffic: list[Traffic], opts: SolveOptions,
                progress: Callable[[str], None] = lambda stage: None) -> tuple[Split, dict]:
    """The split of every card's budget, and what the plan records of it (`plan.cache`);
    `progress(stage)` is told each replay as it is done ("split: replays i/N")."""
    began = time.perf_counter()
    num_cards = len(spec.cards)
    unit = slot_unit(inv.expert_bytes(), home, num_cards)
    problem = SplitProblem(
        home=home,
        miss_s=np.array([c.latency_s + unit[i] / c.h2d_bandwidth
                         for i, c in enumerate(spec.cards)]),
        units=np.asarray(budget, dtype=np.int64) // np.maximum(unit, 1),
        fetch_limit=fetch_limit(home, num_cards, max(opts.concurrency), inv.top_k),
        **policy_of(opts.cache_policy))
    scenarios, folds, notes = scenarios_of(traffic, opts, inv.experts_per_layer)
    if opts.robust:
        scenarios = unlike(scenarios, home, opts.seed)
    total = replay_count(problem, scenarios, opts.cache)
    try:
        done = iter(range(1, total + 1))
        split = solve_split(problem, scenarios, opts.cache, opts.robust,
                            lambda: progress(f"split: replays {next(done, total)}/{total}"),
                            opts.seed)
    except ValueError as exc:
        raise PlacerError(f"--cache {opts.cache}: {exc}") from None
    several = len(traffic) > 1
    if split.unlike_stall_s is None and not opts.robust and opts.cache is None:
        notes.append("the split was not judged on renamed folds (traffic unlike the "
                     f"calibration): that replays over {RENAMED_KEYS:.0e} requests here; "
                     "--robust judges every candidate so")
    info = {"mode": "auto" if opts.cache is None else "fixed",
            **policy_json(split, problem, opts.cache_policy),
            "folds": folds, "held_out": "each --traces set against the others" if several
            else "folds over the calibration sequences" if folds else "in sample",
            "chosen": next(c["name"] for c in split.candidates if c["chosen"]),
            "slots": [int(n) for n in split.quotas.sum(axis=1)],
            "pinned": [int((split.pinned & (home == c)).sum()) for c in range(num_cards)],
            "held_out_stall_ms_per_step": split.stall_s * 1e3,
            "held_out_regret": split.objective if opts.robust else None,
            "held_out_unlike_stall_ms_per_step": None if split.unlike_stall_s is None
            else split.unlike_stall_s * 1e3,
            "candidates": [candidate_json(c, opts.robust) for c in split.candidates],
            "replays": total, "seconds": time.perf_counter() - began, "notes": notes}
    return split, info


def policy_of(asked: str) -> dict:
    """SplitProblem's `policy` (what prices the split) and `choose` (the policies judged on
    its held-out folds, the better serving) for `--cache-policy asked`: auto, DEFAULT_POLICY
    and every policy auto tries; a fitted policy, DEFAULT_POLICY and that policy (its weights
    are fitted to the split); any other, that policy and none."""
    if asked == "auto":
        return {"policy": DEFAULT_POLICY, "choose": CHOICES}
    if policy_row(asked).fitted:
        return {"policy": DEFAULT_POLICY, "choose": (asked,)}
    return {"policy": asked, "choose": ()}


def policy_json(split: Split, problem: SplitProblem, asked: str) -> dict:
    """What the plan records of the policy (`--cache-policy asked`): its name, whether pooled,
    and where policies were judged (auto, or a fitted policy's per layer and pooled) every
    row's held-out figures (ms/step; `plan`: the split's pins and slots or the plain
    cache's), the share of each fold judged and the guard's finding (`guard`: the chosen row's
    renamed stall over the better engine cache's, with its interval, the tests that fired
    and whether that changed the choice; solvers/cache/choice.py)."""
    choice = split.policy
    if choice is None:
        return {"policy": problem.policy if asked == "auto" else asked, "pooled": False,
                "policy_choice": "none (no cache slots)" if asked == "auto" else "forced",
                "policies": []}
    return {"policy": choice.name, "pooled": choice.pooled,
            "policy_choice": "auto" if asked == "auto" else "forced",
            "policy_judged_share": choice.judged, "guard": choice.guard,
            "policies": [{"plan": r["plan"], "policy": r["policy"], "pooled": r["pooled"],
                          "held_out_stall_ms_per_step": r["stall_s"] * 1e3,
                          "held_out_objective": r["objective"],
                          "held_out_unlike_stall_ms_per_step": None
                          if r["unlike_stall_s"] is None else r["unlike_stall_s"] * 1e3,
                          "chosen": r["chosen"]} for r in choice.rows]}


def cache_params(split: Split) -> dict | None:
    """The plan's `cache_params`: pooled, and the learned policy's weights ([L][7], each
    layer's), calibration feature ([L][E]) and transition ([L][E][E], or None beyond
    solvers/cache/learn.py's TRANSITION_KEYS); None for a per-layer cache of a policy
    without parameters."""
    choice = split.policy
    learned = choice is not None and policy_row(choice.name).fitted
    if choice is None or (not choice.pooled and not learned):
        return None
    return {"pooled": choice.pooled,
            "weights": np.asarray(choice.weights, dtype=float).tolist() if learned else None,
            "calibration": choice.calibration.tolist() if learned else None,
            "transition": choice.transition.tolist()
            if learned and choice.transition is not None else None}


def candidate_json(c: dict, robust: bool) -> dict:
    """One row of the candidates table as the plan records it: stall in ms/step, the regret
    (under --robust) as the ratio it is."""
    return {"name": c["name"], "kind": c["kind"], "pin_cap": c["pin_cap"],
            "slots_share": c["slots_share"], "slots_per_layer": c["slots_per_layer"],
            "pinned": c["pinned"], "slots": c["slots"],
            "held_out_stall_ms_per_step": c["stall_s"] * 1e3,
            "held_out_regret": c["objective"] if robust else None,
            "held_out_unlike_stall_ms_per_step": None if c["unlike_stall_s"] is None
            else c["unlike_stall_s"] * 1e3, "chosen": c["chosen"]}


def scenarios_of(traffic: list[Traffic], opts: SolveOptions, experts: int
                 ) -> tuple[list[Scenario], int, list[str]]:
    """Every (trace set, concurrency) as a Scenario with its folds over sequences, the fold
    count (0: judged in sample) and notes. Folds need B sequences each for a step of B;
    with several trace sets each set is one fold (held out against the others)."""
    weights = opts.weights or tuple(1.0 / len(opts.concurrency) for _ in opts.concurrency)
    out, notes, counts = [], [], []
    for group, t in enumerate(traffic):
        single = t.steps.get(1) or traffic_steps(t.path, t.profile, 1, None, opts.seed,
                                                 t.replayed_ids)
        for b, w in zip(opts.concurrency, weights, strict=True):
            k = 1 if len(traffic) > 1 else min(opts.folds, t.profile.sequences // b)
            folds = []
            if k >= 2:
                try:
                    folds = [Requests.of_tokens(batched_steps(single, b, opts.seed, ids).tokens,
                                                experts)
                             for ids in fold_ids(t, k, opts.seed)]
                except TraceError:
                    folds = []
            if not folds:
                if len(traffic) == 1:
                    notes.append(f"{t.name} B={b}: too few sequences for folds of {b} "
                                 f"(at least {2 * b}); the split is judged on the tokens it "
                                 f"is chosen on")
                folds = [Requests.of_tokens(t.steps[b].tokens, experts)]
            counts.append(len(folds) if len(folds) > 1 else len(traffic) if len(traffic) > 1
                          else 0)
            out.append(Scenario(f"{t.name} B={b}", folds, w / len(traffic), w / len(traffic),
                                group, b))
    return out, min(counts), notes
