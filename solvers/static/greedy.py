"""Greedy placement: density-ordered eviction, then a swap pass on the true sampled objective.

Both execution models run through the same code: the state (stall_state.StallState for
staging, cpu_state.CpuState for cpu execution) prices every move exactly.

Start with every page resident. While a card holds more than its capacity, evict the pages
(the last resident page of an expert) whose eviction raises the sampled objective the least
per byte freed. Prices are exact marginals of the sampled per-step max at the current
placement; starting from everything resident lets them see that a cold expert rides for free
in steps whose layer already waits on another card or link (the order is the reverse of a
density-ordered fill). Ties go to the expert selected least often, then to a seeded random
order. For speed, each round evicts a batch: the cheapest pages in order, at most one per
layer (pages of different layers never interact) and at most `BATCH_SHARE` of a card's
remaining excess, so the order is exact up to the batch. Then `local_search` restores pages
into free capacity and swaps a cold page with a resident one of the same card while that
lowers the true objective.
"""

from __future__ import annotations

import time

import numpy as np

from solvers import cost
from solvers.patterns import LayerPatterns, problem_patterns, selection_counts
from solvers.problem import Placement, Problem, SolveResult, validate
from solvers.static.cpu_state import CpuState
from solvers.static.stall_state import PatternIndex, StallState

BATCH_SHARE = 0.25  # a round evicts at most this share of a card's excess (at least one page)
SWAP_CANDIDATES = 4  # best restores x cheapest evictions tried per card and round
MAX_SWAPS = 5000  # cap on accepted swaps (a count, not a clock, to stay deterministic)


def tie_rank(patterns: list[LayerPatterns], seed: int) -> np.ndarray:
    """[L * E] int distinct rank: less often selected experts first, ties in seeded order."""
    counts = selection_counts(patterns).ravel()
    noise = np.random.default_rng(seed).random(counts.shape)
    rank = np.empty(counts.size, dtype=np.int64)
    rank[np.lexsort((noise, counts))] = np.arange(counts.size)
    return rank


def _ordered(candidates: np.ndarray, score: np.ndarray, rank: np.ndarray) -> np.ndarray:
    """candidates sorted by (score, rank)."""
    return candidates[np.lexsort((rank[candidates], score[candidates]))]


def evict_to_fit(state: PatternIndex, capacity: np.ndarray, rank: np.ndarray) -> None:
    """Evict pages in density order (in batches, see module docstring) until every card fits."""
    num_experts = state.shape[1]
    layer_of = np.arange(state.pages.size) // num_experts
    need = state.card_resident_bytes() - capacity
    rise = state.evict_rise(np.arange(state.entry_row.size))
    delta = np.bincount(state.entry_expert, weights=rise, minlength=state.pages.size)
    size = state.evict_bytes
    while np.any(need > 0):
        open_ = (need[state.card] > 0) & (size > 0)
        candidates = np.flatnonzero(open_)
        if candidates.size == 0:  # cannot happen with capacity >= 0: evicting everything fits
            break
        score = np.full(state.pages.size, np.inf)
        score[candidates] = delta[candidates] / size[candidates]
        open_size = np.bincount(state.card[candidates], weights=size[candidates],
                                minlength=need.size)
        open_count = np.bincount(state.card[candidates], minlength=need.size)
        mean_size = open_size / np.maximum(open_count, 1)
        quota = np.where(
            need > 0, np.maximum(1, np.floor(BATCH_SHARE * need / np.maximum(mean_size, 1))), 0
        ).astype(np.int64)
        window = int(min(quota.sum(), candidates.size))
        if window < candidates.size:
            kth = np.partition(score[candidates], window - 1)[window - 1]
            candidates = candidates[score[candidates] <= kth]
        order = _ordered(candidates, score, rank)[:window]
        _, first = np.unique(layer_of[order], return_index=True)
        order = order[np.sort(first)]  # one per layer, still in (score, rank) order
        cards = state.card[order]
        seen = np.zeros(need.size, dtype=np.int64)
        within = np.empty(order.size, dtype=bool)
        for i, card in enumerate(cards):  # a card's first quota picks
            within[i] = seen[card] < quota[card]
            seen[card] += 1
        chosen = order[within]
        need -= np.bincount(state.card[chosen], weights=size[chosen], minlength=need.size)
        rows = state.move(chosen, -1)
        if rows.size:
            entries = state.entries_of_rows(rows)
            new = state.evict_rise(entries)
            delta += np.bincount(state.entry_expert[entries], weights=new - rise[entries],
                                 minlength=state.pages.size)
            rise[entries] = new


