"""Solvers against brute force on problems small enough to enumerate."""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import pytest

from solvers import cost, homes
from solvers.errors import SolverError
from solvers.patterns import problem_patterns
from solvers.problem import Cards, Placement, Problem, Steps
from solvers.staging import staging_bytes
from solvers.static import baselines, greedy, ilp, robust
from solvers.static.lp_bound import dual_bound, pdlp_duals
from solvers.static.milp_model import milp_data
from solvers.static.stall_state import StallState


def small_problem(seed: int, page_bytes: int | None = None, popularity=(0.8, 0.5, 0.2, 0.1),
                  name: str = "a", traffic_seed: int | None = None) -> Problem:
    rng = np.random.default_rng(seed)
    num_layers, num_experts = 2, 4
    eb = rng.integers(50, 100, size=(num_layers, num_experts)).astype(np.int64)
    home = homes.contiguous_homes(num_layers, num_experts, 2)
    cards = Cards(np.array([100.0, 80.0]), np.array([0.1, 0.05]), np.array([0, 0]),
                  np.array([150.0]))
    if traffic_seed is not None:
        rng = np.random.default_rng(traffic_seed)
    selected = rng.random((40, num_layers, num_experts)) < np.array(popularity)
    return Problem(eb, home, np.array([150, 120]), cards, [Steps(name, 1, selected, 1.0, 0.01)],
                   page_bytes)


def brute_force(problem: Problem) -> float:
    ranges = [range(int(n) + 1) for n in problem.num_pages().ravel()]
    best = np.inf
    for pages in itertools.product(*ranges):
        placement = Placement(np.array(pages).reshape(problem.expert_bytes.shape))
        if placement.fits(problem):
            best = min(best, cost.objective(problem, placement))
    return best


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("page_bytes", [None, 40])
def test_ilp_matches_brute_force(seed: int, page_bytes: int | None) -> None:
    problem = small_problem(seed, page_bytes)
    result = ilp.solve(problem, time_limit=10, seed=0)
    assert result.status == "optimal"
    assert result.objective == pytest.approx(brute_force(problem), rel=1e-9)
    assert result.objective == pytest.approx(cost.objective(problem, result.placement), rel=0)
    assert result.bound <= result.objective + 1e-12
    assert result.placement.fits(problem)


@pytest.mark.parametrize("seed", range(5))
def test_heuristics_fit_and_ilp_is_never_worse(seed: int) -> None:
    problem = small_problem(seed, page_bytes=30)
    best = ilp.solve(problem, time_limit=10, seed=0).objective
    for result in (greedy.solve(problem, seed=0), baselines.layer_offload(problem),
                   baselines.uniform(problem, top_k=2, seed=0)):
        assert result.placement.fits(problem), result.solver
        assert result.objective >= best - 1e-12, result.solver


def test_greedy_beats_layer_offload_on_skewed_traffic() -> None:
    problem = small_problem(0)
    assert greedy.solve(problem).objective < baselines.layer_offload(problem).objective


def test_ilp_is_deterministic() -> None:
    problem = small_problem(3, page_bytes=30)
    a, b = (ilp.solve(problem, time_limit=10, seed=7) for _ in range(2))
    assert np.array_equal(a.placement.resident_pages, b.placement.resident_pages)


def test_layer_offload_makes_a_prefix_of_whole_layers_cold() -> None:
    for seed in range(4):
        problem = small_problem(seed)
        pages = baselines.layer_offload(problem).placement.resident_pages
        cold = [not row.any() for row in pages]
        assert all(row.all() or not row.any() for row in pages)  # whole layers, every card
        assert cold == sorted(cold, reverse=True)  # the cold layers come first
        assert baselines.layer_offload(problem).placement.fits(problem)

def regrets(problems: list[Problem], placement: Placement) -> list[float]:
    """stall_k / (profile k's own greedy stall, or layer offload's where that is 0, or 1)."""
    layer = baselines.layer_offload(problems[0]).placement
    out = []
    for p in problems:
        unit = greedy.solve(p, seed=0).objective or cost.objective(p, layer) or 1.0
        out.append(cost.objective(p, placement) / unit)
    return out


