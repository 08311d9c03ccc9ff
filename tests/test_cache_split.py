"""The split of a card's budget between pinned experts and per-layer cache slots
(solvers/cache/split.py, costs.py): the knapsack against brute force, the budget, the
candidates (the chosen one is never one the table shows worse), the cache-aware pin rule,
and the cross-validated costs against a direct replay."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from solvers.cache import even_quotas, make_policy
from solvers.cache.costs import CostProblem, CostTable, Scenario, first, pin_order, pins_of
from solvers.cache.replay import Requests
from solvers.cache.split import CAPS, SplitProblem, _layer_knapsack, solve_split
from solvers.staging import cache_only_slots
from traces.storing.profile import step_mask


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


def scenario(selected: np.ndarray, folds: int = 4, group: int = 0) -> Scenario:
    """Folds over contiguous runs of steps (sequences of one token each)."""
    cut = np.array_split(np.arange(len(selected)), folds)
    return Scenario("t", [Requests.of(selected[held]) for held in cut], 1.0, 1.0, group)


def problem(units: int, cards: int = 1, layers: int = 3, experts: int = 12,
            limit: int = 3, caps: tuple[float, ...] = CAPS) -> SplitProblem:
    home = np.arange(layers * experts).reshape(layers, experts) % cards
    return SplitProblem(home, np.full(cards, 1e-3), np.full(cards, units), np.full(cards, limit),
                        "lru", caps)


def cost_problem(prob: SplitProblem) -> CostProblem:
    return CostProblem(prob.home, prob.miss_s, prob.policy)


@pytest.mark.parametrize("units", [6, 12, 20])
def test_the_split_fits_the_budget(units: int):
    prob = problem(units, cards=2)
    split = solve_split(prob, [scenario(traffic(1))])
    for c in range(2):
        pins = (split.pinned & (prob.home == c)).sum(axis=1)
        assert pins.sum() + split.quotas[c].sum() + split.staging[c] <= units
        assert split.staging[c] == 3  # the reserve stays staging, whatever the slots
    assert split.stall_s > 0


@pytest.mark.parametrize("seed", range(12))
def test_the_chosen_candidate_is_never_one_the_table_shows_worse(seed: int):
    """Small random problems (cards, layers, budget, traffic, one or two trace sets,
    regret weights or not): the split returned is the candidate of least held-out
    objective, its figures are that row's, and its pins and slots are what the row says."""
    rng = np.random.default_rng(seed)
    cards, layers, experts = int(rng.integers(1, 3)), int(rng.integers(1, 4)), 8
    prob = problem(int(rng.integers(4, 14)), cards, layers, experts, int(rng.integers(1, 4)),
                   caps=tuple(sorted(rng.choice([0.25, 0.5, 1.0], 2, replace=False))))
    sets = int(rng.integers(1, 3))
    scenarios = [scenario(traffic(seed * 10 + g, int(rng.integers(60, 200)), layers, experts),
                          folds=int(rng.integers(1, 4)), group=g) for g in range(sets)]
    split = solve_split(prob, scenarios, regret=bool(rng.integers(2)))
    chosen = [c for c in split.candidates if c["chosen"]]
    assert len(chosen) == 1
    assert chosen[0]["objective"] == min(c["objective"] for c in split.candidates)
    assert (split.objective, split.stall_s) == (chosen[0]["objective"], chosen[0]["stall_s"])
    assert (int(split.pinned.sum()), int(split.quotas.sum())) == (chosen[0]["pinned"],
                                                                  chosen[0]["slots"])
    kinds = {c["kind"] for c in split.candidates}
    assert {"static", "cache", "split"} <= kinds and split.kind == chosen[0]["kind"]


def test_every_candidate_is_judged_on_the_same_held_out_folds():
    """The plain cache's held-out stall is each fold replayed from an empty cache with the
    whole budget as even slots, summed; the static candidate's, with no slots, each fold's
    selections of the experts it leaves unpinned (pins chosen on the other folds)."""
    selected = traffic(4)
    sc = scenario(selected, folds=3)
    prob = problem(12)
    split = solve_split(prob, [sc])
    rows = {c["kind"]: c for c in split.candidates}
    quotas = even_quotas(cache_only_slots(prob.units, prob.fetch_limit), 3)
    want = sum(float(f.misses(make_policy("lru", quotas, 36), np.ones((3, 12), bool),
                              prob.home).sum()) for f in sc.folds) * 1e-3 / len(selected)
    assert rows["cache"]["stall_s"] == pytest.approx(want)
    assert rows["cache"]["pinned"] == 0 and rows["static"]["slots"] == 0


