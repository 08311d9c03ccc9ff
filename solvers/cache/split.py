"""Pin for the cache: each card's budget split between pinned experts and per-layer cache slots.

Per (card, MoE layer) the choice is (p, q): p pinned experts, q cache slots. With per-layer
caches (solvers/cache/partition.py) the layers do not interact, so the cost of a split is
the sum of its (card, layer) cells' costs, each measured for every layer at once on held-out
folds (solvers/cache/costs.py), and a knapsack over the layers picks the best (p_l, q_l)
within a card's budget exactly (for the costs measured).

The split is chosen among candidates, every one judged on the same held-out folds, and the
best of them is returned (the table `placer solve` prints is these figures):
- static: pins only, no slots, as many as fit (`placer solve` places it with --solver);
- plain cache: the whole budget as even per-layer slots, nothing pinned (what an engine's
  expert cache does with the same VRAM);
- a split for each pin cap of CAPS (p <= cap (p + q) in every layer, by the knapsack);
- equal slots per layer at each share of CURVE, the rest pinned (the curve).
A candidate that chooses (the knapsack) is judged nested: for each held-out unit (a fold of
the sequences, or with several trace sets a whole set), it is chosen on the other units and
its cost counted on the held-out one. So the pin cap is chosen from the data: a cap that
pins for the calibration traffic loses where the held-out traffic differs. (With one trace
set the folds cannot see another task; the costs of the other units were ranked with the
held-out unit among their training folds, a small leak the nesting does not remove.)

Pins are ranked for the cache, not by frequency: by the misses of each expert under the
layer's cache with q slots and nothing pinned (ties: selections). An expert the cache keeps
warm gains little from a pin; one with long reuse distances gains a miss per use.

The staging buffer is a reserve of n experts (a fetch's most, solvers/staging.py) whatever
the slots: pins and slots share the rest of the budget, so the split never holds more expert
VRAM than the baselines it is judged against at the same budget.

Cost of a miss: one copy of a whole expert, latency + bytes / bandwidth of its card, summed
over a card's layers. On one card that is the stall exactly; with several cards the stall of
a layer is the max over cards, which this sum only bounds from above.

The p and q values tried per (card, layer) are a grid over 0 .. the widest (card, layer),
GRID_POINTS values where the replays fit REPLAY_KEYS requests, fewer where they do not.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from solvers.cache import even_quotas
from solvers.cache.choice import PLAIN, Folds, PolicyChoice, choose_policy, with_weights
from solvers.cache.costs import Cell, CostProblem, CostTable, Scenario, first, pin_order, pins_of
from solvers.staging import cache_only_slots

GRID_POINTS = 9         # p and q values per (card, layer), where the replay budget allows
REPLAY_KEYS = 2.0e9     # requests the cost table replays at most (about a minute on 2 cores)
CURVE = (0.0, 0.25, 0.5, 0.75, 1.0)  # shares of a card's most slots, equal per layer
CAPS = (0.25, 0.5, 1.0)  # pin caps tried: p <= cap (p + q)
RENAMED_KEYS = 1.0e8    # requests the renamed figure of the default replays at most

__all__ = ["CAPS", "CURVE", "RENAMED_KEYS", "Layout", "Scenario", "Split", "SplitProblem",
           "replay_count", "solve_split"]


@dataclass(frozen=True)
class SplitProblem:
    """home: [L, E] card of each expert; miss_s: [C] seconds one miss costs on each card;
    units: [C] budget of each card in experts (pins, slots and staging, whole experts of one
    size); fetch_limit: [C] the most experts one layer's fetch needs on each card: its
    staging reserve, taken off the units before pins and slots."""

    home: np.ndarray
    miss_s: np.ndarray
    units: np.ndarray
    fetch_limit: np.ndarray
    policy: str
    caps: tuple[float, ...] = CAPS
    pin_rule: str = "misses"  # or "frequency": rank pins by selections (the static way)
    choose: tuple[str, ...] = ()  # policies to choose among (solvers/cache/choice.py)

    @property
    def num_cards(self) -> int:
        return len(self.units)


@dataclass(frozen=True)
class Family:
    """One candidate: `kind` static | cache | split | slots; the cells its knapsack may
    pick (static, split) or its fixed slots quotas [C, L] (cache, slots)."""

    name: str
    kind: str
    cells: list[Cell]
    quotas: np.ndarray | None = None
    pin_cap: float | None = None
    share: float | None = None


@dataclass(frozen=True)
class _Plan:
    p: np.ndarray        # [C, L] pins
    q: np.ndarray        # [C, L] slots
    staging: np.ndarray  # [C] experts


@dataclass(frozen=True)
class Layout:
    """A candidate's pins and slots fitted on all of the calibration entries: pinned [L, E]
    bool, quotas [C, L] slots, staging [C] experts (what Split holds for the chosen one)."""

    pinned: np.ndarray
    quotas: np.ndarray
    staging: np.ndarray


@dataclass
class Split:
    """pinned: [L, E] bool; quotas: [C, L] cache slots; staging: [C] experts of staging
    buffer; kind: the chosen candidate's (static: `placer solve` places its pins with
    --solver); stall_s: its held-out stall per step (weighted over scenarios by their
    shares); objective: what was minimized (the stall, or under regret weights the mean
    ratio of each scenario's stall to its plain cache's); candidates: every candidate's
    figures, the chosen one marked; unlike_stall_s: its held-out stall on the renamed twins
    of the scenarios (traffic unlike the calibration; None where there are none); policy:
    the policy chosen to serve it (problem.choose; None: problem.policy), whose figures
    stall_s, objective and unlike_stall_s then are; layouts: each candidate's pins and slots
    (in the order of `candidates`), for objectives judged beside the split's (prefetch:
    placer/plan/prefetch.py)."""

    pinned: np.ndarray
    quotas: np.ndarray
    staging: np.ndarray
    kind: str
    stall_s: float
    objective: float
    candidates: list[dict] = field(default_factory=list)
    unlike_stall_s: float | None = None
    policy: PolicyChoice | None = None
    layouts: list[Layout] = field(default_factory=list)


def families(problem: SplitProblem, slots: int | None, step: int) -> list[Family]:
    """The candidates (see module docstring), or with `slots` only that many per card."""
    layers = problem.home.shape[0]
    width = _width(problem)
    grid = sorted(set(range(0, width + 1, step)) | {width})
    pins = [p for p in grid if p > 0]
    if slots is not None:
        quotas = even_quotas([slots] * problem.num_cards, layers)
        return [Family(f"{slots} slots per card", "slots", _slot_cells(quotas, grid, width),
                       quotas)]
    most = cache_only_slots(problem.units, problem.fetch_limit)
    plain = even_quotas(most, layers)
    out = [Family("static", "static", [(p, 0) for p in grid]),
           Family("plain cache", "cache", [(0, int(q)) for q in np.unique(plain)], plain)]
    for cap in problem.caps:
        out.append(Family(f"split, pins <= {cap:g} of a layer", "split",
                          [(p, q) for q in grid for p in [0, *pins]
                           if p + q <= width and p <= cap * (p + q)], pin_cap=cap))
    for share in CURVE[1:]:
        quotas = np.full((problem.num_cards, layers), int(share * most.min() // layers))
        out.append(Family(f"{int(quotas[0, 0])} slots per layer, the rest pinned", "slots",
                          _slot_cells(quotas, grid, width), quotas, share=share))
    return out


def _width(problem: SplitProblem) -> int:
    """The most experts one card homes in one layer."""
    return int(max((problem.home == c).sum(axis=1).max() for c in range(problem.num_cards)))


def _slot_cells(quotas: np.ndarray, grid: list[int], width: int) -> list[Cell]:
    return [(p, int(q)) for q in np.unique(quotas) for p in grid if p + q <= width]


def _cells(fams: list[Family]) -> list[Cell]:
    return sorted({cell for f in fams for cell in f.cells})


def _replays(cells: list[Cell]) -> int:
    """Replays per fold entry the cells need (solvers/cache/costs.py)."""
    return len({q for _, q in cells if q > 0}) + sum(1 for p, q in cells if p > 0 and q > 0)


def _step(problem: SplitProblem, scenarios: list[Scenario], slots: int | None) -> int:
    """The grid step: the finest of GRID_POINTS or fewer values whose replays fit
    REPLAY_KEYS requests (at least 3 values: 0, half and all of the widest layer)."""
    width = _width(problem)
    keys = sum(len(f.keys) for sc in scenarios for f in sc.folds)
    for points in range(GRID_POINTS, 2, -1):
        step = max(1, -(-width // (points - 1)))
        if _replays(_cells(families(problem, slots, step))) * keys <= REPLAY_KEYS:
            return step
    return max(1, -(-width // 2))


def replay_count(problem: SplitProblem, scenarios: list[Scenario], slots: int | None) -> int:
    """How many replays solve_split runs (for a progress bar)."""
    cells = _cells(families(problem, slots, _step(problem, scenarios, slots)))
    return _replays(cells) * sum(len(sc.folds) for sc in scenarios)


def solve_split(problem: SplitProblem, scenarios: list[Scenario], slots: int | None = None,
                regret: bool = False, tick: Callable[[], None] | None = None,
                seed: int = 0) -> Split:
    """The best candidate (slots None), or `slots` slots per card spread evenly over the
    layers with the rest of each budget pinned; with `regret`, each scenario weighed by 1 /
    its plain cache's held-out stall (the mean ratio to the plain cache is minimized).
    `tick` is called after each replay. Where no scenario is a renamed twin (`unlike`, seed
    `seed`), the chosen candidate and the plain cache are also judged on the folds renamed
    so, as long as that replays at most RENAMED_KEYS requests: the risk the choice takes.
    With problem.choose the policy that serves it is chosen (solvers/cache/choice.py), and
    where its guard serves the plain cache instead, the split returned is the plain cache."""
    fams = families(problem, slots, _step(problem, scenarios, slots))
    table = CostTable(CostProblem(problem.home, problem.miss_s, problem.policy,
                                  problem.pin_rule), scenarios, _cells(fams), tick)
    scenario_of = np.array([e.scenario for e in table.entries])
    renamed = np.array([scenarios[i].unlike is not None for i in scenario_of])
    share = np.array([scenarios[i].share for i in scenario_of])
    weight = np.array([scenarios[i].weight for i in scenario_of])
    if regret:
        weight = _regret_weights(problem, table, scenario_of, len(scenarios))
    judged = []
    for fam in fams:
        try:
            judged.append((fam, *_nested(problem, table, fam, weight,
                                         [share * ~renamed, share * renamed])))
        except ValueError:
            if fam.kind != "slots" or slots is not None:
                raise
    best = min(judged, key=lambda j: j[1])
    risk = {}
    if not renamed.any() and 2 * sum(len(e.requests.keys) for e in table.entries) <= \
            RENAMED_KEYS:
        risk = {fam.name: _renamed(table, plans, share, seed)
                for fam, _, _, plans in judged if fam is best[0] or fam.kind == "cache"}
    candidates, layouts = [], []
    for fam, objective, (stall, unlike), _ in judged:
        plan = _fit(problem, table.weighted(weight), fam)
        layouts.append(Layout(_pinned(problem, table, plan), plan.q, plan.staging))
        candidates.append({"name": fam.name, "kind": fam.kind, "pin_cap": fam.pin_cap,
                           "slots_share": fam.share,
                           "slots_per_layer": None if fam.share is None
                           else int(fam.quotas[0, 0]),
                           "pinned": int(plan.p.sum()), "slots": int(plan.q.sum()),
                           "stall_s": stall,
                           "unlike_stall_s": unlike if renamed.any() else risk.get(fam.name),
                           "objective": objective,
                           "chosen": fam is best[0]})
    fam, objective, (stall, unlike), plans = best
    unlike = unlike if renamed.any() else risk.get(fam.name)
    plan = _fit(problem, table.weighted(weight), fam)
    choice = None
    if problem.choose and plan.q.any():
        plain = next((j for j in judged if j[0].kind == "cache"), None)
        choice = choose_policy(Folds(table, weight, share, renamed, stall, seed),
                               problem.choose, plans,
                               None if plain is None or plain is best else plain[3],
                               plain is best)
        if choice.plan == PLAIN:  # the guard's: the plain cache's pins and slots
            fam = plain[0]
            plan = _fit(problem, table.weighted(weight), fam)
            for c in candidates:
                c["chosen"] = c["kind"] == "cache"
        stall, objective = choice.stall_s, choice.objective
        if choice.unlike_stall_s is not None:  # else (--cache N, no twins): the pins' risk
            unlike = choice.unlike_stall_s
    pinned = _pinned(problem, table, plan)
    if choice is not None:
        choice = with_weights(choice, table, pinned, plan.q, seed)
    return Split(pinned, plan.q, plan.staging, fam.kind, stall, objective, candidates, unlike,
                 choice, layouts)


def _pinned(problem: SplitProblem, table: CostTable, plan: _Plan) -> np.ndarray:
    """[L, E] bool: the plan's pins, ranked for its slots on all of the calibration."""
    return pins_of(pin_order(table.all_misses(plan.q), table.chosen()),
                   first(plan.p, problem.home.shape[1]), problem.home)