def test_robust_minimizes_the_mean_regret_never_worse_than_layer_offload() -> None:
    skewed = small_problem(0, popularity=(0.8, 0.5, 0.2, 0.1), name="skewed")
    reverse = small_problem(0, popularity=(0.1, 0.2, 0.5, 0.8), name="reverse",
                            traffic_seed=1)
    problems = [skewed, reverse]
    outcome = robust.solve(problems, time_limit=10, seed=0)
    assert set(outcome.ratios) == {"skewed", "reverse"}
    assert max(outcome.ratios.values()) <= 1.0 + 1e-9
    assert outcome.result.objective == pytest.approx(
        np.mean(regrets(problems, outcome.result.placement)), rel=1e-9)
    assert outcome.result.objective == pytest.approx(least_mean_regret(problems), rel=1e-9)
    assert outcome.result.bound <= outcome.result.objective + 1e-12


def least_mean_regret(problems: list[Problem], guarded: bool = True) -> float:
    """The least mean regret of a placement (never worse than layer offload where `guarded`),
    by brute force."""
    first = problems[0]
    layer = baselines.layer_offload(first).placement
    best = np.inf
    for bits in itertools.product((0, 1), repeat=first.expert_bytes.size):
        placement = Placement(np.array(bits).reshape(first.expert_bytes.shape))
        safe = all(cost.objective(p, placement) <= cost.objective(p, layer) * (1 + 1e-12)
                   for p in problems)
        if placement.fits(first) and (safe or not guarded):
            best = min(best, float(np.mean(regrets(problems, placement))))
    return best


def test_robust_pdlp_path_bounds_the_mean_regret(monkeypatch: pytest.MonkeyPatch) -> None:
    """The path of full-size problems: a bound from the guard-free LP, candidates rounded from
    it; the placement stays guarded and the bound below the brute-force optimum."""
    monkeypatch.setattr(robust, "SCIP_MAX_TIME_ROWS", 0)
    problems = [small_problem(0, popularity=(0.8, 0.5, 0.2, 0.1), name="skewed"),
                small_problem(0, popularity=(0.1, 0.2, 0.5, 0.8), name="reverse",
                              traffic_seed=1)]
    a, b = (robust.solve(problems, time_limit=10, seed=0) for _ in range(2))
    assert np.array_equal(a.result.placement.resident_pages, b.result.placement.resident_pages)
    assert max(a.ratios.values()) <= 1.0 + 1e-9
    assert a.result.objective == pytest.approx(
        np.mean(regrets(problems, a.result.placement)), rel=1e-9)
    optimum, unguarded = least_mean_regret(problems), least_mean_regret(problems, False)
    assert 0.5 * optimum <= a.result.bound <= unguarded + 1e-12  # the guard-free LP's bound
    assert optimum <= a.result.objective + 1e-12
    # The bound is the LP bound of the summed regrets (each profile's steps over its own
    # greedy stall), as ilp's full-size path computes it, over the number of profiles.
    monkeypatch.setattr(ilp, "SCIP_MAX_TIME_ROWS", 0)
    units = [greedy.solve(p, seed=0).objective for p in problems]
    summed = Problem(problems[0].expert_bytes, problems[0].home, problems[0].capacity,
                     problems[0].cards, [replace(st, weight=st.weight / u)
                                         for p, u in zip(problems, units, strict=True)
                                         for st in p.steps])
    assert a.result.bound == pytest.approx(ilp.solve(summed, time_limit=10).bound / 2, rel=1e-9)
    assert a.result.gap > 0  # this LP relaxation is not tight: the bound was not clipped
    assert 0.0 <= a.result.gap < 1.0


def test_robust_worst_minimizes_the_worst_ratio_to_layer_offload() -> None:
    skewed = small_problem(0, popularity=(0.8, 0.5, 0.2, 0.1), name="skewed")
    reverse = small_problem(0, popularity=(0.1, 0.2, 0.5, 0.8), name="reverse",
                            traffic_seed=1)
    outcome = robust.solve([skewed, reverse], time_limit=10, seed=0, objective="worst")
    assert outcome.result.objective == pytest.approx(max(outcome.ratios.values()), rel=1e-9)
    layer = baselines.layer_offload(skewed).placement
    best = min(max(cost.objective(p, pl) / cost.objective(p, layer) for p in (skewed, reverse))
               for pl in (Placement(np.array(bits).reshape(skewed.expert_bytes.shape))
                          for bits in itertools.product((0, 1), repeat=8))
               if pl.fits(skewed))
    assert outcome.result.objective == pytest.approx(min(best, 1.0), rel=1e-9)


