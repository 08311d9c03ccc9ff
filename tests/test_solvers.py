"""Solvers against brute force on problems small enough to enumerate."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from solvers import baselines, cost, greedy, homes, ilp, robust
from solvers.errors import SolverError
from solvers.problem import Cards, Placement, Problem, Steps
from solvers.staging import staging_bytes


def small_problem(seed: int, page_bytes: int | None = None, popularity=(0.8, 0.5, 0.2, 0.1),
                  name: str = "a") -> Problem:
    rng = np.random.default_rng(seed)
    num_layers, num_experts = 2, 4
    eb = rng.integers(50, 100, size=(num_layers, num_experts)).astype(np.int64)
    home = homes.contiguous_homes(num_layers, num_experts, 2)
    cards = Cards(np.array([100.0, 80.0]), np.array([0.1, 0.05]), np.array([0, 0]),
                  np.array([150.0]))
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


def test_layer_offload_evicts_whole_layers_last_first() -> None:
    problem = small_problem(0)
    pages = baselines.layer_offload(problem).placement.resident_pages
    for c in range(2):
        mine = problem.home == c
        per_layer = [set(pages[layer][mine[layer]].tolist()) for layer in range(2)]
        assert all(len(s) == 1 for s in per_layer)  # a layer is all in or all out
        assert per_layer[1] <= per_layer[0] or per_layer == [{1}, {1}]


def test_robust_is_no_worse_than_layer_offload_on_any_profile() -> None:
    skewed = small_problem(0, popularity=(0.8, 0.5, 0.2, 0.1), name="skewed")
    reverse = small_problem(1, popularity=(0.1, 0.2, 0.5, 0.8), name="reverse")
    outcome = robust.solve([skewed, reverse], time_limit=10, seed=0)
    assert set(outcome.ratios) == {"skewed", "reverse"}
    assert max(outcome.ratios.values()) <= 1.0 + 1e-9
    assert outcome.result.objective == pytest.approx(max(outcome.ratios.values()))
    plain = ilp.solve(skewed, time_limit=10, seed=0).placement
    layer = baselines.layer_offload(skewed).placement
    plain_worst = max(cost.objective(p, plain) / cost.objective(p, layer)
                      for p in (skewed, reverse))
    assert outcome.result.objective <= plain_worst + 1e-9


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
