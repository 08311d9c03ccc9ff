"""A proven lower bound of the placement MILP from its LP relaxation, solved by PDLP.

SCIP cannot finish the root LP of the full-size MILP (~300k rows) in a minute; a first-order
method (OR-Tools' PDLP, one thread) reaches a near-optimal dual in a fraction of that. Its
iterate is only approximately feasible, so the bound is not read off the solver: it is the
Lagrangian value of the multipliers, evaluated exactly (`dual_bound`). For any multipliers
y_i >= 0 on the time rows (t_b >= ...), y_i <= 0 on the budget rows and 0 on the page linking
rows, with sum_{i in block b} y_i <= w_b,

    bound(y) = offset + sum_i y_i * side_i + sum_x min_{(f_x, r_x) feasible} (d_f f_x + d_r r_x)

where side_i is the finite side of row i and d = objective - matrix^T y the reduced costs, is
at most the MILP optimum (weak duality; the t_b terms vanish as their reduced costs are >= 0).
The per-expert minimum runs over the integer choices (f, r) = (1, P) or (0, 0..P - 1), so
the linking rows are exact there. `dual_bound` first projects y onto those sign conditions
and scales each block's time-row multipliers down to its weight, so any y gives a valid
bound; PDLP's near-optimal y gives one close to the LP optimum.
"""

from __future__ import annotations

import numpy as np
from ortools.pdlp import solve_log_pb2, solvers_pb2
from ortools.pdlp.python import pdlp

from solvers.static.milp_model import MilpData

SAFETY = 1e-9  # relative margin taken off the bound for float rounding in its sums


def dual_bound(data: MilpData, y: np.ndarray) -> float:
    """Valid lower bound (objective units) of the MILP `data` from row multipliers y
    ([rows] float, any values; see module docstring)."""
    y = np.array(y, dtype=np.float64)
    y[~np.isfinite(y)] = 0.0
    nt = data.num_time_rows
    num_budget = data.num_cards
    y[:nt] = np.maximum(y[:nt], 0.0)  # t_b + ... >= side
    y[nt:nt + num_budget] = np.minimum(y[nt:nt + num_budget], 0.0)  # resident bytes <= cap
    y[nt + num_budget:] = 0.0  # linking rows: exact in the per-expert minimum instead
    weight = data.objective[data.t]
    per_block = np.bincount(data.row_block, weights=y[:nt], minlength=data.t.size)
    scale = np.where(per_block > weight, weight / np.maximum(per_block, 1e-300), 1.0)
    y[:nt] *= scale[data.row_block] * (1.0 - 1e-12)
    reduced = data.objective - data.matrix.T @ y
    side = np.where(y > 0, data.row_lo, np.where(y < 0, data.row_hi, 0.0))
    rows = float(y[y != 0] @ side[y != 0])
    d_f = reduced[data.f]
    has_r = data.r >= 0
    d_r = np.where(has_r, reduced[np.maximum(data.r, 0)], 0.0)
    pages = data.num_pages.astype(np.float64)
    full = np.where(has_r, d_f + d_r * pages, d_f)
    partial = np.where(has_r, np.minimum(0.0, d_r * (pages - 1.0)), 0.0)
    experts = float(np.minimum(full, partial).sum())
    value = rows + experts + data.offset
    return value - SAFETY * abs(value)


def pdlp_duals(data: MilpData, time_limit: float, iteration_limit: int,
               rel_tol: float = 1e-4) -> tuple[np.ndarray, np.ndarray, bool]:
    """(primal [cols], dual [rows], converged) PDLP iterate of the LP relaxation of `data`,
    one thread, stopped at relative optimality `rel_tol` (converged: True; the iterate then
    depends on the data only), `iteration_limit` or `time_limit` seconds."""
    qp = pdlp.QuadraticProgram()
    qp.objective_vector = data.objective
    qp.constraint_matrix = data.matrix.tocsc()
    qp.constraint_lower_bounds = data.row_lo
    qp.constraint_upper_bounds = data.row_hi
    qp.variable_lower_bounds = data.col_lo
    qp.variable_upper_bounds = data.col_hi
    params = solvers_pb2.PrimalDualHybridGradientParams()
    params.num_threads = 1
    params.termination_criteria.time_sec_limit = max(0.1, float(time_limit))
    params.termination_criteria.iteration_limit = int(iteration_limit)
    criteria = params.termination_criteria.simple_optimality_criteria
    criteria.eps_optimal_relative = rel_tol
    criteria.eps_optimal_absolute = 1e-9
    result = pdlp.primal_dual_hybrid_gradient(qp, params)
    converged = result.solve_log.termination_reason == solve_log_pb2.TERMINATION_REASON_OPTIMAL
    return np.asarray(result.primal_solution), np.asarray(result.dual_solution), converged