def _regret_weights(problem: SplitProblem, table: CostTable, scenario_of: np.ndarray,
                    count: int) -> np.ndarray:
    """[F] 1 / (scenarios x its plain cache's held-out stall) for each entry's scenario."""
    layers = problem.home.shape[0]
    plain = even_quotas(cache_only_slots(problem.units, problem.fetch_limit), layers)
    per_entry = sum(table.cost[(0, int(plain[c, layer]))][:, c, layer]
                    for c in range(problem.num_cards) for layer in range(layers))
    stall = np.bincount(scenario_of, weights=per_entry, minlength=count)
    out = np.where(stall > 0, 1.0 / (count * np.where(stall > 0, stall, 1.0)), 0.0)
    return out[scenario_of]


def _nested(problem: SplitProblem, table: CostTable, fam: Family, weight: np.ndarray,
            shares: list[np.ndarray]
            ) -> tuple[float, list[float], list[tuple[np.ndarray, _Plan]]]:
    """(objective, [stall under each of `shares`], [(held-out entries [F] bool, the plan
    judged on them)]) of a candidate on held-out units, each unit's choice made on the
    others (one unit: in sample)."""
    units = np.array([e.unit for e in table.entries])
    held_out = [units == u for u in np.unique(units)] if len(np.unique(units)) > 1 else [
        np.ones(len(units), dtype=bool)]
    objective, stalls, plans = 0.0, [0.0] * len(shares), []
    for held in held_out:
        train = weight * (~held if len(held_out) > 1 else held)
        plan = _fit(problem, table.weighted(train), fam)
        objective += _judge(table, plan, weight * held)
        stalls = [total + _judge(table, plan, share * held)
                  for total, share in zip(stalls, shares, strict=True)]
        plans.append((held, plan))
    return objective, stalls, plans


