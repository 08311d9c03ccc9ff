"""Robust placement: placements that hold up on traffic they were not solved on.

Each profile k (a traffic set at one concurrency) is a Problem with the same sizes, homes,
capacity and cards but its own steps. Let O_k be profile k's own best stall (the greedy
solved on k alone) and Z_k layer offload's stall on k. The robust placement minimizes the
mean regret over profiles, subject to never being worse than layer offload on any of them:

    minimize  (1 / K) sum_k stall_k / O_k     s.t.  stall_k <= Z_k  for every k.

Layer offload is feasible, so a solution always exists. Dividing by O_k (not Z_k) weighs a
profile by how much a placement can win on it, so a skewed profile (small O_k) is not drowned
by a flat one. Measured by leave-one-domain-out on real routing (benchmarks/bench_routing.py):
on OLMoE's five domains this kept 2.56x / 1.82x the oracle's stall on the unseen domain at
B = 1 / 8 where minimizing the worst ratio to layer offload (placer's former --robust) kept
3.19x / 1.99x, and it lost less in profile (1.80x / 1.45x against 2.53x / 1.74x); on ESFT's
four tasks both are within 0.5% on the unseen task (2.28x / 1.77x) and the mean regret is
better in profile (1.42x / 1.32x against 1.58x / 1.42x).

Solved in two steps. First the LP of the summed regrets without the guards (PDLP, as
ilp.py's full-size path): its dual bound over K bounds the mean regret (dropping constraints
only lowers the optimum, and the worst regret is at least the mean), and its rounded
solutions are candidates beside the greedy (on the summed regrets) and layer offload. Then,
where the guarded model has at most SCIP_MAX_TIME_ROWS time rows, SCIP gets it for the time
left, from the best candidate; the bound is the better of the two. The best guarded
candidate is returned. On the DeepSeek-V3-shaped problem of benchmarks/bench_solvers.py
(two traffic profiles x B = 1, 8) that is a 1.5% gap in 50-56 s, where SCIP alone proved
no bound within 60 s; on `make demo`'s robust plan (35,748 time rows, 20 s) 0.86% where
SCIP alone, whose root LP did not finish, left a 100% gap.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

import numpy as np
from ortools.linear_solver.python import model_builder as mb

from solvers import cost
from solvers.errors import SolverError
from solvers.patterns import LayerPatterns, problem_patterns
from solvers.problem import Placement, Problem, SolveResult, relative_gap, validate
from solvers.static import baselines, greedy
from solvers.static.ilp import (
    PDLP_ITERATIONS,
    RESERVE_S,
    SCIP_MAX_TIME_ROWS,
    Progress,
    no_progress,
    rounded_candidates,
    run,
)
from solvers.static.lp_bound import dual_bound, pdlp_duals
from solvers.static.milp_model import MilpData, MilpModel, milp_data, model_of


@dataclass(frozen=True)
class RobustOutcome:
    """result.objective is the mean regret (stall / the profile's own best stall, mean over
    profiles); ratios: profile name -> ratio to layer offload (each <= 1)."""

    result: SolveResult
    ratios: dict[str, float]


def ratios_of(problems: list[Problem], placement: Placement, layer: list[float]
              ) -> dict[str, float]:
    """Profile name -> objective ratio to layer offload. Where layer offload stalls 0 on a
    profile the ratio is 1 when the placement stalls 0 too, else inf (worse than a baseline
    that never waits). Names repeated across profiles get a "#k" suffix (k: profile index)."""
    out = {}
    for k, (p, z) in enumerate(zip(problems, layer, strict=True)):
        value = cost.objective(p, placement)
        name = p.steps[0].name
        if name in out:
            name = f"{name}#{k}"
        out[name] = value / z if z > 0 else (1.0 if value <= 0 else float("inf"))
    return out


def _check_same_layout(problems: list[Problem]) -> None:
    first = problems[0]
    for k, p in enumerate(problems[1:], start=1):
        same = (np.array_equal(p.expert_bytes, first.expert_bytes)
                and np.array_equal(p.home, first.home)
                and np.array_equal(p.capacity, first.capacity)
                and p.page_bytes == first.page_bytes
                and p.execution == first.execution and p.host == first.host
                and all(np.array_equal(getattr(p.cards, f), getattr(first.cards, f))
                        for f in ("bandwidth", "latency", "link_of", "link_bandwidth")))
        if not same:
            raise SolverError(f"robust profile {k} differs from profile 0 in sizes, homes, "
                              "capacity, cards, page size or execution: only the steps may "
                              "differ")


def _grouped_data(merged: Problem, num_profiles: int) -> MilpData:
    """The MILP data of `merged` (profile k's steps named "k") with each profile's patterns
    kept as a separate block group, so each profile's stall is a linear expression."""
    per_profile = [problem_patterns(replace(merged, steps=[st for st in merged.steps
                                                           if st.name == str(k)]))
                   for k in range(num_profiles)]
    # One pattern list per layer (as milp_data expects), profiles kept as separate groups.
    patterns = [LayerPatterns(np.concatenate([pats[lay].selected for pats in per_profile]),
                              np.concatenate([pats[lay].weight for pats in per_profile]))
                for lay in range(merged.num_layers)]
    profile_of = np.concatenate([np.repeat(np.arange(num_profiles),
                                           [pats[lay].weight.size for pats in per_profile])
                                 for lay in range(merged.num_layers)])
    return milp_data(merged, patterns, block_group=profile_of)


def _regret_model(data: MilpData, problems: list[Problem], layer: list[float],
                  unit: list[float], objective: str) -> MilpModel:
    """The MILP over `data` (profiles as block groups) with each profile's regret
    stall_k / unit_k, the guard stall_k <= Z_k, and the mean or worst regret minimized."""
    milp = replace(model_of(data), offset=0.0)  # the objective below holds every constant
    model = milp.model
    regrets = []
    for k in range(len(problems)):
        kept = np.flatnonzero(data.t_group == k)
        cols = np.flatnonzero(data.group_objective[k])
        terms = ([model.var_from_index(int(data.t[i])) * float(milp.block_weight[i])
                  for i in kept]
                 + [model.var_from_index(int(c)) * float(data.group_objective[k, c])
                    for c in cols])
        regret = mb.LinearExpr.sum(terms) + float(data.group_offset[k])  # stall_k / unit_k
        # Never worse than layer offload: stall_k <= Z_k (0 where layer offload waits 0).
        model.add(regret <= layer[k] / unit[k] / data.time_scale)
        regrets.append(regret)
    if objective == "regret":
        model.minimize(mb.LinearExpr.sum(regrets) / len(regrets))
    else:
        worst = model.new_num_var(0.0, np.inf, "worst")
        for regret in regrets:
            model.add(worst >= regret)
        model.minimize(worst)
    return milp


OBJECTIVES = ("regret", "worst")


def solve(problems: list[Problem], time_limit: float = 60.0, seed: int = 0,
          objective: str = "regret", progress: Progress = no_progress) -> RobustOutcome:
    """The robust placement over `problems` (see module docstring). objective "worst"
    minimizes the worst ratio to layer offload instead (placer's former --robust, which the
    benchmarks compare against).

    A profile on which layer offload stalls 0 (Z_k = 0) must stall 0 too (which layer offload
    satisfies); a profile whose own best stalls 0 counts its regret in units of Z_k.
    `progress(stage)` is told each stage as it starts (as ilp.solve's).
    """
    if not problems:
        raise SolverError("robust placement needs at least one traffic profile")
    if objective not in OBJECTIVES:
        raise SolverError(f"objective must be one of {', '.join(OBJECTIVES)}, got {objective!r}")
    for p in problems:
        validate(p)
    _check_same_layout(problems)
    start = time.perf_counter()
    progress(f"each of {len(problems)} scenarios' own best")
    first = problems[0]
    layer_pl = baselines.layer_offload(first).placement
    layer = [cost.objective(p, layer_pl) for p in problems]
    # Each profile's own best (greedy) stall: the unit its regret is counted in ("worst":
    # layer offload's stall, the unit of its ratio).
    own = ([greedy.solve(p, seed=seed).objective for p in problems] if objective == "regret"
           else layer)
    unit = [o if o > 0 else (z if z > 0 else 1.0) for o, z in zip(own, layer, strict=True)]
    steps = [replace(st, name=f"{k}", weight=st.weight / unit[k])
             for k, p in enumerate(problems) for st in p.steps]
    merged = replace(first, steps=steps)

    def value(pages: np.ndarray) -> float:
        """Mean (worst) regret of a placement; inf where it does not fit or is worse than
        layer offload somewhere."""
        placement = Placement(pages)
        if not placement.fits(first):
            return float("inf")
        stall = [cost.objective(p, placement) for p in problems]
        if any(v > z * (1 + 1e-9) for v, z in zip(stall, layer, strict=True)):
            return float("inf")
        regret = [v / u for v, u in zip(stall, unit, strict=True)]
        return float(np.mean(regret) if objective == "regret" else max(regret))

    merged_patterns = problem_patterns(merged)
    candidates = [greedy.greedy_pages(merged, merged_patterns, seed), layer_pl.resident_pages]
    # The LP of the summed regrets without the guards (PDLP, as ilp's full-size path): its
    # dual bound over K bounds the mean regret (dropping constraints only lowers the optimum,
    # and the worst regret is at least the mean), and its rounded solutions are candidates.
    # SCIP then gets the guarded model, where it is small enough, for what time is left.
    plain = milp_data(merged, merged_patterns)
    # Keeping the profiles apart only adds time rows: a plain model too large for SCIP
    # needs no guarded one built.
    data = (_grouped_data(merged, len(problems))
            if plain.num_time_rows <= SCIP_MAX_TIME_ROWS else None)
    small = data is not None and data.num_time_rows <= SCIP_MAX_TIME_ROWS
    left = time_limit - (time.perf_counter() - start)
    progress(f"PDLP bound, {left:.0f} s left")
    values, duals, converged = pdlp_duals(plain, left / 2 if small else left - RESERVE_S,
                                          PDLP_ITERATIONS)
    bound = dual_bound(plain, duals) * plain.time_scale / len(problems)
    if converged:
        candidates += rounded_candidates(merged, merged_patterns, plain, values, seed)
    scores = [value(c) for c in candidates]
    optimal = False
    if small:
        milp = _regret_model(data, problems, layer, unit, objective)
        milp.hint(candidates[int(np.argmin(scores))])
        left = time_limit - (time.perf_counter() - start)
        progress(f"SCIP, {data.num_time_rows:,} time rows, {left:.0f} s left")
        values, bound_units, optimal = run(milp, left, seed)
        if values is not None:
            candidates.append(milp.pages(values).reshape(first.expert_bytes.shape))
        if np.isfinite(bound_units):
            bound = max(bound, bound_units * data.time_scale)
    scores += [value(c) for c in candidates[len(scores):]]
    # The last of the best: a solver's candidate over the hint it ties with.
    pick = len(scores) - 1 - int(np.argmin(scores[::-1]))
    best, best_obj = Placement(candidates[pick]), scores[pick]
    bound = min(max(bound, 0.0), best_obj) if np.isfinite(bound) else float("nan")
    gap = relative_gap(best_obj, bound)
    result = SolveResult(best, "robust", best_obj, bound, gap, time.perf_counter() - start,
                         "optimal" if optimal and gap <= 1e-6 else "feasible")
    return RobustOutcome(result, ratios_of(problems, best, layer))
