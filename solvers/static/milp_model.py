"""The sample-average MILP of a placement problem, built with OR-Tools' model_builder.

Variables, per expert x (flat index layer * E + e) with P_x pages of page size p:
    f_x in {0, 1}          fully resident
    r_x in {0..P_x}        resident pages (only when P_x > 1; else r_x is f_x)
    with  P_x f_x <= r_x <= P_x - 1 + f_x   (r_x = P_x exactly when f_x = 1)
    cold_x = bytes_x - p r_x - (bytes_x - p P_x) f_x
and per block b (a pattern of one layer, weight w_b, see patterns.py):
    t_b >= 0               what the block costs
Constraints under staging (t_b: the block's layer stall):
    t_b >= sum_{x in b, home c} [latency_c (1 - f_x) + cold_x / bandwidth_c]   per card c
    t_b >= sum_{x in b, behind g} cold_x / link_bandwidth_g                    per link g
under cpu execution (t_b: 1 when any expert of the block is cold; w_b its seconds):
    t_b >= 1 - f_x                                                             per x in b
and always
    sum_{x homed on c} (bytes_x - cold_x) <= capacity_c                        per card c
Objective: min sum_b w_b t_b + offset  (= cost.objective at integer points).
Card rows of cards with no selected expert in the block are left out (they read t_b >= 0),
and so is a link row whose block selects experts of a single card c of the link when
link_bandwidth_g >= bandwidth_c (the card row dominates it).

Folding: a block left with a single row (a staging pattern whose selected experts are all on
one card, a cpu pattern of one expert) costs exactly that row's right-hand side, a linear
function of (f, r) that is never negative; it is added to the objective of f and r (and a
constant to `offset`) instead of getting a t_b and a row. The MILP then grows with the
number of multi-card patterns only: on one card every pattern folds and the problem is a
knapsack over the L * E experts whatever the number of calibration steps. Blocks may belong to
groups (robust mode: one per traffic profile); what each group's folded blocks cost is kept
apart (`group_objective`, `group_offset`), so each group's sum can be bounded on its own.
Times are scaled by `time_scale` seconds and bytes by `byte_scale` so coefficients are near 1.
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
    f, r, t, time_scale, num_pages: as in MilpModel (t: the blocks that were not folded, in
    block order; all of them with fold=False).
    offset: constant added to objective @ v (objective units: time_scale seconds).
    group_objective: [G, num_int] objective of the folded blocks of each group, on f and r;
    group_offset: [G] their constants; t_group: [len(t)] group of each kept block. The sums
    over groups are objective[:num_int] and offset.
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
    offset: float
    group_objective: np.ndarray
    group_offset: np.ndarray
    t_group: np.ndarray


@dataclass
class MilpModel:
    """model: the MILP. f, r, t: variable indices ([L * E], [L * E] or -1 where r is f,
    [blocks not folded]). time_scale: seconds per objective unit; offset: constant objective
    units the model leaves out; block_weight: objective weight of each t."""

    model: mb.Model
    f: np.ndarray
    r: np.ndarray
    t: np.ndarray
    time_scale: float
    num_pages: np.ndarray
    offset: float
    block_weight: np.ndarray

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


def model_of(data: MilpData, integral: bool = True) -> MilpModel:
    """The model_builder MILP of `data` (its LP relaxation when not `integral`)."""
    model = mb.Model()
    model.helper.fill_model_from_sparse_data(
        data.col_lo, data.col_hi, data.objective, data.row_lo, data.row_hi, data.matrix)
    for col in range(data.num_int if integral else 0):
        model.helper.set_var_integrality(col, True)
    return MilpModel(model=model, f=data.f, r=data.r, t=data.t, time_scale=data.time_scale,
                     num_pages=data.num_pages, offset=data.offset,
                     block_weight=data.objective[data.t])


@dataclass(frozen=True)
class _Columns:
    """The expert columns and what a cold expert costs in them, per expert x ([L * E]):
    cold_x = bytes_x + fc_single_x f_x (+ rc_x r_x where P_x > 1)."""

    eb: np.ndarray
    pb: np.ndarray
    pages: np.ndarray
    multi: np.ndarray
    f_col: np.ndarray
    r_col: np.ndarray
    fc: np.ndarray
    rc: np.ndarray
    fc_single: np.ndarray


def _columns(problem: Problem) -> _Columns:
    eb = np.asarray(problem.expert_bytes, dtype=np.float64).ravel()
    pages = problem.num_pages().ravel()
    pb = eb if problem.page_bytes is None else np.full_like(eb, float(problem.page_bytes))
    multi = np.flatnonzero(pages > 1)
    r_col = np.full(eb.size, -1, dtype=np.int64)
    r_col[multi] = eb.size + np.arange(multi.size)
    fc = -(eb - pb * pages)
    rc = -pb
    return _Columns(eb, pb, pages, multi, np.arange(eb.size), r_col, fc, rc,
                    np.where(pages > 1, fc, fc + rc))


@dataclass(frozen=True)
class _Rows:
    """Time-row entries t_block + coef * column >= sum of const, before scaling: entries
    (key, column, coef, const) with the block of each entry's row; block weights."""

    key: np.ndarray
    col: np.ndarray
    coef: np.ndarray
    const: np.ndarray
    block: np.ndarray
    weight: np.ndarray