def _renamed(table: CostTable, plans: list[tuple[np.ndarray, _Plan]], share: np.ndarray,
             seed: int) -> float:
    """A candidate's stall on the held-out folds renamed (traffic unlike the calibration),
    with the plans _nested judged on each held-out unit."""
    return sum(share[n] * float(table.renamed(n, plan.p, plan.q, seed).sum())
               for held, plan in plans for n in np.flatnonzero(held))


def _judge(table: CostTable, plan: _Plan, weights: np.ndarray) -> float:
    """The cost of `plan` summed over the entries with `weights`."""
    total = 0.0
    for c, layer in np.ndindex(plan.p.shape):
        total += float(weights @ table.cost[(int(plan.p[c, layer]), int(plan.q[c, layer]))][
            :, c, layer])
    return total


def _fit(problem: SplitProblem, costs: dict[Cell, np.ndarray], fam: Family) -> _Plan:
    """The candidate's plan at these costs."""
    if fam.kind == "cache":
        return _Plan(np.zeros_like(fam.quotas), fam.quotas.copy(), problem.fetch_limit.copy())
    if fam.kind == "slots":
        return _fixed(problem, costs, fam.quotas, fam.cells)
    return _knapsack(problem, costs, fam.cells)


def _knapsack(problem: SplitProblem, costs: dict[Cell, np.ndarray], allowed: list[Cell]
              ) -> _Plan:
    """Per card, the (p_l, q_l) of least summed cost within its units less its staging
    reserve."""
    layers = problem.home.shape[0]
    p = np.zeros((problem.num_cards, layers), dtype=np.int64)
    q = np.zeros_like(p)
    for c in range(problem.num_cards):
        homes = (problem.home == c).any(axis=1)
        options = [allowed if homes[layer] else [(0, 0)] for layer in range(layers)]
        found = _layer_knapsack([[costs[cell][c, layer] for cell in options[layer]]
                                 for layer in range(layers)],
                                [[sum(cell) for cell in row] for row in options],
                                int(problem.units[c]) - int(problem.fetch_limit[c]))
        if found is None:
            raise ValueError(f"card {c}: {problem.units[c]} experts of budget hold no split")
        p[c], q[c] = np.array([options[layer][i] for layer, i in enumerate(found[1])]).T
    return _Plan(p, q, problem.fetch_limit.copy())