def test_staging_bytes_is_one_layers_worst_fetch() -> None:
    eb = np.array([[10, 20, 30, 40], [5, 5, 5, 100]])
    home = np.array([[0, 0, 1, 1], [0, 0, 0, 1]])
    assert staging_bytes(eb, home, 3, max_batch=1, top_k=2).tolist() == [40, 200, 0]
    assert staging_bytes(eb, home, 3, max_batch=4, top_k=2).tolist() == [60, 200, 0]


def test_balanced_homes_even_out_skewed_load() -> None:
    rng = np.random.default_rng(0)
    load = np.sort(rng.pareto(1.5, size=(3, 16)), axis=1)[:, ::-1]
    eb = np.ones((3, 16), dtype=np.int64)
    bal = homes.balanced_homes(load, eb, 4)
    cont = homes.contiguous_homes(3, 16, 4)

    def worst(home: np.ndarray) -> float:
        return max(np.bincount(home[layer], weights=load[layer], minlength=4).max()
                   for layer in range(3))

    assert worst(bal) < worst(cont)
    assert all(np.bincount(bal[layer], minlength=4).tolist() == [4] * 4 for layer in range(3))


def test_malformed_problem_is_refused() -> None:
    problem = small_problem(0)
    bad = Problem(problem.expert_bytes, problem.home, np.array([-1, 10]), problem.cards,
                  problem.steps)
    with pytest.raises(SolverError, match="negative capacity"):
        ilp.solve(bad, time_limit=1, seed=0)


def eplb_balanced_packing(weight: np.ndarray, num_packs: int) -> np.ndarray:
    """deepseek-ai/EPLB's balanced_packing for one layer, ported to numpy: items in
    decreasing weight into the lightest pack that still has room (E / C items per pack)."""
    per_pack = weight.size // num_packs
    pack_weight, pack_items = [0.0] * num_packs, [0] * num_packs
    out = np.empty(weight.size, dtype=np.int64)
    for item in np.argsort(-weight, kind="stable"):
        pack = min((i for i in range(num_packs) if pack_items[i] < per_pack),
                   key=pack_weight.__getitem__)
        out[item] = pack
        pack_weight[pack] += weight[item]
        pack_items[pack] += 1
    return out


def test_balanced_homes_no_worse_than_eplb_balanced_packing() -> None:
    rng = np.random.default_rng(1)
    for trial in range(20):
        load = rng.pareto(1.2, size=(2, 32)) + rng.random((2, 32))
        bal = homes.balanced_homes(load, np.ones((2, 32), dtype=np.int64), 4)
        for layer in range(2):
            mine = np.bincount(bal[layer], weights=load[layer], minlength=4).max()
            eplb = eplb_balanced_packing(load[layer], 4)
            theirs = np.bincount(eplb, weights=load[layer], minlength=4).max()
            assert mine <= theirs + 1e-12, trial
            assert np.bincount(bal[layer], minlength=4).tolist() == [8] * 4


def test_balanced_homes_uneven_counts_differ_by_at_most_one() -> None:
    load = np.random.default_rng(2).random((3, 10))
    bal = homes.balanced_homes(load, np.ones((3, 10), dtype=np.int64), 4)
    for layer in range(3):
        counts = np.bincount(bal[layer], minlength=4)
        assert counts.sum() == 10 and counts.max() - counts.min() <= 1


def test_contiguous_homes() -> None:
    assert homes.contiguous_homes(2, 8, 4).tolist() == [[0, 0, 1, 1, 2, 2, 3, 3]] * 2
    assert homes.contiguous_homes(1, 5, 2).tolist() == [[0, 0, 0, 1, 1]]


def test_staging_bytes_caps_at_batch_times_top_k() -> None:
    eb = np.full((3, 8), 7, dtype=np.int64)
    eb[2, 1] = 11  # the largest expert of card 0
    home = homes.contiguous_homes(3, 8, 2)  # 4 experts per card per layer
    assert staging_bytes(eb, home, 2, max_batch=1, top_k=2).tolist() == [22, 14]
    assert staging_bytes(eb, home, 2, max_batch=8, top_k=2).tolist() == [44, 28]
    assert staging_bytes(eb, home, 2, max_batch=1, top_k=2).dtype == np.int64