def _stage_rows(problem: Problem, patterns: list[LayerPatterns], cols: _Columns) -> _Rows:
    """Card and link rows of every staging pattern (module docstring), in seconds."""
    num_experts = problem.num_experts
    cards = problem.cards
    num_cards, num_links = cards.num_cards, cards.num_links
    latency = np.asarray(cards.latency, dtype=np.float64)
    bandwidth = np.asarray(cards.bandwidth, dtype=np.float64)
    link_of = np.asarray(cards.link_of)
    link_bw = np.asarray(cards.link_bandwidth, dtype=np.float64)
    card = np.asarray(problem.home).ravel()
    sel = np.concatenate([p.selected for p in patterns])
    block_layer = np.concatenate(
        [np.full(p.selected.shape[0], layer) for layer, p in enumerate(patterns)])
    num_blocks = sel.shape[0]
    blocks, local = np.nonzero(sel)
    x = block_layer[blocks] * num_experts + local
    c = card[x]
    g = link_of[c]
    eb, fc_single, rc, r_col = cols.eb, cols.fc_single, cols.rc, cols.r_col
    parts = []  # (key, block, column, coefficient, constant)

    def add(key, block, xs, per_f, per_r, const):
        parts.append((key, block, cols.f_col[xs], per_f, const))
        has_r = r_col[xs] >= 0
        parts.append((key[has_r], block[has_r], r_col[xs][has_r], per_r[has_r],
                      np.zeros(has_r.sum())))

    # Card rows: t_b + sum [lat f + (-cold coefficient) / bw] >= sum (lat + bytes / bw).
    add(blocks * num_cards + c, blocks, x, latency[c] - fc_single[x] / bandwidth[c],
        -rc[x] / bandwidth[c], latency[c] + eb[x] / bandwidth[c])
    # Link rows, skipping those a single card's row dominates.
    link_key = blocks * num_links + g
    cards_on = np.zeros((num_blocks * num_links, num_cards), dtype=bool)
    cards_on[link_key, c] = True
    single = cards_on.sum(axis=1) == 1
    dominated = single & (link_bw[np.arange(num_blocks * num_links) % num_links]
                          >= bandwidth[cards_on.argmax(axis=1)])
    keep = ~dominated[link_key]
    xk, gk = x[keep], g[keep]
    add(num_blocks * num_cards + link_key[keep], blocks[keep], xk,
        -fc_single[xk] / link_bw[gk], -rc[xk] / link_bw[gk], eb[xk] / link_bw[gk])
    key, block, col, coef, const = (np.concatenate(p) for p in zip(*parts, strict=True))
    return _Rows(key, col, coef, const, block, np.concatenate([p.weight for p in patterns]))


def _cpu_rows(patterns: list[LayerPatterns], num_experts: int, cols: _Columns) -> _Rows:
    """One row t_b + f_x >= 1 per expert x of every cpu pattern b (weight: its seconds)."""
    sel = np.concatenate([p.selected for p in patterns])
    block_layer = np.concatenate(
        [np.full(p.selected.shape[0], layer) for layer, p in enumerate(patterns)])
    blocks, local = np.nonzero(sel)
    x = block_layer[blocks] * num_experts + local
    ones = np.ones(x.size)
    return _Rows(np.arange(x.size), cols.f_col[x], ones, ones, blocks,
                 np.concatenate([p.weight for p in patterns]))


