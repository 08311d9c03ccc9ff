"""Pin for the cache: each card's budget split between pinned experts and per-layer cache slots.

Per (card, MoE layer) the choice is (p, q): p pinned experts, q cache slots. With per-layer
caches (solvers/cache/partition.py) the layers do not interact, so the cost of a layer under
(p, q) can be measured for every layer at once by replaying the traffic with (p, q) in every
layer, and a knapsack over the layers picks the best (p_l, q_l) within the budget exactly
(for the costs measured). Three things keep the choice honest:

- The costs are cross-validated: the calibration sequences are cut into folds; for each
  fold the pins are ranked on the other folds and the misses counted on the fold itself, so
  a split is judged on traffic it was not chosen on.
- Pins are ranked for the cache, not by frequency: by the misses of each expert under the
  layer's cache with q slots and nothing pinned (ties: selections). An expert the cache
  keeps warm gains little from a pin; one with long reuse distances gains a miss per use.
  Frequency pins never helped a cache on held-out gpt-oss decode routing (the hottest
  experts are those a cache keeps anyway); miss-ranked pins saved 5-9% of the stall.
- Pins are capped at `pin_share` of a layer's units (p <= pin_share (p + q)). Uncapped, the
  knapsack pins for the calibration task (best in profile: 43.2 tok/s on ESFT intent, above
  the static oracle's 41.1) and loses 20-30% to a plain cache on unseen tasks; capped at a
  quarter it keeps 1.67-1.85x static's tok/s on every unseen ESFT task and stays within 3%
  of the better of static and a plain cache everywhere (benchmarks/bench_routing.py).

A layer's fetch uses only its own slots, so the staging buffer must hold what a fetch needs
beyond the smallest layer quota: max(0, n - min_l q_l) experts (solvers/staging.py). The
knapsack runs once per candidate floor m of the quotas, with the buffer's units taken off.

Cost of a miss: one copy of a whole expert, latency + bytes / bandwidth of its card, summed
over a card's layers. On one card that is the stall exactly; with several cards the stall of
a layer is the max over cards, which this sum only bounds from above.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial

import numpy as np

from solvers.cache import even_quotas, make_policy
from solvers.cache.replay import Requests
from solvers.staging import cache_only_slots

GRID_POINTS = 17  # q values tried per layer (and p values for the curve)
CURVE = (0.0, 0.25, 0.5, 0.75, 1.0)  # shares of a card's units as slots, equal per layer


@dataclass(frozen=True)
class Scenario:
    """One calibration traffic at one concurrency, its steps' selections as the caches see
    them (solvers.cache.replay.Requests, in the order served): all of its steps, and per fold
    the steps of the other folds' sequences (train) and of the fold's own (held); `weight`
    its share of the objective."""

    name: str
    whole: Requests
    folds: list[tuple[Requests, Requests]]
    weight: float


@dataclass(frozen=True)
class SplitProblem:
    """home: [L, E] card of each expert; miss_s: [C] seconds one miss costs on each card;
    units: [C] budget of each card in experts (pins, slots and staging, whole experts of one
    size); fetch_limit: [C] the most experts one layer's fetch needs on each card."""

    home: np.ndarray
    miss_s: np.ndarray
    units: np.ndarray
    fetch_limit: np.ndarray
    policy: str
    pin_share: float = 0.25
    pin_rule: str = "misses"  # or "frequency": rank pins by selections (the static way)
    search_rounds: int = 0    # rounds of the local search over pin swaps (_search)

    @property
    def num_cards(self) -> int:
        return len(self.units)


@dataclass
class Split:
    """pinned: [L, E] bool; quotas: [C, L] cache slots; staging: [C] experts of staging
    buffer; stall_s: the cross-validated stall per step (weighted over scenarios) of this
    split; curve: the same for equal per-layer slots at each share of CURVE."""

    pinned: np.ndarray
    quotas: np.ndarray
    staging: np.ndarray
    stall_s: float
    curve: list[dict] = field(default_factory=list)


def solve_split(problem: SplitProblem, scenarios: list[Scenario],
                slots: int | None = None) -> Split:
    """The best split (slots None), or `slots` slots per card spread evenly over the layers
    with the rest of each budget pinned (no pin cap: the split is the caller's)."""
    layers, width = problem.home.shape
    grid = _grid(width)
    fixed = None if slots is None else even_quotas([slots] * problem.num_cards, layers)
    columns = sorted(set(_curve_columns(problem, grid))
                     | (set() if fixed is None else set(fixed.ravel().tolist())))
    cells = sorted({(p, q) for q in grid for p in grid
                    if p + q <= width and p <= problem.pin_share * (p + q)}
                   | {(p, q) for q in columns for p in grid if p + q <= width})
    table = CostTable(problem, scenarios, cells)
    if fixed is None:
        plan = _knapsack(problem, table, [(p, q) for p, q in cells
                                          if p <= problem.pin_share * (p + q)])
    else:
        plan = _fixed(problem, table, fixed, cells)
    chosen = first(plan.p, width)
    if problem.search_rounds:
        chosen, stall = _search(problem, scenarios, plan)
        plan = _Plan(plan.p, plan.q, plan.staging, stall)
    split = _final(problem, scenarios, plan, chosen)
    split.curve = _curve(problem, table, grid)
    return split