def test_layer_offload_offloads_the_fewest_layers_that_fit_every_card() -> None:
    problem = small_problem(0)
    sizes = problem.expert_bytes
    # card 0 could keep everything, card 1 only layer 1's experts: layer 0 goes on both.
    cap = np.array([int(sizes[:, :2].sum()), int(sizes[1, 2:].sum())])
    p = Problem(sizes, problem.home, cap, problem.cards, problem.steps)
    result = baselines.layer_offload(p)
    assert result.placement.resident_pages.tolist() == [[0, 0, 0, 0], [1, 1, 1, 1]]
    assert result.status == "heuristic" and np.isnan(result.bound)
    assert result.objective == cost.objective(p, result.placement)

def test_uniform_is_seeded_fits_and_spreads_over_layers() -> None:
    problem = small_problem(4, page_bytes=30)
    a, b = (baselines.uniform(problem, top_k=2, seed=3) for _ in range(2))
    assert np.array_equal(a.placement.resident_pages, b.placement.resident_pages)
    assert a.placement.fits(problem)
    free = problem.capacity - a.placement.card_resident_bytes(problem)
    assert np.all(free < 30)  # only the tail pages needed to fit were evicted
    assert a.objective == cost.objective(problem, a.placement)


def test_robust_with_a_profile_layer_offload_never_stalls_on() -> None:
    # Profile "early" only selects layer 1, which layer offload keeps resident: Z = 0.
    base = small_problem(0, name="skewed")
    sizes = base.expert_bytes
    cap = np.array([int(sizes[1, :2].sum()), int(sizes[1, 2:].sum())])  # one layer fits
    skewed = Problem(sizes, base.home, cap, base.cards, base.steps)
    sel = np.zeros_like(skewed.steps[0].selected)
    sel[:, 1, :] = skewed.steps[0].selected[:, 1, :]
    early = Problem(skewed.expert_bytes, skewed.home, skewed.capacity, skewed.cards,
                    [Steps("early", 1, sel, 1.0, 0.01)])
    layer = baselines.layer_offload(skewed).placement
    assert cost.objective(early, layer) == 0.0
    outcome = robust.solve([skewed, early], time_limit=10, seed=0)
    assert outcome.ratios["early"] == 1.0
    assert cost.objective(early, outcome.result.placement) == 0.0
    assert outcome.ratios["skewed"] <= 1.0 + 1e-9
    assert outcome.result.objective == pytest.approx(
        np.mean(regrets([skewed, early], outcome.result.placement)), rel=1e-9)
    assert np.isfinite(outcome.result.bound) and outcome.result.bound <= outcome.result.objective


def test_robust_refuses_profiles_with_different_layouts() -> None:
    a = small_problem(0, name="a")
    b = small_problem(1, name="b")  # other expert sizes
    with pytest.raises(SolverError, match="only the steps may differ"):
        robust.solve([a, b], time_limit=1, seed=0)


def _with(problem: Problem, **changes) -> Problem:
    fields = dict(expert_bytes=problem.expert_bytes, home=problem.home,
                  capacity=problem.capacity, cards=problem.cards, steps=problem.steps,
                  page_bytes=problem.page_bytes)
    fields.update(changes)
    return Problem(**fields)


@pytest.mark.parametrize("change", [
    dict(expert_bytes=np.zeros((2, 4), dtype=np.int64)),
    dict(expert_bytes=np.ones((2, 4))),  # float sizes
    dict(home=np.zeros((2, 3), dtype=np.int64)),
    dict(home=np.full((2, 4), 5, dtype=np.int64)),
    dict(capacity=np.array([10])),
    dict(steps=[]),
    dict(steps=[Steps("x", 1, np.ones((3, 2, 4), dtype=np.int8), 1.0)]),
    dict(steps=[Steps("x", 1, np.ones((3, 2, 5), dtype=bool), 1.0)]),
    dict(steps=[Steps("x", 1, np.ones((3, 2, 4), dtype=bool), -1.0)]),
    dict(page_bytes=0),
    dict(cards=Cards(np.array([0.0, 1.0]), np.array([0.1, 0.1]), np.array([0, 0]),
                     np.array([1.0]))),
    dict(cards=Cards(np.array([1.0, 1.0]), np.array([0.1, 0.1]), np.array([0, 1]),
                     np.array([1.0]))),
])
def test_malformed_input_raises_solver_error(change: dict) -> None:
    bad = _with(small_problem(0), **change)
    for solve in (lambda p: ilp.solve(p, time_limit=1, seed=0), greedy.solve,
                  lambda p: robust.solve([p, p], time_limit=1, seed=0)):
        with pytest.raises(SolverError):
            solve(bad)


