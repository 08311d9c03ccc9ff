"""The bridge from a solve's traffic, budget and cards to the cache split (`solvers.cache.split`).

`placer solve --cache auto` (the default) splits each card's budget between pinned experts
and per-layer cache slots under `--cache-policy`, judged on held-out folds of the calibration
sequences; `--cache N` gives every card N slots (spread over its layers) and pins the rest;
`--cache 0` is a static placement (`--solver`). Where a cache cannot be predicted, auto
falls back to a static placement and says why (`no_cache_reason`), and N is refused.
"""

from __future__ import annotations

import time

import numpy as np

from placer.checkpoint.inventory import Inventory
from placer.errors import PlacerError
from placer.hardware.spec import HardwareSpec
from placer.plan.options import SolveOptions
from placer.plan.traffic import Traffic, traffic_steps
from solvers.cache import even_quotas
from solvers.cache.replay import Requests
from solvers.cache.split import (
    Scenario,
    Split,
    SplitProblem,
    expert_misses,
    per_card,
    solve_split,
)
from solvers.staging import cache_only_slots, fetch_limit, slot_unit
from traces.errors import TraceError
from traces.profile import split_sequences, step_mask


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
                traffic: list[Traffic], opts: SolveOptions) -> tuple[Split, dict]:
    """The split of every card's budget, and what the plan records of it (`plan.cache`)."""
    began = time.perf_counter()
    num_cards = len(spec.cards)
    unit = slot_unit(inv.expert_bytes(), home, num_cards)
    problem = SplitProblem(
        home=home,
        miss_s=np.array([c.latency_s + unit[i] / c.h2d_bandwidth
                         for i, c in enumerate(spec.cards)]),
        units=np.asarray(budget, dtype=np.int64) // np.maximum(unit, 1),
        fetch_limit=fetch_limit(home, num_cards, max(opts.concurrency), inv.top_k),
        policy=opts.cache_policy, pin_share=opts.pin_share)
    scenarios, folds, notes = scenarios_of(traffic, opts, inv.experts_per_layer)
    if opts.robust:
        scenarios = regret_weights(problem, scenarios)
    try:
        split = solve_split(problem, scenarios, opts.cache)
    except ValueError as exc:
        raise PlacerError(f"--cache {opts.cache}: {exc}") from None
    info = {"mode": "auto" if opts.cache is None else "fixed", "policy": opts.cache_policy,
            "folds": folds, "pin_share": opts.pin_share if opts.cache is None else None,
            "slots": [int(n) for n in split.quotas.sum(axis=1)],
            "pinned": [int((split.pinned & (home == c)).sum()) for c in range(num_cards)],
            "held_out_stall_ms_per_step": split.stall_s * 1e3,
            "curve": [{"slots_share": p["slots_share"], "slots_per_layer": p["slots_per_layer"],
                       "held_out_stall_ms_per_step": p["stall_s"] * 1e3}
                      for p in split.curve],
            "seconds": time.perf_counter() - began, "notes": notes}
    return split, info


def regret_weights(problem: SplitProblem, scenarios: list[Scenario]) -> list[Scenario]:
    """`--robust`: each scenario weighed by 1 / its stall with the whole budget as even
    per-layer caches, so the split minimizes the mean over scenarios of stall over that
    plain cache's (a regret in each scenario's own units, as the static --robust has)."""
    layers = problem.home.shape[0]
    quotas = even_quotas(cache_only_slots(problem.units, problem.fetch_limit, layers), layers)
    nothing = np.zeros(problem.home.shape, dtype=bool)
    out = []
    for sc in scenarios:
        misses = per_card(expert_misses(problem, sc.whole, nothing, quotas), problem.home,
                          problem.num_cards)
        stall = float((misses * problem.miss_s[:, None]).sum()) / sc.whole.shape[0]
        out.append(Scenario(sc.name, sc.whole, sc.folds,
                            1.0 / (len(scenarios) * stall) if stall > 0 else 0.0))
    return out


def scenarios_of(traffic: list[Traffic], opts: SolveOptions, experts: int
                 ) -> tuple[list[Scenario], int, list[str]]:
    """Every (trace set, concurrency) as a Scenario with its folds over sequences, the fold
    count (0: judged in sample) and notes. Folds need B sequences each for a step of B."""
    weights = opts.weights or tuple(1.0 / len(opts.concurrency) for _ in opts.concurrency)
    out, notes, counts = [], [], []
    for t in traffic:
        for b, w in zip(opts.concurrency, weights, strict=True):
            k = min(opts.folds, t.profile.sequences // b)
            whole = Requests.of(step_mask(t.steps[b].tokens, experts))
            folds = []
            if k >= 2:
                try:
                    sets = split_sequences(t.path, k, opts.seed)
                    every = set().union(*sets)
                    folds = [tuple(Requests.of(step_mask(traffic_steps(
                        t.path, t.profile, b, None, opts.seed, ids).tokens, experts))
                        for ids in (every - held, held)) for held in sets]
                except TraceError:
                    folds = []
            if not folds:
                notes.append(f"{t.name} B={b}: too few sequences for folds of {b} "
                             f"(at least {2 * b}); the split is judged on the tokens it is "
                             f"chosen on")
                folds = [(whole, whole)]
            counts.append(len(folds) if len(folds) > 1 else 0)
            out.append(Scenario(f"{t.name} B={b}", whole, folds, w / len(traffic)))
    return out, min(counts), notes
