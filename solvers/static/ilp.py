"""Exact placement: the sample-average MILP (milp_model.py), from a greedy hint where it has
time rows (a MILP whose every block folded is a knapsack SCIP solves at once).

A MILP small enough for SCIP (at most `SCIP_MAX_TIME_ROWS` time rows) is solved by SCIP:
one thread, a fixed seed, a time limit; its proven bound is SCIP's. A larger one, whose root
LP SCIP cannot finish within a minute, gets its LP relaxation from PDLP instead: the bound is
the exact Lagrangian value of PDLP's multipliers (lp_bound.py), and the LP solution, rounded
at a few thresholds and repaired by the greedy's eviction and local search, gives candidate
placements (only when PDLP converged, so they do not depend on timing).

Deterministic given the seed (up to where a time limit stops SCIP). Candidates are compared
with the exact cost model over the merged patterns (the greedy's state: the sum of pattern
weight x pattern cost, which patterns.py shows equals cost.objective, in work proportional to
the patterns, not the steps); the winner, never worse than the greedy hint, is scored with
cost.objective itself and returned with the proven lower bound and the relative gap.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
from ortools.linear_solver.python import model_builder as mb

from solvers import cost
from solvers.patterns import LayerPatterns, problem_patterns
from solvers.problem import Placement, Problem, SolveResult, relative_gap, validate
from solvers.static import greedy
from solvers.static.lp_bound import dual_bound, pdlp_duals
from solvers.static.milp_model import MilpData, MilpModel, milp_data, model_of

Progress = Callable[[str], None]  # told each stage's name as it starts


def no_progress(stage: str) -> None:
    """The default `progress`: says nothing."""

BACKEND = "scip"
SCIP_MAX_TIME_ROWS = 50_000  # above this, the LP bound comes from PDLP (see docstring)
PDLP_ITERATIONS = 20_000  # a count, so a converged PDLP run is timing independent
ROUNDING = (0.1, 0.15, 0.2, 0.3, 0.4, 0.5)  # LP residency thresholds of the rounded candidates
RESERVE_S = 6.0  # seconds kept after PDLP for rounding and scoring


def run(milp: MilpModel, time_limit: float, seed: int) -> tuple[np.ndarray | None, float, bool]:
    """Solve `milp`: (variable values or None, bound in objective units with the model's
    offset, proven optimal)."""
    solver = mb.Solver(BACKEND)
    solver.set_time_limit_in_seconds(max(0.1, float(time_limit)))
    # misc/catchctrlc: SCIP would take SIGINT itself, stop and return its best: the command
    # would go on and write its outputs as if never interrupted. Left to Python, the signal
    # raises KeyboardInterrupt when the solve returns (within its time limit).
    solver.set_solver_specific_parameters(
        f"parallel/maxnthreads = 1\nrandomization/randomseedshift = {int(seed)}\n"
        "limits/gap = 1e-6\nmisc/catchctrlc = FALSE")
    status = solver.solve(milp.model)
    solved = status in (mb.SolveStatus.OPTIMAL, mb.SolveStatus.FEASIBLE)
    # A run stopped before any solution (NOT_SOLVED) may still have proved a bound.
    raw = solver.best_objective_bound  # a float, or pandas.NA when SCIP has none
    bound = (float(raw) + milp.offset if isinstance(raw, int | float)
             and (solved or status == mb.SolveStatus.NOT_SOLVED) else float("nan"))
    values = solver.values(milp.model.get_variables()).to_numpy() if solved else None
    return values, bound if np.isfinite(bound) else float("nan"), \
        status == mb.SolveStatus.OPTIMAL


def rounded_candidates(problem: Problem, patterns: list[LayerPatterns], data: MilpData,
                       values: np.ndarray, seed: int) -> list[np.ndarray]:
    """[L, E] placements from LP column values ([cols]): experts with LP residency f_x >=
    each ROUNDING threshold fully resident, the rest cold, then greedy.repair_pages."""
    f = values[data.f].reshape(problem.expert_bytes.shape)
    pages = problem.num_pages()
    return [greedy.repair_pages(problem, patterns, np.where(f >= thr, pages, 0), seed)
            for thr in ROUNDING]


def solve(problem: Problem, time_limit: float = 60.0, seed: int = 0,
          progress: Progress = no_progress) -> SolveResult:
    """Best placement of `problem` found within `time_limit` seconds, with its bound.
    `progress(stage)` is called as each stage starts (a caller's spinner shows it with the
    time elapsed; SCIP and PDLP release the GIL, so a display thread keeps running)."""
    validate(problem)
    start = time.perf_counter()
    progress("merging patterns")
    patterns = problem_patterns(problem)
    data = milp_data(problem, patterns)
    progress("greedy hint")
    # Where every block folded the MILP is a knapsack over the experts that SCIP solves at
    # once: the greedy (hint and fallback) runs only where time rows remain or SCIP fails.
    hint = greedy.greedy_pages(problem, patterns, seed) if data.num_time_rows else None
    candidates: list[np.ndarray] = []
    optimal = False
    if data.num_time_rows <= SCIP_MAX_TIME_ROWS:
        milp = model_of(data)
        if hint is not None:
            milp.hint(hint)
        left = time_limit - (time.perf_counter() - start)
        progress(f"SCIP, {data.num_time_rows:,} time rows, {left:.0f} s left")
        values, bound_units, optimal = run(milp, left, seed)
        if values is not None:
            candidates.append(milp.pages(values).reshape(problem.expert_bytes.shape))
    else:
        left = time_limit - (time.perf_counter() - start) - RESERVE_S
        progress(f"PDLP bound, {data.num_time_rows:,} time rows, {left:.0f} s left")
        values, duals, converged = pdlp_duals(data, left, PDLP_ITERATIONS)
        bound_units = dual_bound(data, duals)
        if converged:
            candidates += rounded_candidates(problem, patterns, data, values, seed)
    if hint is None and not candidates:
        hint = greedy.greedy_pages(problem, patterns, seed)
    progress("scoring candidates")
    best, best_obj = None, np.inf
    for pages in ([hint] if hint is not None else []) + candidates:
        candidate = Placement(pages)
        if candidate.fits(problem):
            value = greedy.new_state(problem, patterns, pages).objective()
            if value <= best_obj:
                best, best_obj = candidate, value
    best_obj = cost.objective(problem, best)  # the winner, scored over the steps themselves
    # A stall is never negative, so 0 bounds it whatever SCIP proved: stopped before its root
    # LP it reports a huge negative bound, or none at all (seen on a loaded 2-core machine).
    bound = min(max(bound_units * data.time_scale, 0.0), best_obj) \
        if np.isfinite(bound_units) else 0.0
    gap = relative_gap(best_obj, bound)
    status = "optimal" if optimal and gap <= 1e-6 else "feasible"
    return SolveResult(best, "ilp", best_obj, bound, gap, time.perf_counter() - start, status)