def test_malformed_homes_input_raises_solver_error() -> None:
    with pytest.raises(SolverError):
        homes.balanced_homes(np.ones((2, 4)), np.ones((2, 3)), 2)
    with pytest.raises(SolverError):
        homes.balanced_homes(-np.ones((2, 4)), np.ones((2, 4)), 2)
    with pytest.raises(SolverError):
        homes.contiguous_homes(2, 4, 0)


def naive_objective(problem: Problem, placement: Placement) -> float:
    """cost.objective written out step by step, layer by layer, card by card."""
    cold = placement.cold_bytes(problem)
    cards = problem.cards
    total = 0.0
    for st in problem.steps:
        per_step = []
        for sel in st.selected:
            stall = 0.0
            for layer in range(problem.num_layers):
                times = []
                link_bytes = np.zeros(cards.num_links)
                for c in range(problem.num_cards):
                    mine = sel[layer] & (problem.home[layer] == c) & (cold[layer] > 0)
                    moved = float(cold[layer][mine].sum())
                    times.append(mine.sum() * cards.latency[c] + moved / cards.bandwidth[c])
                    link_bytes[cards.link_of[c]] += moved
                times += list(link_bytes / cards.link_bandwidth)
                stall += max(times)
            per_step.append(stall)
        total += st.weight * float(np.mean(per_step))
    return total


def two_link_problem(seed: int, page_bytes: int | None) -> Problem:
    rng = np.random.default_rng(seed)
    eb = rng.integers(50, 100, size=(3, 6)).astype(np.int64)
    home = homes.contiguous_homes(3, 6, 3)
    cards = Cards(np.array([100.0, 80.0, 90.0]), np.array([0.1, 0.05, 0.02]),
                  np.array([0, 0, 1]), np.array([120.0, 60.0]))
    steps = [Steps(f"b{b}", b, rng.random((25, 3, 6)) < 0.3 * b, 0.5) for b in (1, 2)]
    return Problem(eb, home, np.array([150, 160, 140]), cards, steps, page_bytes)


@pytest.mark.parametrize("page_bytes", [None, 30])
def test_cost_objective_matches_naive_replay(page_bytes: int | None) -> None:
    problem = two_link_problem(0, page_bytes)
    rng = np.random.default_rng(1)
    for _ in range(5):
        pages = rng.integers(0, problem.num_pages() + 1)
        placement = Placement(pages)
        assert cost.objective(problem, placement) == pytest.approx(
            naive_objective(problem, placement), rel=1e-12)


@pytest.mark.parametrize("page_bytes", [None, 30])
def test_stall_state_prices_match_moves(page_bytes: int | None) -> None:
    """Each expert's price, its entries' evict_rise / restore_drop summed by per_expert as
    local_search sums them, is the objective change of moving one page of it."""
    problem = two_link_problem(2, page_bytes)
    patterns = problem_patterns(problem)
    rng = np.random.default_rng(3)
    state = StallState(problem, patterns, rng.integers(0, problem.num_pages() + 1))
    for layer in range(problem.num_layers):
        span = state.entries_of_layer(layer)
        evict = state.per_expert(layer, state.evict_rise(span))
        restore = state.per_expert(layer, state.restore_drop(span))
        before = state.objective()
        for e in range(problem.num_experts):
            x = np.array([layer * problem.num_experts + e])
            for step, price, ok in ((-1, evict, state.pages[x[0]] > 0),
                                    (+1, restore, state.pages[x[0]] < state.num_pages[x[0]])):
                if not ok:
                    continue
                state.move(x, step)
                assert state.objective() - before == pytest.approx(price[e], abs=1e-12)
                state.move(x, -step)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("page_bytes", [None, 40])
