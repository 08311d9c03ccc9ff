"""Exact placement: the sample-average MILP (milp_model.py) solved by SCIP from a greedy hint.

Deterministic: one thread, a fixed seed, a time limit. The returned placement is scored with
the exact cost model (cost.objective), never worse than the greedy hint, with the solver's
proven lower bound and the relative gap between the two.
"""

from __future__ import annotations

import time

import numpy as np
from ortools.linear_solver.python import model_builder as mb

from solvers import cost, greedy
from solvers.milp_model import MilpModel, build
from solvers.patterns import problem_patterns
from solvers.problem import Placement, Problem, SolveResult, relative_gap, validate

BACKEND = "scip"


def run(milp: MilpModel, time_limit: float, seed: int) -> tuple[np.ndarray | None, float, bool]:
    """Solve `milp`: (variable values or None, bound in objective units, proven optimal)."""
    solver = mb.Solver(BACKEND)
    solver.set_time_limit_in_seconds(max(0.1, float(time_limit)))
    solver.set_solver_specific_parameters(
        f"parallel/maxnthreads = 1\nrandomization/randomseedshift = {int(seed)}\n"
        "limits/gap = 1e-6")
    status = solver.solve(milp.model)
    if status not in (mb.SolveStatus.OPTIMAL, mb.SolveStatus.FEASIBLE):
        return None, float("nan"), False
    values = solver.values(milp.model.get_variables()).to_numpy()
    return values, float(solver.best_objective_bound), status == mb.SolveStatus.OPTIMAL


def solve(problem: Problem, time_limit: float = 60.0, seed: int = 0) -> SolveResult:
    """Best placement of `problem` found within `time_limit` seconds, with its bound."""
    validate(problem)
    start = time.perf_counter()
    patterns = problem_patterns(problem)
    hint = greedy.greedy_pages(problem, patterns, seed)
    milp = build(problem, patterns)
    milp.hint(hint)
    values, bound_units, optimal = run(milp, time_limit - (time.perf_counter() - start), seed)
    best = Placement(hint)
    best_obj = cost.objective(problem, best)
    if values is not None:
        candidate = Placement(milp.pages(values).reshape(problem.expert_bytes.shape))
        if candidate.fits(problem):
            value = cost.objective(problem, candidate)
            if value <= best_obj:
                best, best_obj = candidate, value
    bound = min(bound_units * milp.time_scale, best_obj) if np.isfinite(bound_units) else \
        float("nan")
    gap = relative_gap(best_obj, bound)
    status = "optimal" if optimal and gap <= 1e-6 else "feasible"
    return SolveResult(best, "ilp", best_obj, bound, gap, time.perf_counter() - start, status)