def _grid(width: int) -> list[int]:
    step = max(1, -(-width // (GRID_POINTS - 1)))
    return sorted(set(range(0, width + 1, step)) | {width})


def _curve_columns(problem: SplitProblem, grid: list[int]) -> list[int]:
    """The q per layer of each share of CURVE: that share of the most slots the mean card
    holds with nothing pinned (on the grid, rounded down so that the whole share fits)."""
    layers = problem.home.shape[0]
    most = cache_only_slots(problem.units, problem.fetch_limit, layers).mean() / layers
    return [max(g for g in grid if g <= share * most + 1e-9) for share in CURVE]


class CostTable:
    """cost(p, q): [C, L] cross-validated seconds of stall per step of every (card, layer)
    with p pins and q slots in each layer (see module docstring)."""

    def __init__(self, problem: SplitProblem, scenarios: list[Scenario],
                 cells: list[tuple[int, int]]) -> None:
        self.problem = problem
        layers = problem.home.shape[0]
        self.cost = {cell: np.zeros((problem.num_cards, layers)) for cell in cells}
        with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
            for sc in scenarios:
                for train, held in sc.folds:
                    scale = sc.weight / (held.shape[0] * len(sc.folds))
                    for cell, m in self.fold(pool, train, held, cells).items():
                        self.cost[cell] += m * problem.miss_s[:, None] * scale

    def fold(self, pool: ThreadPoolExecutor, train: Requests, held: Requests,
             cells: list[tuple[int, int]]) -> dict[tuple[int, int], np.ndarray]:
        """[C, L] held-out misses of every cell, pins ranked on `train` (compiled replays
        release the GIL: one thread per core)."""
        qs = sorted({q for _, q in cells})
        ranks = dict(zip(qs, pool.map(partial(self.rank, train), qs), strict=True))
        misses = pool.map(lambda cell: self.misses(held, ranks[cell[1]], *cell), cells)
        return dict(zip(cells, misses, strict=True))

    def rank(self, steps: Requests, q: int) -> np.ndarray:
        """[L, E] order of each layer's experts as pins under q slots: most misses first."""
        quotas = np.full((self.problem.num_cards, steps.shape[1]), q)
        return rank_pins(self.problem, steps, quotas)

    def misses_per_expert(self, steps: Requests, pinned: np.ndarray, q: int) -> np.ndarray:
        """[L, E] misses of each expert over `steps` with `pinned` and q slots per layer."""
        return expert_misses(self.problem, steps, pinned,
                             np.full((self.problem.num_cards, steps.shape[1]), q))

    def misses(self, steps: Requests, rank: np.ndarray, p: int, q: int) -> np.ndarray:
        """[C, L] misses over `steps` with the top-p of `rank` pinned in each (card, layer),
        q slots."""
        home = self.problem.home
        pinned = pins_of(rank, first(np.full((self.problem.num_cards, home.shape[0]), p),
                                     home.shape[1]), home)
        per_expert = self.misses_per_expert(steps, pinned, q)
        return per_card(per_expert, home, self.problem.num_cards)

    def __call__(self, p: int, q: int) -> np.ndarray:
        return self.cost[(p, q)]


def expert_misses(problem: SplitProblem, steps: Requests, pinned: np.ndarray,
                  quotas: np.ndarray) -> np.ndarray:
    """[L, E] misses of each expert over `steps` with `pinned` and quotas [C, L] slots."""
    _, layers, experts = steps.shape
    cache = make_policy(problem.policy, quotas, layers * experts)
    return steps.misses(cache, ~pinned, problem.home)


def rank_pins(problem: SplitProblem, steps: Requests, quotas: np.ndarray) -> np.ndarray:
    """[L, E] each layer's experts in the order they are worth pinning beside `quotas` slots:
    by the misses the cache would have on them with nothing pinned (`pin_rule` "misses"), or
    by selections ("frequency")."""
    chosen = selections(steps)
    if problem.pin_rule == "frequency":
        return pin_order(chosen, chosen)
    nothing = np.zeros(problem.home.shape, dtype=bool)
    return pin_order(expert_misses(problem, steps, nothing, quotas), chosen)


def selections(steps: Requests) -> np.ndarray:
    """[L, E] how often each expert was selected."""
    _, layers, experts = steps.shape
    return np.bincount(steps.keys, minlength=layers * experts).reshape(layers, experts)


def pin_order(misses: np.ndarray, selections: np.ndarray) -> np.ndarray:
    """[L, E] each layer's experts, most misses first (ties: most selections)."""
    return np.lexsort((-selections, -misses), axis=-1)


def first(counts: np.ndarray, width: int) -> np.ndarray:
    """[C, L, E] bool: the first counts[c, l] rank positions of each (card, layer)."""
    return np.arange(width)[None, None, :] < counts[:, :, None]


def pins_of(rank: np.ndarray, chosen: np.ndarray, home: np.ndarray) -> np.ndarray:
    """[L, E] bool: in each (card, layer), the experts at the rank positions chosen[c, l]
    (positions counted among the experts of the layer's `rank` that card c homes)."""
    out = np.zeros(rank.shape, dtype=bool)
    for layer, order in enumerate(rank):
        seen = np.zeros(len(chosen), dtype=np.int64)
        for e in order:
            c = home[layer, e]
            out[layer, e] = chosen[c, layer, seen[c]]
            seen[c] += 1
    return out


def per_card(per_expert: np.ndarray, home: np.ndarray, num_cards: int) -> np.ndarray:
    """[L, E] -> [C, L] sums over the experts each card homes."""
    return np.stack([(per_expert * (home == c)).sum(axis=1) for c in range(num_cards)])


@dataclass(frozen=True)
class _Plan:
    p: np.ndarray       # [C, L] pins
    q: np.ndarray       # [C, L] slots
    staging: np.ndarray  # [C] experts
    stall_s: float


def _knapsack(problem: SplitProblem, table: CostTable, allowed: list[tuple[int, int]]
              ) -> _Plan:
    """Per card, the (p_l, q_l) of least summed cost within its units, over every floor m
    of the quotas (the staging buffer holds fetch_limit - m experts)."""
    layers = problem.home.shape[0]
    p = np.zeros((problem.num_cards, layers), dtype=np.int64)
    q = np.zeros_like(p)
    staging = np.zeros(problem.num_cards, dtype=np.int64)
    total = 0.0
    for c in range(problem.num_cards):
        homes = (problem.home == c).any(axis=1)
        best = None
        for floor in sorted({0, *(q for _, q in allowed if q <= problem.fetch_limit[c])}):
            room = int(problem.units[c]) - max(0, int(problem.fetch_limit[c]) - floor)
            options = [[cell for cell in allowed if cell[1] >= floor] if homes[layer]
                       else [(0, 0)] for layer in range(layers)]
            found = _layer_knapsack([[table(*cell)[c, layer] for cell in options[layer]]
                                     for layer in range(layers)],
                                    [[sum(cell) for cell in row] for row in options], room)
            if found is not None and (best is None or found[0] < best[0]):
                best = (found[0], [options[layer][i] for layer, i in enumerate(found[1])],
                        floor)
        if best is None:
            raise ValueError(f"card {c}: {problem.units[c]} experts of budget hold no split")
        total += best[0]
        p[c], q[c] = np.array(best[1]).T
        staging[c] = max(0, int(problem.fetch_limit[c]) - best[2])
    return _Plan(p, q, staging, total)


def _layer_knapsack(costs: list[list[float]], units: list[list[int]], room: int
                    ) -> tuple[float, list[int]] | None:
    """Choose one option per layer (option i of a layer costs costs[layer][i] and takes
    units[layer][i]) of least total cost within `room` units; (cost, choice per layer), or
    None."""
    if room < 0:
        return None
    inf = np.inf
    best = np.zeros(room + 1)
    choice = []
    for row, row_units in zip(costs, units, strict=True):
        new = np.full(room + 1, inf)
        arg = np.full(room + 1, -1, dtype=np.int64)
        for i, (cost, u) in enumerate(zip(row, row_units, strict=True)):
            if u > room:
                continue
            cand = np.full(room + 1, inf)
            cand[u:] = best[:room + 1 - u] + cost
            better = cand < new
            new[better], arg[better] = cand[better], i
        best = new
        choice.append(arg)
    end = int(np.argmin(best))
    if not np.isfinite(best[end]):
        return None
    picks, at = [], end
    for layer in range(len(costs) - 1, -1, -1):
        i = int(choice[layer][at])
        picks.append(i)
        at -= units[layer][i]
    return float(best[end]), picks[::-1]


def _fixed(problem: SplitProblem, table: CostTable, quotas: np.ndarray,
           cells: list[tuple[int, int]]) -> _Plan:
    """quotas[c, l] slots; the pins that fit beside them in each card's budget, by the
    knapsack (ValueError when the slots alone do not fit)."""
    layers = problem.home.shape[0]
    staging = np.maximum(0, problem.fetch_limit - quotas.min(axis=1))
    p = np.zeros_like(quotas)
    total = 0.0
    for c in range(problem.num_cards):
        options = [[cell for cell in cells if cell[1] == quotas[c, layer]]
                   for layer in range(layers)]
        found = _layer_knapsack([[table(*cell)[c, layer] for cell in options[layer]]
                                 for layer in range(layers)],
                                [[sum(cell) for cell in row] for row in options],
                                int(problem.units[c]) - int(staging[c]))
        if found is None:
            raise ValueError(f"card {c}: {int(quotas[c].sum())} cache slots do not fit its "
                             f"budget of {problem.units[c]} experts")
        total += found[0]
        p[c] = [options[layer][i][0] for layer, i in enumerate(found[1])]
    return _Plan(p, quotas.copy(), staging, total)


def _final(problem: SplitProblem, scenarios: list[Scenario], plan: _Plan,
           chosen: np.ndarray) -> Split:
    """The plan's pins (rank positions `chosen`) ranked on all of the calibration traffic,
    under its quotas."""
    layers, width = problem.home.shape
    misses, picks = np.zeros((layers, width)), np.zeros((layers, width))
    nothing = np.zeros((layers, width), dtype=bool)
    for sc in scenarios:
        picks += sc.weight * selections(sc.whole)
        if problem.pin_rule != "frequency":
            misses += sc.weight * expert_misses(problem, sc.whole, nothing, plan.q)
    rank = pin_order(picks if problem.pin_rule == "frequency" else misses, picks)
    return Split(pins_of(rank, chosen, problem.home), plan.q, plan.staging, plan.stall_s)


def _search(problem: SplitProblem, scenarios: list[Scenario], plan: _Plan
            ) -> tuple[np.ndarray, float]:
    """Local search over the pins: in round j every (card, layer) with pins tries its
    lowest-ranked pin swapped for rank position p + j - 1 (each fold's rank from its own
    training folds), keeping the swap where the held-out cost falls; all layers are tried in
    the same replay, since they do not interact. (chosen positions [C, L, E], cost)."""
    width = problem.home.shape[1]
    chosen = first(plan.p, width)
    cost = _positions_cost(problem, scenarios, plan.q, chosen)
    for j in range(1, problem.search_rounds + 1):
        trial = chosen.copy()
        for c, layer in zip(*np.nonzero(plan.p), strict=True):
            picked = np.flatnonzero(chosen[c, layer])
            spare = [i for i in range(plan.p[c, layer] + j - 1, width)
                     if not chosen[c, layer, i]]
            if spare:
                trial[c, layer, picked[-1]] = False
                trial[c, layer, spare[0]] = True
        got = _positions_cost(problem, scenarios, plan.q, trial)
        better = got < cost
        chosen[better], cost[better] = trial[better], got[better]
    return chosen, float(cost.sum())


def _positions_cost(problem: SplitProblem, scenarios: list[Scenario], quotas: np.ndarray,
                    chosen: np.ndarray) -> np.ndarray:
    """[C, L] cross-validated cost of pinning rank positions `chosen` beside `quotas`."""
    cost = np.zeros(quotas.shape)
    for sc in scenarios:
        for train, held in sc.folds:
            pinned = pins_of(rank_pins(problem, train, quotas), chosen, problem.home)
            misses = per_card(expert_misses(problem, held, pinned, quotas), problem.home,
                              problem.num_cards)
            cost += misses * problem.miss_s[:, None] * sc.weight / (held.shape[0]
                                                                    * len(sc.folds))
    return cost


def _curve(problem: SplitProblem, table: CostTable, grid: list[int]) -> list[dict]:
    """Cross-validated stall of equal per-layer slots at each share of CURVE (pins, by the
    knapsack, in the rest of each budget); a share whose slots do not fit is left out."""
    out = []
    cells = list(table.cost)
    layers = problem.home.shape[0]
    for share, q in zip(CURVE, _curve_columns(problem, grid), strict=True):
        quotas = np.full((problem.num_cards, layers), q, dtype=np.int64)
        try:
            plan = _fixed(problem, table, quotas, cells)
        except ValueError:
            continue
        out.append({"slots_share": share, "slots_per_layer": q, "stall_s": plan.stall_s})
    return out