def test_dual_bound_is_below_brute_force_for_any_multipliers(seed: int,
                                                             page_bytes: int | None) -> None:
    problem = small_problem(seed, page_bytes)
    optimum = brute_force(problem)
    data = milp_data(problem, problem_patterns(problem))
    _, duals, converged = pdlp_duals(data, time_limit=10, iteration_limit=100_000, rel_tol=1e-8)
    assert converged
    near = dual_bound(data, duals) * data.time_scale
    assert near <= optimum + 1e-12
    assert near >= 0.5 * optimum  # the LP bound is not vacuous here
    rng = np.random.default_rng(seed)
    for _ in range(20):  # any multipliers, even of the wrong sign or size, stay valid
        noisy = duals * rng.uniform(0, 3, duals.size) + rng.normal(0, 0.1, duals.size)
        assert dual_bound(data, noisy) * data.time_scale <= optimum + 1e-12


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("page_bytes", [None, 40])
def test_ilp_pdlp_path_bound_and_placement(seed: int, page_bytes: int | None,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ilp, "SCIP_MAX_TIME_ROWS", 0)  # the path of full-size problems
    problem = small_problem(seed, page_bytes)
    optimum = brute_force(problem)
    a, b = (ilp.solve(problem, time_limit=10, seed=0) for _ in range(2))
    assert np.array_equal(a.placement.resident_pages, b.placement.resident_pages)
    assert a.placement.fits(problem)
    assert a.bound <= optimum + 1e-12 <= a.objective + 2e-12
    assert a.objective == cost.objective(problem, a.placement)
    assert a.objective <= greedy.solve(problem, seed=0).objective
    assert a.status == "feasible"


def test_ilp_stopped_early_reports_a_bound_in_zero_to_objective() -> None:
    """SCIP stopped before its root LP has only a huge negative bound, or none at all on a
    loaded machine: stalls are never negative, so the reported bound is clamped to
    [0, objective] (0 without one) and the gap to [0, 1]."""
    from synthetic import deepseek_like, steps_from_tokens

    layers, experts, cards = 8, 64, 4
    selected, seq_ids = deepseek_like(layers, experts, 4, num_tokens=4096, num_seqs=256, seed=1)
    steps = [steps_from_tokens(selected, seq_ids, experts, 8, 300, 2, name="b8", weight=1.0,
                               base_step_s=0.02)]
    eb = np.full((layers, experts), 1 << 20, dtype=np.int64)
    home = homes.contiguous_homes(layers, experts, cards)
    hw = Cards(bandwidth=np.full(cards, 25e9), latency=np.full(cards, 1e-5),
               link_of=np.zeros(cards, dtype=np.int64), link_bandwidth=np.array([50e9]))
    problem = Problem(eb, home, np.full(cards, 0.6 * layers * experts / cards * (1 << 20),
                                        dtype=np.int64), hw, steps, None)
    result = ilp.solve(problem, time_limit=0.05, seed=0)
    assert 0.0 <= result.bound <= result.objective
    assert 0.0 <= result.gap <= 1.0


@pytest.mark.parametrize("page_bytes", [None, 30])
def test_pattern_objective_equals_replay_on_every_kind_of_layer(page_bytes: int | None) -> None:
    """problem_patterns reads a layer on one card whose link never binds as its experts'
    selection frequencies and merges every other layer's steps: either way the patterns'
    objective is the replayed one, for any placement."""
    problem = two_link_problem(4, page_bytes)
    # Layer 0 on card 0 (its link is faster: frequencies), layer 1 on card 2 (its link is
    # slower: merged), layer 2 split over cards 0 and 1 (merged, then folded).
    home = np.array([[0] * 6, [2] * 6, [0, 1] * 3])
    problem = Problem(problem.expert_bytes, home, problem.capacity, problem.cards,
                      problem.steps, page_bytes)
    patterns = problem_patterns(problem)
    assert patterns[0].selected.sum(axis=1).max() == 1
    assert patterns[1].selected.sum(axis=1).max() > 1
    rng = np.random.default_rng(5)
    for _ in range(10):
        pages = rng.integers(0, problem.num_pages() + 1)
        assert greedy.new_state(problem, patterns, pages).objective() == pytest.approx(
            cost.objective(problem, Placement(pages)), rel=1e-12)