def milp_data(problem: Problem, patterns: list[LayerPatterns],
              block_group: np.ndarray | None = None) -> MilpData:
    """The sparse arrays of the MILP of `problem` over `patterns` (see module docstring).
    block_group: [num patterns] int group of each pattern (in pattern order, layer by layer);
    default one group."""
    cards = problem.cards
    num_cards = cards.num_cards
    cols = _columns(problem)
    num_x, multi, pages = cols.eb.size, cols.multi, cols.pages
    card = np.asarray(problem.home).ravel()
    if problem.execution == "cpu":
        rows = _cpu_rows(patterns, problem.num_experts, cols)
        positive = rows.weight[rows.weight > 0]
        time_scale = float(np.median(positive)) if positive.size else 1.0
        weight = rows.weight / time_scale  # t_b in [0, 1]; its seconds are in the weight
        coef, const = rows.coef, rows.const
    else:
        rows = _stage_rows(problem, patterns, cols)
        latency = np.asarray(cards.latency, dtype=np.float64)
        bandwidth = np.asarray(cards.bandwidth, dtype=np.float64)
        time_scale = float(np.median(latency[card] + cols.eb / bandwidth[card]))
        weight = rows.weight
        coef, const = rows.coef / time_scale, rows.const / time_scale
    byte_scale = float(cols.eb.max())

    row_keys, first, row_of = np.unique(rows.key, return_index=True, return_inverse=True)
    row_of = row_of.ravel()
    row_block = rows.block[first]
    per_block = np.bincount(row_block, minlength=weight.size)
    folded_row = per_block[row_block] == 1
    # Folded rows: w_b * (const - coef . v) joins the objective of its block's group.
    group = np.zeros(weight.size, np.int64) if block_group is None else np.asarray(block_group)
    num_groups = int(group.max(initial=0)) + 1
    group_objective = np.zeros((num_groups, num_x + multi.size))
    entry_folded = folded_row[row_of]
    b = rows.block[entry_folded]
    w = weight[b]
    np.add.at(group_objective, (group[b], rows.col[entry_folded]), -w * coef[entry_folded])
    group_offset = np.bincount(group[b], weights=w * const[entry_folded], minlength=num_groups)
    # Kept rows and blocks, renumbered.
    kept_rows = np.flatnonzero(~folded_row)
    new_row = np.full(row_keys.size, -1)
    new_row[kept_rows] = np.arange(kept_rows.size)
    kept_blocks = np.unique(row_block[kept_rows])
    t_of_block = np.full(weight.size, -1, dtype=np.int64)
    t_of_block[kept_blocks] = num_x + multi.size + np.arange(kept_blocks.size)
    num_time_rows = kept_rows.size
    num_cols = num_x + multi.size + kept_blocks.size
    keep = ~entry_folded
    entry_row = new_row[row_of[keep]]
    rhs = np.bincount(entry_row, weights=const[keep], minlength=num_time_rows)
    time_block = row_block[kept_rows]

    # Budget rows: sum (pb r + (bytes - pb P) f) <= capacity, scaled by byte_scale.
    bud_f = np.where(pages > 1, -cols.fc, cols.eb) / byte_scale
    bud_rows = [card, card[multi]]
    bud_cols = [cols.f_col, cols.r_col[multi]]
    bud_vals = [bud_f, cols.pb[multi] / byte_scale]
    # Page linking rows: r - P f >= 0 and r - f <= P - 1.
    link_rows_n = 2 * multi.size
    pl_rows = np.concatenate([np.arange(multi.size), multi.size + np.arange(multi.size)]).repeat(2)
    pair = np.stack([cols.r_col[multi], cols.f_col[multi]], axis=1)
    pl_cols = np.stack([pair, pair]).reshape(-1)
    pl_vals = np.stack([
        np.stack([np.ones(multi.size), -pages[multi].astype(float)], axis=1),
        np.stack([np.ones(multi.size), -np.ones(multi.size)], axis=1),
    ]).reshape(-1)

    base_b = num_time_rows
    base_p = base_b + num_cards
    all_rows = np.concatenate([entry_row, np.arange(num_time_rows),
                               base_b + np.concatenate(bud_rows), base_p + pl_rows])
    all_cols = np.concatenate([rows.col[keep], t_of_block[time_block],
                               np.concatenate(bud_cols), pl_cols])
    all_vals = np.concatenate([coef[keep], np.ones(num_time_rows), np.concatenate(bud_vals),
                               pl_vals])
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
                             np.full(kept_blocks.size, np.inf)])
    objective = np.concatenate([group_objective.sum(axis=0), weight[kept_blocks]])

    return MilpData(matrix=matrix, row_lo=row_lo, row_hi=row_hi, col_lo=col_lo, col_hi=col_hi,
                    objective=objective, num_int=num_x + multi.size,
                    num_time_rows=num_time_rows, num_cards=num_cards,
                    row_block=t_of_block[time_block] - (num_x + multi.size), f=cols.f_col,
                    r=cols.r_col, t=t_of_block[kept_blocks], time_scale=time_scale,
                    num_pages=pages, offset=float(group_offset.sum()),
                    group_objective=group_objective, group_offset=group_offset,
                    t_group=group[kept_blocks])
