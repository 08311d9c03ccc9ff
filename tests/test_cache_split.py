"""The split of a card's budget between pinned experts and per-layer cache slots
(solvers/cache/split.py): the knapsack against brute force, the budget, the pin cap, the
cache-aware pin rule, and the cross-validated costs against a direct replay."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from solvers.cache import make_policy
from solvers.cache.replay import Requests
from solvers.cache.split import (
    CostTable,
    Scenario,
    SplitProblem,
    _layer_knapsack,
    pin_order,
    solve_split,
)


@pytest.mark.parametrize("seed", range(30))
def test_layer_knapsack_is_optimal(seed: int):
    rng = np.random.default_rng(seed)
    layers, options, room = int(rng.integers(1, 4)), int(rng.integers(1, 4)), int(
        rng.integers(0, 9))
    costs = rng.random((layers, options)).round(2).tolist()
    units = rng.integers(0, 5, (layers, options)).tolist()
    found = _layer_knapsack(costs, units, room)
    best = None
    for pick in itertools.product(range(options), repeat=layers):
        if sum(units[layer][i] for layer, i in enumerate(pick)) <= room:
            cost = sum(costs[layer][i] for layer, i in enumerate(pick))
            best = cost if best is None else min(best, cost)
    if best is None:
        assert found is None
    else:
        assert found[0] == pytest.approx(best)
        assert sum(units[layer][i] for layer, i in enumerate(found[1])) <= room
        assert sum(costs[layer][i] for layer, i in enumerate(found[1])) == pytest.approx(best)


def traffic(seed: int, steps: int = 400, layers: int = 3, experts: int = 12) -> np.ndarray:
    """[S, L, E] decode-like selections: 2 of a slowly drifting hot set, plus one at random."""
    rng = np.random.default_rng(seed)
    out = np.zeros((steps, layers, experts), dtype=bool)
    hot = rng.choice(experts, size=(layers, 4))
    for s in range(steps):
        if s % 50 == 0:
            hot[:, rng.integers(4)] = rng.integers(experts, size=layers)
        for layer in range(layers):
            out[s, layer, rng.choice(hot[layer], 2)] = True
            out[s, layer, rng.integers(experts)] = True
    return out


def scenario(selected: np.ndarray, folds: int = 4) -> Scenario:
    """Folds over contiguous runs of steps (sequences of one token each)."""
    cut = np.array_split(np.arange(len(selected)), folds)
    return Scenario("t", Requests.of(selected),
                    [(Requests.of(np.delete(selected, held, axis=0)),
                      Requests.of(selected[held])) for held in cut], 1.0)


def problem(units: int, cards: int = 1, layers: int = 3, experts: int = 12,
            limit: int = 3) -> SplitProblem:
    home = np.arange(layers * experts).reshape(layers, experts) % cards
    return SplitProblem(home, np.full(cards, 1e-3), np.full(cards, units), np.full(cards, limit),
                        "lru")


@pytest.mark.parametrize("units", [6, 12, 20])
def test_the_split_fits_the_budget_and_caps_the_pins(units: int):
    prob = problem(units, cards=2)
    split = solve_split(prob, [scenario(traffic(1))])
    for c in range(2):
        pins = (split.pinned & (prob.home == c)).sum(axis=1)
        assert pins.sum() + split.quotas[c].sum() + split.staging[c] <= units
        assert split.staging[c] == max(0, 3 - split.quotas[c].min())
        assert np.all(pins <= prob.pin_share * (pins + split.quotas[c]) + 1e-9)
    assert split.stall_s > 0 and [p["slots_share"] for p in split.curve][0] == 0.0


def test_fixed_slots_are_spread_evenly_and_the_rest_is_pinned():
    prob = problem(16)
    split = solve_split(prob, [scenario(traffic(2))], slots=7)
    assert split.quotas.tolist() == [[3, 2, 2]]
    assert split.pinned.sum() + 7 + split.staging[0] <= 16
    assert split.pinned.sum() >= 16 - 7 - 1 - 1  # the rest is pinned, bar the staging buffer


def test_fixed_slots_beyond_the_budget_are_refused():
    with pytest.raises(ValueError, match="do not fit"):
        solve_split(problem(6), [scenario(traffic(2))], slots=9)


def test_pins_go_to_long_reuse_not_to_what_the_cache_keeps_warm():
    """Expert 0 is selected every step (a cache keeps it), expert 1 every 9th step, and 16
    others in turn (every 16th step): a 2-slot cache misses expert 1 at every use (40 times)
    and the others 22 times each. Pinning by misses takes 1; by frequency it would take 0."""
    steps = 360
    selected = np.zeros((steps, 1, 20), dtype=bool)
    selected[:, 0, 0] = True
    selected[::9, 0, 1] = True
    for s in range(steps):
        selected[s, 0, 2 + s % 16] = True
    requests = Requests.of(selected)
    prob = problem(10, layers=1, experts=20, limit=3)
    table = CostTable(prob, [Scenario("t", requests, [(requests, requests)], 1.0)], [(0, 2)])
    rank = table.rank(requests, 2)
    frequency = pin_order(selected.sum(axis=0), selected.sum(axis=0))
    assert rank[0, 0] == 1 and frequency[0, 0] == 0


def test_a_cell_costs_its_held_out_misses_with_pins_ranked_on_the_rest():
    selected = traffic(3)
    sc = scenario(selected, folds=2)
    prob = problem(12)
    table = CostTable(prob, [sc], [(1, 3)])
    want = np.zeros(3)
    for train, held in sc.folds:
        nothing = np.zeros((3, 12), dtype=bool)
        cache = make_policy("lru", np.full((1, 3), 3), 36)
        misses = train.misses(cache, ~nothing, prob.home)
        pinned = np.zeros((3, 12), dtype=bool)
        for layer, order in enumerate(pin_order(misses, selected.sum(axis=0) * 0
                                                + np.bincount(train.keys, minlength=36)
                                                .reshape(3, 12))):
            pinned[layer, order[0]] = True
        cache = make_policy("lru", np.full((1, 3), 3), 36)
        held_misses = held.misses(cache, ~pinned, prob.home).sum(axis=1)
        want += held_misses * 1e-3 / (held.shape[0] * 2)
    np.testing.assert_allclose(table(1, 3)[0], want)
