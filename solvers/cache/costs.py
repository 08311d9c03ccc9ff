"""The cross-validated cost table of the cache split (solvers/cache/split.py says what for).

cost(p, q) is the held-out stall that p pinned experts and q cache slots in a (card, layer)
cost, for every (card, layer) at once (per-layer caches do not interact, so one replay with
(p, q) in every layer measures them all), per fold: each fold's pins are ranked on its
training traffic and its misses counted on the fold itself. A fold's training traffic is
the other folds of its scenario (sequence folds of one trace set), or, with several trace
sets, every fold of the other sets at the same concurrency (leave one set out).

What makes it affordable at DeepSeek-V3 scale (58 layers x 256 experts, 200k tokens):
- folds partition the steps, so a fold's training misses are the sum of the other folds'
  own misses under the same slots with nothing pinned: one replay per fold and slot count
  serves every fold's ranking, the (0, q) cells and the final ranking on all the traffic;
- (p, 0) cells need no replay (with no slots every selection of an unpinned expert misses);
- only cells with p > 0 and q > 0 replay with pins, one replay per cell and fold;
- requests are int32 keys built from the tokens (solvers.cache.replay.Requests.of_tokens),
  never an [S, L, E] mask, and the replays run on every core (the compiled replay releases
  the GIL).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from solvers.cache import make_policy
from solvers.cache.replay import Requests

Cell = tuple[int, int]  # (pins, slots) of one (card, layer)


@dataclass(frozen=True)
class Scenario:
    """One calibration traffic at one concurrency: its steps as the caches see them, cut
    into folds of disjoint sequences (one fold: judged in sample); `weight` its share of the
    objective, `share` its share of the stall (they differ under --robust: regret weights);
    `group` its trace set (several sets: each is held out against the others). A scenario
    with `unlike` set is traffic unlike the calibration: the folds of scenario `unlike`,
    each layer's experts renamed (Requests.relabeled), each fold held out and its pins
    ranked exactly as its original's."""

    name: str
    folds: list[Requests]
    weight: float
    share: float
    group: int = 0
    batch: int = 1
    unlike: int | None = None

    @property
    def steps(self) -> int:
        return sum(f.shape[0] for f in self.folds)


def unlike(scenarios: list[Scenario], home: np.ndarray, seed: int) -> list[Scenario]:
    """The scenarios, then each one's twin of traffic unlike it (same weights; fold j
    renamed with seed + j)."""
    return [*scenarios, *(Scenario(f"{sc.name}, experts renamed",
                                   [f.relabeled(home, seed + j) for j, f in enumerate(sc.folds)],
                                   sc.weight, sc.share, sc.group, sc.batch, i)
                          for i, sc in enumerate(scenarios))]


@dataclass(frozen=True)
class Entry:
    """One fold of one scenario: `unit` what it is held out with (its fold index, or its
    trace set), `train` the entries whose traffic ranks its pins."""

    requests: Requests
    scenario: int
    fold: int
    unit: int
    train: tuple[int, ...]


def entries_of(scenarios: list[Scenario]) -> list[Entry]:
    """Every (scenario, fold), with its held-out unit and training entries (a renamed fold:
    its original's)."""
    flat = [(i, j, f) for i, sc in enumerate(scenarios) for j, f in enumerate(sc.folds)]
    like = [(sc.unlike if sc.unlike is not None else i) for i, sc in enumerate(scenarios)]
    several = len({sc.group for sc in scenarios}) > 1
    index = {(i, j): n for n, (i, j, _) in enumerate(flat)}
    out = []
    for i, j, f in flat:
        sc, own = scenarios[i], index[(like[i], j)]
        if several:
            train = [m for m, (i2, _, _) in enumerate(flat) if scenarios[i2].group != sc.group
                     and scenarios[i2].batch == sc.batch and scenarios[i2].unlike is None]
        else:
            train = [m for m, (i2, j2, _) in enumerate(flat) if i2 == like[i] and j2 != j]
        out.append(Entry(f, i, j, sc.group if several else j, tuple(train or [own])))
    return out


@dataclass(frozen=True)
class CostProblem:
    """home: [L, E] card of each expert; miss_s: [C] seconds one miss costs on each card."""

    home: np.ndarray
    miss_s: np.ndarray
    policy: str
    pin_rule: str = "misses"  # or "frequency": rank pins by selections (the static way)

    @property
    def num_cards(self) -> int:
        return len(self.miss_s)


