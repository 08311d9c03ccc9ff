"""Robust placement: minimize the worst ratio, over traffic profiles, of a placement's
expected stall to layer offload's on that profile.

Each profile k is a Problem with the same sizes, homes, capacity and cards but its own steps.
With Z_k = objective_k(layer offload), the MILP keeps each profile's block stalls and adds
    z >= sum_{b in k} w_b t_b / Z_k   for every k,     minimize z.
A placement with z <= 1 is predicted no worse than layer offload on any profile; layer
offload itself is feasible (z = 1), so the optimum never exceeds 1.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

import numpy as np
from ortools.linear_solver.python import model_builder as mb

from solvers import baselines, cost, greedy
from solvers.errors import SolverError
from solvers.ilp import run
from solvers.milp_model import build
from solvers.patterns import LayerPatterns, problem_patterns
from solvers.problem import Placement, Problem, SolveResult, relative_gap, validate


@dataclass(frozen=True)
class RobustOutcome:
    """result.objective is the worst ratio; ratios: profile name -> ratio to layer offload."""

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


def solve(problems: list[Problem], time_limit: float = 60.0, seed: int = 0) -> RobustOutcome:
    """The robust placement over `problems` (see module docstring).

    A profile on which layer offload stalls 0 (Z_k = 0) keeps ratio-1 semantics: its blocks
    must stall 0 too (t_b <= 0, which layer offload satisfies) and it takes no part in z; the
    worst ratio reported is then at least 1.
    """
    if not problems:
        raise SolverError("robust placement needs at least one traffic profile")
    for p in problems:
        validate(p)
    _check_same_layout(problems)
    start = time.perf_counter()
    first = problems[0]
    num_layers = first.num_layers
    layer_pl = baselines.layer_offload(first).placement
    layer = [cost.objective(p, layer_pl) for p in problems]
    zero = [z <= 0 for z in layer]
    scale = [z if z > 0 else 1.0 for z in layer]
    # One MILP over all profiles' blocks, each profile's weights divided by its Z_k.
    steps = [replace(st, name=f"{k}", weight=st.weight / scale[k])
             for k, p in enumerate(problems) for st in p.steps]
    merged = replace(first, steps=steps)
    per_profile = [problem_patterns(replace(first, steps=[st for st in steps
                                                          if st.name == str(k)]))
                   for k in range(len(problems))]
    # One pattern list per layer (as build expects), profiles kept as separate blocks.
    patterns = [LayerPatterns(np.concatenate([pats[lay].selected for pats in per_profile]),
                              np.concatenate([pats[lay].weight for pats in per_profile]))
                for lay in range(num_layers)]
    profile_of = np.concatenate([np.repeat(np.arange(len(problems)),
                                           [pats[lay].weight.size for pats in per_profile])
                                 for lay in range(num_layers)])
    milp = build(merged, patterns, fold=False)
    weights = milp.block_weight
    # z row per profile: z - sum_{b in k} w_b t_b >= 0 (t in time_scale units).
    model = milp.model
    z = model.new_num_var(0.0, np.inf, "z")
    for k in range(len(problems)):
        blocks = np.flatnonzero(profile_of == k)
        if zero[k]:
            for b in blocks:
                model.add(model.var_from_index(int(milp.t[b])) <= 0.0)
            continue
        terms = [model.var_from_index(int(milp.t[b])) * float(weights[b]) for b in blocks]
        model.add(z >= mb.LinearExpr.sum(terms))
    model.minimize(z)

    def worst(pages: np.ndarray) -> float:
        return max(ratios_of(problems, Placement(pages), layer).values())

    candidates = [greedy.greedy_pages(merged, problem_patterns(merged), seed),
                  layer_pl.resident_pages]
    scores = [worst(c) for c in candidates]
    hint = candidates[int(np.argmin(scores))]
    milp.hint(hint)
    values, bound_units, optimal = run(milp, time_limit - (time.perf_counter() - start), seed)
    best, best_obj = Placement(hint), min(scores)
    if values is not None:
        cand = Placement(milp.pages(values).reshape(first.expert_bytes.shape))
        if cand.fits(first):
            value = worst(cand.resident_pages)
            if value <= best_obj:
                best, best_obj = cand, value
    if np.isfinite(bound_units):
        bound = max(bound_units * milp.time_scale, 0.0)  # ratios are never negative
        if any(zero):
            bound = max(bound, 1.0)
        bound = min(bound, best_obj)
    else:
        bound = float("nan")
    gap = relative_gap(best_obj, bound)
    result = SolveResult(best, "robust", best_obj, bound, gap, time.perf_counter() - start,
                         "optimal" if optimal and gap <= 1e-6 else "feasible")
    return RobustOutcome(result, ratios_of(problems, best, layer))