def _layer_knapsack(costs: list[list[float]], units: list[list[int]], room: int
                    ) -> tuple[float, list[int]] | None:
    """Choose one option per layer (option i of a layer costs costs[layer][i] and takes
    units[layer][i]) of least total cost within `room` units; (cost, choice per layer), or
    None. Of a layer's options of equal units only the cheapest is tried."""
    if room < 0:
        return None
    best = np.zeros(room + 1)
    choice = []
    for row, row_units in zip(costs, units, strict=True):
        cheapest: dict[int, int] = {}
        for i, (cost, u) in enumerate(zip(row, row_units, strict=True)):
            if u <= room and (u not in cheapest or cost < row[cheapest[u]]):
                cheapest[u] = i
        new = np.full(room + 1, np.inf)
        arg = np.full(room + 1, -1, dtype=np.int64)
        for u, i in cheapest.items():
            cand = best[:room + 1 - u] + row[i]
            better = cand < new[u:]
            new[u:][better], arg[u:][better] = cand[better], i
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


def _fixed(problem: SplitProblem, costs: dict[Cell, np.ndarray], quotas: np.ndarray,
           cells: list[Cell]) -> _Plan:
    """quotas[c, l] slots; the pins that fit beside them in each card's budget, by the
    knapsack (ValueError when the slots alone do not fit)."""
    layers = problem.home.shape[0]
    p = np.zeros_like(quotas)
    for c in range(problem.num_cards):
        options = [[cell for cell in cells if cell[1] == quotas[c, layer]]
                   for layer in range(layers)]
        found = _layer_knapsack([[costs[cell][c, layer] for cell in options[layer]]
                                 for layer in range(layers)],
                                [[sum(cell) for cell in row] for row in options],
                                int(problem.units[c]) - int(problem.fetch_limit[c]))
        if found is None:
            raise ValueError(f"card {c}: {int(quotas[c].sum())} cache slots do not fit its "
                             f"budget of {problem.units[c]} experts")
        p[c] = [options[layer][i][0] for layer, i in enumerate(found[1])]
    return _Plan(p, quotas.copy(), problem.fetch_limit.copy())