def test_pins_win_where_the_cache_only_churns_and_the_cache_where_the_hot_set_moves():
    """A cyclic scan over 6 experts: an LRU of 4 slots misses every one, 4 pins catch 4 of
    6 (no slots chosen). A hot pair that moves every 25 steps: pins chosen on other folds
    miss it, 2 slots catch it (slots chosen, far below static's stall)."""
    steps, experts = 300, 12
    scan = np.zeros((steps, 1, experts), dtype=bool)
    scan[np.arange(steps), 0, np.arange(steps) % 6] = True
    split = solve_split(problem(5, layers=1, limit=1), [scenario(scan)])
    rows = {c["kind"]: c for c in split.candidates}
    assert split.quotas.sum() == 0 and split.stall_s < rows["cache"]["stall_s"] / 2
    moving = np.zeros((steps, 1, experts), dtype=bool)
    for s in range(steps):
        moving[s, 0, [(s // 25 * 2) % experts, (s // 25 * 2 + 1) % experts]] = True
    split = solve_split(problem(5, layers=1), [scenario(moving)])
    rows = {c["kind"]: c for c in split.candidates}
    assert split.quotas.sum() > 0 and split.stall_s < rows["static"]["stall_s"] / 2


def test_fixed_slots_are_spread_evenly_and_the_rest_is_pinned():
    prob = problem(16)
    split = solve_split(prob, [scenario(traffic(2))], slots=7)
    assert split.quotas.tolist() == [[3, 2, 2]]
    assert split.pinned.sum() + 7 + split.staging[0] <= 16 and split.staging[0] == 3
    assert split.pinned.sum() >= 16 - 7 - 3 - 1  # the rest is pinned, bar the staging reserve


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
    table = CostTable(cost_problem(prob), [Scenario("t", [requests], 1.0, 1.0)], [(0, 2)])
    rank = table.rank(0, 2)
    frequency = pin_order(selected.sum(axis=0), selected.sum(axis=0))
    assert rank[0, 0] == 1 and frequency[0, 0] == 0


def test_a_cell_costs_its_held_out_misses_with_pins_ranked_on_the_other_folds():
    selected = traffic(3)
    sc = scenario(selected, folds=2)
    prob = problem(12)
    table = CostTable(cost_problem(prob), [sc], [(1, 3)])
    want = np.zeros((2, 3))
    nothing = np.zeros((3, 12), dtype=bool)
    for n, held in enumerate(sc.folds):
        train = sc.folds[1 - n]
        misses = train.misses(make_policy("lru", np.full((1, 3), 3), 36), ~nothing, prob.home)
        pinned = np.zeros((3, 12), dtype=bool)
        for layer, order in enumerate(pin_order(misses, np.bincount(
                train.keys, minlength=36).reshape(3, 12))):
            pinned[layer, order[0]] = True
        cache = make_policy("lru", np.full((1, 3), 3), 36)
        want[n] = held.misses(cache, ~pinned, prob.home).sum(axis=1) * 1e-3 / len(selected)
    np.testing.assert_allclose(table.cost[(1, 3)][:, 0], want)


def test_pins_of_takes_each_cards_first_positions():
    rng = np.random.default_rng(5)
    home = rng.integers(0, 3, (4, 10))
    rank = np.stack([rng.permutation(10) for _ in range(4)])
    counts = rng.integers(0, 4, (3, 4))
    got = pins_of(rank, first(counts, 10), home)
    for layer in range(4):
        seen = np.zeros(3, dtype=int)
        for e in rank[layer]:
            c = home[layer, e]
            assert got[layer, e] == (seen[c] < counts[c, layer])
            seen[c] += 1


def test_requests_from_tokens_are_those_of_the_mask():
    rng = np.random.default_rng(0)
    tokens = rng.integers(-1, 10, (50, 3, 4, 2)).astype(np.int16)
    a, b = Requests.of(step_mask(tokens, 10)), Requests.of_tokens(tokens, 10, chunk=7)
    assert a.shape == b.shape
    np.testing.assert_array_equal(a.keys, b.keys)
    np.testing.assert_array_equal(a.offsets, b.offsets)


@pytest.mark.parametrize("seed", range(3))
def test_the_policy_served_is_the_least_on_the_held_out_folds_and_learned_never_sees_them(
        seed: int, monkeypatch: pytest.MonkeyPatch):
    """choose: each policy (per layer and pooled) serves the chosen split on its held-out
    folds; the split's own policy per layer gives the chosen candidate's figure, the one
    returned is the least of them, and every fold's learned weights are fitted on folds other
    than the one it is judged on (the final weights on every calibration fold)."""
    from solvers.cache import choice

    seen: list[list[int]] = []
    real = choice.fit_learned

    def spy(folds, *args, **kwargs):
        seen.append([id(f) for f in folds])
        return real(folds, *args, **kwargs)

    monkeypatch.setattr(choice, "fit_learned", spy)
    sc = scenario(traffic(seed, 240), folds=3)
    base = problem(12, cards=1 + seed % 2)
    prob = SplitProblem(base.home, base.miss_s, base.units, base.fetch_limit, "lfru",
                        choose=choice.CHOICES)
    split = solve_split(prob, [sc], slots=6)  # slots: the choice has something to serve
    rows = split.policy.rows
    assert {(r["policy"], r["pooled"]) for r in rows} == {
        (name, pooled) for name in choice.CHOICES for pooled in (False, True)}
    (best,) = [r for r in rows if r["chosen"]]
    assert best["objective"] == min(r["objective"] for r in rows)
    assert (split.policy.name, split.policy.pooled) == (best["policy"], best["pooled"])
    assert split.stall_s == best["stall_s"]
    (mine,) = [c for c in split.candidates if c["chosen"]]
    (lfru,) = [r for r in rows if (r["policy"], r["pooled"]) == ("lfru", False)]
    # the same plan, replayed as served (the table sums per-cell replays with one pin count
    # in every layer: lfru's score reads the card's access clock, which other layers' pins move)
    assert lfru["stall_s"] == pytest.approx(mine["stall_s"], rel=0.05)
    held_out = [[id(f)] for f in sc.folds]
    nested = seen[:len(sc.folds)]
    assert len(nested) == len(sc.folds)
    for fitted in nested:
        assert len(fitted) == len(sc.folds) - 1
    assert sorted(set(map(tuple, nested))) == sorted(
        tuple(i for i in map(id, sc.folds) if [i] != held) for held in held_out)
    if split.policy.name == "learned":
        assert seen[-1] == [id(f) for f in sc.folds]  # the plan's: every calibration fold
        assert split.policy.weights.shape == (base.home.shape[0], 7)  # one set per layer
        layers, experts = base.home.shape
        assert split.policy.transition.shape == (layers, experts, experts)
