"""The sample-average MILP of a placement problem, built with OR-Tools' model_builder.

Variables, per expert x (flat index layer * E + e) with P_x pages of page size p:
    f_x in {0, 1}          fully resident
    r_x in {0..P_x}        resident pages (only when P_x > 1; else r_x is f_x)
    with  P_x f_x <= r_x <= P_x - 1 + f_x   (r_x = P_x exactly when f_x = 1)
    cold_x = bytes_x - p r_x - (bytes_x - p P_x) f_x
and per block b (a distinct selection pattern of one layer, weight w_b, see patterns.py):
    t_b >= 0               the block's layer stall
Constraints:
    t_b >= sum_{x in b, home c} [latency_c (1 - f_x) + cold_x / bandwidth_c]   per card c
    t_b >= sum_{x in b, behind g} cold_x / link_bandwidth_g                    per link g
    sum_{x homed on c} (bytes_x - cold_x) <= capacity_c                        per card c
Objective: min sum_b w_b t_b  (= cost.objective at integer points).
Card rows of cards with no selected expert in the block are left out (they read t_b >= 0),
and so is a link row whose block selects experts of a single card c of the link when
link_bandwidth_g >= bandwidth_c (the card row dominates it). Times are scaled by
`time_scale` seconds and bytes by `byte_scale` so coefficients are near 1.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
from ortools.linear_solver.python import model_builder as mb

from solvers.patterns import LayerPatterns
from solvers.problem import Problem


@dataclass(frozen=True)
class MilpData:
    """The MILP as sparse arrays: min objective @ v s.t. row_lo <= matrix @ v <= row_hi,
    col_lo <= v <= col_hi, the first `num_int` columns (f, then r) integer.

    Rows: the `num_time_rows` time rows first (row_block: [num_time_rows] block of each),
    then one budget row per card (num_cards), then the page linking rows. matrix: csr [rows, cols].
    f, r, t, time_scale, num_pages: as in MilpModel.
    """

    matrix: sp.csr_matrix
    row_lo: np.ndarray
    row_hi: np.ndarray
    col_lo: np.ndarray
    col_hi: np.ndarray
    objective: np.ndarray
    num_int: int
    num_time_rows: int
    num_cards: int
    row_block: np.ndarray
    f: np.ndarray
    r: np.ndarray
    t: np.ndarray
    time_scale: float
    num_pages: np.ndarray


@dataclass
class MilpModel:
    """model: the MILP. f, r, t: variable indices ([L * E], [L * E] or -1 where r is f,
    [num blocks]). time_scale: seconds per objective unit."""

    model: mb.Model
    f: np.ndarray
    r: np.ndarray
    t: np.ndarray
    time_scale: float
    num_pages: np.ndarray

    def hint(self, resident_pages: np.ndarray) -> None:
        """Hint the placement [L, E] (and its block stalls, left to the solver)."""
        pages = np.asarray(resident_pages).ravel()
        self.model.clear_hints()
        full = pages == self.num_pages
        for x in range(pages.size):
            self.model.add_hint(self.model.var_from_index(int(self.f[x])), float(full[x]))
            if self.r[x] >= 0:
                self.model.add_hint(self.model.var_from_index(int(self.r[x])), float(pages[x]))

    def pages(self, values: np.ndarray) -> np.ndarray:
        """Solver variable values -> [L * E] int resident pages (rounded)."""
        f = np.rint(values[self.f]).astype(np.int64)
        r = np.where(self.r >= 0, np.rint(values[np.maximum(self.r, 0)]), f).astype(np.int64)
        return np.where(f == 1, self.num_pages, np.minimum(r, self.num_pages - 1))


def build(problem: Problem, patterns: list[LayerPatterns]) -> MilpModel:
    """The MILP of `problem` over the merged step patterns (see module docstring)."""
    return model_of(milp_data(problem, patterns))


def model_of(data: MilpData, integral: bool = True) -> MilpModel:
    """The model_builder MILP of `data` (its LP relaxation when not `integral`)."""
    model = mb.Model()
    model.helper.fill_model_from_sparse_data(
        data.col_lo, data.col_hi, data.objective, data.row_lo, data.row_hi, data.matrix)
    for col in range(data.num_int if integral else 0):
        model.helper.set_var_integrality(col, True)
    return MilpModel(model=model, f=data.f, r=data.r, t=data.t, time_scale=data.time_scale,
                     num_pages=data.num_pages)


def milp_data(problem: Problem, patterns: list[LayerPatterns]) -> MilpData:
    """The sparse arrays of the MILP of `problem` over `patterns` (see module docstring)."""
    num_layers, num_experts = problem.expert_bytes.shape
    cards = problem.cards
    num_cards, num_links = cards.num_cards, cards.num_links
    latency = np.asarray(cards.latency, dtype=np.float64)
    bandwidth = np.asarray(cards.bandwidth, dtype=np.float64)
    link_of = np.asarray(cards.link_of)
    link_bw = np.asarray(cards.link_bandwidth, dtype=np.float64)
    eb = np.asarray(problem.expert_bytes, dtype=np.float64).ravel()
    pages = problem.num_pages().ravel()
    pb = eb if problem.page_bytes is None else np.full_like(eb, float(problem.page_bytes))
    card = np.asarray(problem.home).ravel()
    byte_scale = float(eb.max())
    time_scale = float(np.median(latency[card] + eb / bandwidth[card]))

    # Columns: f (all experts), r (experts with > 1 page), t (blocks).
    num_x = eb.size
    multi = np.flatnonzero(pages > 1)
    r_col = np.full(num_x, -1, dtype=np.int64)
    r_col[multi] = num_x + np.arange(multi.size)
    f_col = np.arange(num_x)
    # cold_x = cold0 + fc * f + rc * r  (bytes); with one page r is f.
    fc = -(eb - pb * pages)
    rc = -pb
    fc_single = np.where(pages > 1, fc, fc + rc)

    sel = (np.concatenate([p.selected for p in patterns]) if patterns
           else np.zeros((0, num_experts), bool))
    block_layer = np.concatenate(
        [np.full(p.selected.shape[0], layer) for layer, p in enumerate(patterns)]
    )
    weight = np.concatenate([p.weight for p in patterns])
    num_blocks = sel.shape[0]
    t_col = num_x + multi.size + np.arange(num_blocks)
    num_cols = num_x + multi.size + num_blocks

    blocks, local = np.nonzero(sel)
    x = block_layer[blocks] * num_experts + local
    c = card[x]
    g = link_of[c]

    row_parts = []  # (row key, column, coefficient, constant) for the time rows

    def time_rows(key: np.ndarray, per_f: np.ndarray, per_r: np.ndarray, const: np.ndarray):
        row_parts.append((key, f_col[x], per_f, const))
        has_r = r_col[x] >= 0
        row_parts.append((key[has_r], r_col[x][has_r], per_r[has_r], np.zeros(has_r.sum())))

    # Card rows: t_b + sum [lat f + (-cold coefficient) / bw] >= sum (lat + bytes / bw).
    time_rows(
        blocks * num_cards + c,
        latency[c] - fc_single[x] / bandwidth[c],
        -rc[x] / bandwidth[c],
        latency[c] + eb[x] / bandwidth[c],
    )
    # Link rows, skipping those a single card's row dominates.
    link_key = blocks * num_links + g
    cards_on = np.zeros((num_blocks * num_links, num_cards), dtype=bool)
    cards_on[link_key, c] = True
    single = cards_on.sum(axis=1) == 1
    dominated = single & (link_bw[np.arange(num_blocks * num_links) % num_links]
                          >= bandwidth[cards_on.argmax(axis=1)])
    keep = ~dominated[link_key]
    offset = num_blocks * num_cards
    xk = x[keep]
    row_parts.append((offset + link_key[keep], f_col[xk], -fc_single[xk] / link_bw[g[keep]],
                      eb[xk] / link_bw[g[keep]]))
    has_r = r_col[xk] >= 0
    row_parts.append((offset + link_key[keep][has_r], r_col[xk][has_r],
                      -rc[xk][has_r] / link_bw[g[keep]][has_r], np.zeros(has_r.sum())))

    keys = np.concatenate([p[0] for p in row_parts])
    cols = np.concatenate([p[1] for p in row_parts])
    coef = np.concatenate([p[2] for p in row_parts]) / time_scale
    const = np.concatenate([p[3] for p in row_parts]) / time_scale
    row_keys, row_of = np.unique(keys, return_inverse=True)
    num_time_rows = row_keys.size
    row_block = np.where(row_keys < offset, row_keys // num_cards, (row_keys - offset) // num_links)
    rhs = np.bincount(row_of, weights=const, minlength=num_time_rows)

    # Budget rows: sum (pb r + (bytes - pb P) f) <= capacity, scaled by byte_scale.
    bud_f = np.where(pages > 1, -fc, eb) / byte_scale
    bud_rows = [card, card[multi]]
    bud_cols = [f_col, r_col[multi]]
    bud_vals = [bud_f, pb[multi] / byte_scale]
    # Page linking rows: r - P f >= 0 and r - f <= P - 1.
    link_rows_n = 2 * multi.size
    pl_rows = np.concatenate([np.arange(multi.size), multi.size + np.arange(multi.size)]).repeat(2)
    pl_cols = np.stack([
        np.stack([r_col[multi], f_col[multi]], axis=1),
        np.stack([r_col[multi], f_col[multi]], axis=1),
    ]).reshape(-1)
    pl_vals = np.stack([
        np.stack([np.ones(multi.size), -pages[multi].astype(float)], axis=1),
        np.stack([np.ones(multi.size), -np.ones(multi.size)], axis=1),
    ]).reshape(-1)

    base_b = num_time_rows
    base_p = base_b + num_cards
    all_rows = np.concatenate([row_of, np.arange(num_time_rows), base_b + np.concatenate(bud_rows),
                               base_p + pl_rows])
    all_cols = np.concatenate([cols, t_col[row_block], np.concatenate(bud_cols), pl_cols])
    all_vals = np.concatenate([coef, np.ones(num_time_rows), np.concatenate(bud_vals), pl_vals])
    num_rows = base_p + link_rows_n
    matrix = sp.csr_matrix((all_vals, (all_rows, all_cols)), shape=(num_rows, num_cols))
    matrix.sum_duplicates()

    row_lo = np.concatenate([rhs, np.full(num_cards, -np.inf), np.zeros(multi.size),
                             np.full(multi.size, -np.inf)])
    row_hi = np.concatenate([np.full(num_time_rows, np.inf),
                             np.asarray(problem.capacity, dtype=np.float64) / byte_scale,
                             np.full(multi.size, np.inf), pages[multi] - 1.0])
    col_lo = np.zeros(num_cols)
    col_hi = np.concatenate([np.ones(num_x), pages[multi].astype(np.float64),
                             np.full(num_blocks, np.inf)])
    objective = np.concatenate([np.zeros(num_x + multi.size), weight])

    return MilpData(matrix=matrix, row_lo=row_lo, row_hi=row_hi, col_lo=col_lo, col_hi=col_hi,
                    objective=objective, num_int=num_x + multi.size,
                    num_time_rows=num_time_rows, num_cards=num_cards, row_block=row_block,
                    f=f_col, r=r_col, t=t_col, time_scale=time_scale, num_pages=pages)