def local_search(state: PatternIndex, capacity: np.ndarray, rank: np.ndarray) -> None:
    """Restore pages into free capacity (most stall saved per byte first, then most often
    selected), then swap one restore with one eviction on a card while that strictly lowers
    the objective. Never exceeds any card's capacity."""
    num_experts = state.shape[1]
    # Per entry prices, kept current for the rows each move touches, and their per expert
    # sums (PatternIndex.per_expert over the layer's entries) for the layers those rows are in.
    every = np.arange(state.entry_row.size)
    entry_evict, entry_restore = state.evict_rise(every), state.restore_drop(every)
    evict = np.bincount(state.entry_expert, weights=entry_evict, minlength=state.pages.size)
    restore = np.bincount(state.entry_expert, weights=entry_restore, minlength=state.pages.size)

    def refresh(rows: np.ndarray) -> None:
        rows = np.unique(rows)
        entries = state.entries_of_rows(rows)
        entry_evict[entries] = state.evict_rise(entries)
        entry_restore[entries] = state.restore_drop(entries)
        for layer in np.unique(state.row_layer[rows]).tolist():
            part = slice(layer * num_experts, (layer + 1) * num_experts)
            span = state.entries_of_layer(layer)
            evict[part] = state.per_expert(layer, entry_evict[span])
            restore[part] = state.per_expert(layer, entry_restore[span])

    ebytes, rbytes = state.evict_bytes, state.restore_bytes
    slack = capacity - state.card_resident_bytes()
    while True:  # fill free capacity
        fits = np.flatnonzero((rbytes > 0) & (rbytes <= slack[state.card]))
        if fits.size == 0:
            break
        x = int(_ordered(fits, restore / np.maximum(rbytes, 1), -rank)[0])
        slack[state.card[x]] -= rbytes[x]
        refresh(state.move(np.array([x]), +1))

    tol = 1e-12 * max(state.objective(), 1e-30)
    on_card = [np.flatnonzero(state.card == c) for c in range(capacity.size)]
    swaps = 0
    improved = True
    while improved and swaps < MAX_SWAPS:
        improved = False
        for card, experts in enumerate(on_card):
            best = _best_swap(state, experts, evict, restore, slack[card], tol)
            if best is None:
                continue
            x_in, x_out = best
            slack[card] += ebytes[x_out] - rbytes[x_in]
            touched = [state.move(np.array([x_out]), -1), state.move(np.array([x_in]), +1)]
            refresh(np.concatenate(touched))
            swaps += 1
            improved = True


def _top(values: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest finite values, largest first."""
    idx = np.flatnonzero(np.isfinite(values))
    if idx.size > k:
        idx = idx[np.argpartition(-values[idx], k - 1)[:k]]
    return idx[np.argsort(-values[idx], kind="stable")]


def _best_swap(
    state: PatternIndex, experts: np.ndarray, evict: np.ndarray, restore: np.ndarray,
    slack: float, tol: float,
) -> tuple[int, int] | None:
    """(restore x, evict y) among a card's experts lowering the objective the most, if any."""
    rbytes, ebytes = state.restore_bytes[experts], state.evict_bytes[experts]
    gain = np.where(rbytes > 0, -restore[experts], -np.inf)
    harm = np.where(ebytes > 0, -evict[experts], -np.inf)  # negated: _top takes the largest
    ins, outs = experts[_top(gain, SWAP_CANDIDATES)], experts[_top(harm, SWAP_CANDIDATES)]
    num_experts = state.shape[1]
    best, best_change = None, -tol
    for x in ins:
        for y in outs:
            if x == y or state.restore_bytes[x] > slack + state.evict_bytes[y]:
                continue
            if x // num_experts == y // num_experts:
                change = _joint_change(state, int(x), int(y))
            else:
                change = evict[y] + restore[x]
            if change < best_change:
                best, best_change = (int(x), int(y)), change
    return best


def _joint_change(state: PatternIndex, x_in: int, x_out: int) -> float:
    """Exact objective change of restoring one page of x_in and evicting one page of x_out,
    two experts of one layer (applied, measured, undone)."""
    layer = x_in // state.shape[1]
    before = state.layer_objective(layer)
    state.move(np.array([x_out]), -1)
    state.move(np.array([x_in]), +1)
    after = state.layer_objective(layer)
    state.move(np.array([x_in]), -1)
    state.move(np.array([x_out]), +1)
    return after - before


def new_state(problem: Problem, patterns: list[LayerPatterns], start: np.ndarray
              ) -> PatternIndex:
    """The incremental state of the problem's execution model at placement `start` [L, E]."""
    kind = CpuState if problem.execution == "cpu" else StallState
    return kind(problem, patterns, start)


def repair_pages(problem: Problem, patterns: list[LayerPatterns], start: np.ndarray,
                 seed: int) -> np.ndarray:
    """[L, E] int resident pages: from `start` ([L, E] pages, may exceed capacity), evict in
    density order until every card fits, then local search."""
    state = new_state(problem, patterns, start)
    rank = tie_rank(patterns, seed)
    capacity = np.asarray(problem.capacity, dtype=np.float64)
    evict_to_fit(state, capacity, rank)
    local_search(state, capacity, rank)
    return state.resident_pages()


def greedy_pages(problem: Problem, patterns: list[LayerPatterns], seed: int) -> np.ndarray:
    """[L, E] int resident pages of the greedy + local search placement for `patterns`."""
    return repair_pages(problem, patterns, problem.num_pages(), seed)


def solve(problem: Problem, seed: int = 0) -> SolveResult:
    """Greedy placement of `problem` (see module docstring). Status "heuristic", no bound."""
    validate(problem)
    start = time.perf_counter()
    placement = Placement(greedy_pages(problem, problem_patterns(problem), seed))
    return SolveResult(
        placement=placement,
        solver="greedy",
        objective=cost.objective(problem, placement),
        bound=float("nan"),
        gap=float("nan"),
        seconds=time.perf_counter() - start,
        status="heuristic",
    )
