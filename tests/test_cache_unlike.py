"""Traffic unlike the calibration (solvers/cache/costs.py `unlike`, Requests.relabeled): the
same steps with each layer's experts renamed within each card, held out and ranked exactly as
their originals, and judged beside them under regret weights."""

from __future__ import annotations

import numpy as np
import pytest

from solvers.cache import make_policy
from solvers.cache.costs import CostProblem, CostTable, Scenario, entries_of, pin_order, unlike
from solvers.cache.replay import Requests
from solvers.cache.split import SplitProblem, solve_split


def selections(seed: int, steps: int = 240, layers: int = 2, experts: int = 8) -> np.ndarray:
    """[S, L, E] bool: two of a fixed hot set of three per layer, and one at random."""
    rng = np.random.default_rng(seed)
    out = np.zeros((steps, layers, experts), dtype=bool)
    hot = np.stack([rng.choice(experts, 3, replace=False) for _ in range(layers)])
    for s in range(steps):
        for layer in range(layers):
            out[s, layer, rng.choice(hot[layer], 2, replace=False)] = True
            out[s, layer, rng.integers(experts)] = True
    return out


def test_renamed_steps_are_the_same_steps_under_one_permutation_within_each_card():
    selected = selections(0, layers=2, experts=8)
    home = np.tile(np.repeat([0, 1], 4), (2, 1))  # experts 0-3 on card 0, 4-7 on card 1
    original = Requests.of(selected)
    renamed = original.relabeled(home, seed=3)
    np.testing.assert_array_equal(renamed.offsets, original.offsets)
    rename = np.empty((2, 8), dtype=np.int64)
    for layer in range(2):  # the permutation, recovered from steps that select one expert
        for e in range(8):
            steps = np.flatnonzero(selected[:, layer, e])
            candidates = None
            for s in steps:
                g = s * 2 + layer
                keys = set(renamed.keys[renamed.offsets[g]:renamed.offsets[g + 1]].tolist())
                candidates = keys if candidates is None else candidates & keys
            (rename[layer, e],) = candidates
    rename -= np.arange(2)[:, None] * 8
    for layer in range(2):
        assert sorted(rename[layer]) == list(range(8))
        assert (home[layer, rename[layer]] == home[layer]).all()  # within each card
        for g in range(layer, len(renamed.offsets) - 1, 2):  # ascending, as served
            assert (np.diff(renamed.keys[renamed.offsets[g]:renamed.offsets[g + 1]]) > 0).all()
    assert (rename != np.arange(8)).any()
    want = Requests.of(np.stack([selected[:, layer, np.argsort(rename[layer])]
                                 for layer in range(2)], axis=1))
    np.testing.assert_array_equal(renamed.keys, want.keys)


def folds_of(selected: np.ndarray, k: int) -> list[Requests]:
    return [Requests.of(part) for part in np.array_split(selected, k)]


def test_a_renamed_fold_is_held_out_and_ranked_as_its_original():
    home = np.zeros((2, 8), dtype=np.int64)
    scenarios = unlike([Scenario("t", folds_of(selections(2), 3), 1.0, 1.0)], home, seed=0)
    entries = entries_of(scenarios)
    assert [e.scenario for e in entries] == [0, 0, 0, 1, 1, 1]
    for j in range(3):
        assert entries[3 + j].unit == entries[j].unit == j
        assert entries[3 + j].train == entries[j].train == tuple(m for m in range(3) if m != j)
    table = CostTable(CostProblem(home, np.array([1e-3]), "lru"), scenarios, [(0, 2), (1, 2)])
    assert table.calibration == [0, 1, 2]
    for j in range(3):
        pinned = np.zeros((2, 8), dtype=bool)
        order = pin_order(sum(table.free[(m, 2)] for m in entries[j].train),
                          sum(table.sel[m] for m in entries[j].train))
        pinned[np.arange(2), order[:, 0]] = True
        held = scenarios[1].folds[j]
        want = held.misses(make_policy("lru", np.full((1, 2), 2), 16), ~pinned, home).sum(
            axis=1) * 1e-3 / scenarios[1].steps
        np.testing.assert_allclose(table.cost[(1, 2)][3 + j, 0], want)


def test_regret_over_the_renamed_twin_picks_slots_where_the_pins_only_fit_the_names():
    """A fixed hot set: pins win the calibration's own folds; renamed, they hold experts the
    traffic no longer favours. With the twin under regret weights the choice is the least
    mean regret over both, and gives up pins for slots."""
    home = np.zeros((2, 8), dtype=np.int64)
    problem = SplitProblem(home, np.array([1e-3]), np.array([8]), np.array([3]), "lru")
    plain = [Scenario("t", folds_of(selections(4, steps=400), 4), 1.0, 1.0)]
    alone = solve_split(problem, plain)
    hedged = solve_split(problem, unlike(plain, home, seed=0), regret=True)
    assert hedged.unlike_stall_s < alone.unlike_stall_s  # the default's renamed figure
    assert hedged.objective == min(c["objective"] for c in hedged.candidates)
    rows = {c["name"]: c for c in hedged.candidates}
    assert rows["static"]["unlike_stall_s"] > rows["static"]["stall_s"]
    chosen = next(c for c in hedged.candidates if c["chosen"])
    assert chosen["unlike_stall_s"] < rows["static"]["unlike_stall_s"]
    assert int(hedged.quotas.sum()) > int(alone.quotas.sum())
    assert chosen["stall_s"] == pytest.approx(hedged.stall_s)


def test_the_defaults_renamed_figure_is_the_twins_cost_of_the_same_cells():
    """The default judges only its choice and the plain cache on renamed folds, without
    twins in the table: entry by entry, the very seconds the twins' table gives a cell."""
    home = np.zeros((2, 8), dtype=np.int64)
    plain = [Scenario("t", folds_of(selections(5), 3), 1.0, 1.0)]
    problem = CostProblem(home, np.array([1e-3]), "lru")
    alone = CostTable(problem, plain, [(0, 2), (2, 2)])
    twins = CostTable(problem, unlike(plain, home, seed=4), [(0, 2), (2, 2)])
    for p, q in ((0, 2), (2, 2)):
        for j in range(3):
            got = alone.renamed(j, np.full((1, 2), p), np.full((1, 2), q), seed=4)
            np.testing.assert_allclose(got, twins.cost[(p, q)][3 + j])


def test_the_default_judges_its_choice_and_the_plain_cache_on_renamed_folds():
    home = np.zeros((2, 8), dtype=np.int64)
    problem = SplitProblem(home, np.array([1e-3]), np.array([8]), np.array([3]), "lru")
    split = solve_split(problem, [Scenario("t", folds_of(selections(4, steps=400), 4), 1.0,
                                           1.0)])
    measured = {c["name"] for c in split.candidates if c["unlike_stall_s"] is not None}
    chosen = next(c for c in split.candidates if c["chosen"])
    assert measured == {chosen["name"], "plain cache"}
    assert split.unlike_stall_s == chosen["unlike_stall_s"] > chosen["stall_s"]