class CostTable:
    """cost[cell]: [F, C, L] seconds of stall per step of its scenario that each of the F
    entries' held-out fold adds, per (card, layer), with the cell's pins and slots in every
    layer. free[(n, q)]: [L, E] misses of each expert in entry n with q slots and nothing
    pinned; sel[n]: [L, E] selections."""

    def __init__(self, problem: CostProblem, scenarios: list[Scenario], cells: list[Cell],
                 tick: Callable[[], None] | None = None) -> None:
        self.problem, self.scenarios = problem, scenarios
        self.entries = entries_of(scenarios)
        self.sel = [selections(e.requests) for e in self.entries]
        qs = sorted({q for _, q in cells if q > 0})
        replays = [(p, q) for p, q in cells if p > 0 and q > 0]
        tick = tick or (lambda: None)
        with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
            jobs = [(n, q) for q in qs for n in range(len(self.entries))]
            self.free = dict(zip(jobs, pool.map(lambda job: self._free(*job, tick), jobs),
                                 strict=True))
            self._ranks: dict[Cell, np.ndarray] = {}
            work = [(cell, n) for cell in replays for n in range(len(self.entries))]
            held = dict(zip(work, pool.map(lambda job: self._pinned(*job, tick), work),
                            strict=True))
        self.calibration = [n for n, e in enumerate(self.entries)
                            if scenarios[e.scenario].unlike is None]
        self.cost = {}
        for p, q in cells:
            per = [held[((p, q), n)] if p > 0 and q > 0 else self._direct(n, p, q)
                   for n in range(len(self.entries))]
            self.cost[(p, q)] = np.stack([self.seconds(n, m) for n, m in enumerate(per)])

    def _free(self, n: int, q: int, tick: Callable[[], None]) -> np.ndarray:
        steps = self.entries[n].requests
        out = expert_misses(self.problem, steps, np.zeros(self.problem.home.shape, bool),
                            np.full((self.problem.num_cards, steps.shape[1]), q))
        tick()
        return out

    def rank(self, n: int, q: int) -> np.ndarray:
        """[L, E] entry n's pin order under q slots, ranked on its training entries."""
        if (n, q) not in self._ranks:
            train = self.entries[n].train
            chosen = sum(self.sel[m] for m in train)
            misses = (chosen if q == 0 or self.problem.pin_rule == "frequency"
                      else sum(self.free[(m, q)] for m in train))
            self._ranks[(n, q)] = pin_order(misses, chosen)
        return self._ranks[(n, q)]

    def pins(self, n: int, p: int, q: int) -> np.ndarray:
        home = self.problem.home
        return pins_of(self.rank(n, q), first(np.full((self.problem.num_cards, home.shape[0]),
                                                      p), home.shape[1]), home)

    def _pinned(self, cell: Cell, n: int, tick: Callable[[], None]) -> np.ndarray:
        p, q = cell
        steps = self.entries[n].requests
        out = expert_misses(self.problem, steps, self.pins(n, p, q),
                            np.full((self.problem.num_cards, steps.shape[1]), q))
        tick()
        return out

    def renamed(self, n: int, p: np.ndarray, q: np.ndarray, seed: int) -> np.ndarray:
        """[C, L] seconds of stall per step that p[c, l] pins and q[c, l] slots add on entry
        n's fold with its experts renamed (as `unlike` renames it), pins ranked as for n."""
        entry, home = self.entries[n], self.problem.home
        pinned = np.zeros(home.shape, dtype=bool)
        for slots in np.unique(q):
            pinned |= pins_of(self.rank(n, int(slots)), first(np.where(q == slots, p, 0),
                                                               home.shape[1]), home)
        steps = entry.requests.relabeled(home, seed + entry.fold)
        return self.seconds(n, expert_misses(self.problem, steps, pinned, q))

    def _direct(self, n: int, p: int, q: int) -> np.ndarray:
        """[L, E] misses of a cell needing no replay: no pins (the free replay) or no slots
        (every selection of an unpinned expert)."""
        if p == 0 and q > 0:
            return self.free[(n, q)]
        return self.sel[n] * ~self.pins(n, p, 0) if p > 0 else self.sel[n]

    def seconds(self, n: int, per_expert: np.ndarray) -> np.ndarray:
        sc = self.scenarios[self.entries[n].scenario]
        return (per_card(per_expert, self.problem.home, self.problem.num_cards)
                * self.problem.miss_s[:, None] / sc.steps)

    def weighted(self, weights: np.ndarray) -> dict[Cell, np.ndarray]:
        """cell -> [C, L] the entries' costs summed with `weights` [F]."""
        return {cell: np.tensordot(weights, cost, axes=1) for cell, cost in self.cost.items()}

    def chosen(self) -> np.ndarray:
        """[L, E] selections over the calibration entries (not the renamed ones)."""
        return sum(self.sel[n] for n in self.calibration)

    def all_misses(self, quotas: np.ndarray) -> np.ndarray:
        """[L, E] each expert's misses over the calibration entries with nothing pinned
        under its card's slots quotas[c, l] in its layer (selections where there are none):
        the final ranking of the pins, on all of the calibration traffic."""
        home = self.problem.home
        out = np.zeros(home.shape)
        for c, layer in zip(*np.nonzero(quotas), strict=True):
            if self.problem.pin_rule != "frequency":
                mine = home[layer] == c
                out[layer, mine] = sum(self.free[(n, int(quotas[c, layer]))][layer, mine]
                                       for n in self.calibration)
        chosen = self.chosen()
        bare = (quotas[home, np.arange(home.shape[0])[:, None]] == 0)
        if self.problem.pin_rule == "frequency":
            bare[:] = True
        out[bare] = chosen[bare]
        return out


def expert_misses(problem: CostProblem, steps: Requests, pinned: np.ndarray,
                  quotas: np.ndarray) -> np.ndarray:
    """[L, E] misses of each expert over `steps` with `pinned` and quotas [C, L] slots."""
    _, layers, experts = steps.shape
    cache = make_policy(problem.policy, quotas, layers * experts)
    return steps.misses(cache, ~pinned, problem.home)


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
    layers, width = rank.shape
    cards = np.take_along_axis(home, rank, axis=1)  # [L, E] card of each rank position
    onehot = cards[:, :, None] == np.arange(chosen.shape[0])[None, None, :]
    position = np.take_along_axis(np.cumsum(onehot, axis=1) - 1, cards[:, :, None],
                                  axis=2)[:, :, 0]
    out = np.zeros(rank.shape, dtype=bool)
    np.put_along_axis(out, rank, chosen[cards, np.arange(layers)[:, None], position], axis=1)
    return out


def per_card(per_expert: np.ndarray, home: np.ndarray, num_cards: int) -> np.ndarray:
    """[L, E] -> [C, L] sums over the experts each card homes."""
    return np.stack([(per_expert * (home == c)).sum(axis=1) for c in range(num_cards)])
