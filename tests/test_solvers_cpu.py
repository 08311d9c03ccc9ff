"""The cpu execution model (cold experts computed by the host CPU, or by the GPU after a copy
in steps of offload_min_batch tokens, as llama.cpp 0c1e5709 offloads a MUL_MAT_ID of batch >=
GGML_OP_OFFLOAD_MIN_BATCH) against hand computation and brute force, measured expert curves,
and the MILP's folding of single-card patterns."""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import pytest

from solvers import cost, homes
from solvers.cpu import ExpertCurve, Host, roofline_seconds
from solvers.errors import SolverError
from solvers.patterns import problem_patterns
from solvers.problem import Cards, Placement, Problem, Steps
from solvers.static import baselines, greedy, ilp, robust
from solvers.static.cpu_state import CpuState
from solvers.static.milp_model import milp_data

HOST = Host(memory_bandwidth=1000.0, flops=3000.0, sync_s=0.02, activation_bytes=5.0,
            h2d_bandwidth=1000.0)


def token_steps(rng: np.random.Generator, num_steps: int, batch: int, popularity: np.ndarray,
                top_k: int) -> np.ndarray:
    """[S, B, L, k] distinct experts per token, drawn by `popularity` [L, E]."""
    num_layers, num_experts = popularity.shape
    out = np.empty((num_steps, batch, num_layers, top_k), dtype=np.int64)
    for s, b, layer in itertools.product(range(num_steps), range(batch), range(num_layers)):
        p = popularity[layer] / popularity[layer].sum()
        out[s, b, layer] = rng.choice(num_experts, size=top_k, replace=False, p=p)
    return out


def mask(tokens: np.ndarray, num_experts: int) -> np.ndarray:
    s, b, layer, k = np.indices(tokens.shape)
    out = np.zeros((tokens.shape[0], tokens.shape[2], num_experts), dtype=bool)
    out[s.ravel(), layer.ravel(), tokens.ravel()] = True
    return out


def cpu_problem(seed: int, batch: int = 2, cards: int = 2, num_steps: int = 12,
                host: Host = HOST) -> Problem:
    """A 2 x 4 problem; with `batch` 2 every third step lacks its second token (a step of one
    token), so an offload_min_batch of 2 has the GPU compute only the full steps."""
    rng = np.random.default_rng(seed)
    num_layers, num_experts = 2, 4
    eb = rng.integers(50, 100, size=(num_layers, num_experts)).astype(np.int64)
    flops = rng.uniform(60, 200, size=(num_layers, num_experts))
    popularity = np.array([[0.8, 0.5, 0.2, 0.1], [0.3, 0.9, 0.6, 0.2]])
    tokens = token_steps(rng, num_steps, batch, popularity, top_k=2)
    if batch > 1:
        tokens[::3, 1:] = -1
    hw = Cards(np.full(cards, 100.0), np.full(cards, 0.01), np.zeros(cards, dtype=np.int64),
               np.array([150.0]))
    home = homes.contiguous_homes(num_layers, num_experts, cards)
    capacity = np.full(cards, int(eb.sum() * 0.55 / cards))
    steps = [Steps("t", batch, mask(tokens, num_experts), 1.0, 0.01, tokens)]
    return Problem(eb, home, capacity, hw, steps, None, "cpu", host, flops)


def hand_objective(problem: Problem, placement: Placement) -> float:
    """The cpu model written out token by token, step by step (README / solvers/cpu.py)."""
    cold = placement.resident_pages == 0
    host = problem.host
    total = 0.0
    for st in problem.steps:
        tokens = st.token_ids()
        per_step = []
        for s in range(tokens.shape[0]):
            stall = 0.0
            size = sum(bool((tokens[s, b] >= 0).any()) for b in range(tokens.shape[1]))
            on_gpu = 0 < host.offload_min_batch <= size
            for layer in range(tokens.shape[2]):
                ids = [e for b in range(tokens.shape[1]) for e in tokens[s, b, layer] if e >= 0]
                run = {e for e in ids if cold[layer, e]}
                if on_gpu:
                    stall += sum(problem.expert_bytes[layer, e] for e in run) / host.h2d_bandwidth
                    continue
                for e in run:
                    n = ids.count(e)
                    stall += float(host.expert_seconds(problem.expert_bytes[layer, e],
                                                       problem.expert_flops[layer, e], n))
                waiting = sum(any(cold[layer, e] for e in tokens[s, b, layer] if e >= 0)
                              for b in range(tokens.shape[1]))
                stall += host.sync_s * bool(run) + waiting * host.round_trip_s
            per_step.append(stall)
        total += st.weight * float(np.mean(per_step))
    return total


def brute_force(problem: Problem) -> float:
    best = np.inf
    for bits in itertools.product((0, 1), repeat=problem.expert_bytes.size):
        placement = Placement(np.array(bits).reshape(problem.expert_bytes.shape))
        if placement.fits(problem):
            best = min(best, cost.objective(problem, placement))
    return best


CURVED = replace(HOST, curves=(ExpertCurve(60.0, (1, 2, 4), (0.05, 0.06, 0.1)),
                                ExpertCurve(95.0, (1, 4), (0.2, 0.5))))
OFFLOADING = replace(CURVED, offload_min_batch=2)


def test_roofline_seconds() -> None:
    got = roofline_seconds(np.array([100.0, 100.0, 100.0]), np.array([10.0, 10.0, 10.0]),
                           np.array([0, 1, 50]), memory_bandwidth=10.0, flops=20.0)
    assert got.tolist() == [0.0, 10.0, 25.0]
    assert HOST.expert_seconds(100.0, 10.0, 50).tolist() == 100 / 1000.0 * 0 + 50 * 10 / 3000.0


def test_measured_curves_interpolate_and_scale_by_bytes() -> None:
    """Linear between the measured points and from 0, along the last segment past the last;
    each expert takes the curve measured nearest in bytes, scaled by its bytes."""
    curve = CURVED.curves[0]
    np.testing.assert_allclose(curve.at(np.array([0, 0.5, 1, 3, 4, 6])),
                               [0.0, 0.025, 0.05, 0.08, 0.1, 0.14])
    got = CURVED.expert_seconds(np.array([[60.0, 30.0, 90.0, 100.0]]), np.ones((1, 4)),
                                np.array([[4, 4, 0, 4]]))
    np.testing.assert_allclose(got, [[0.1, 0.05, 0.0, 0.5 * 100 / 95]])
    for bad in (ExpertCurve(60.0, (0, 4), (0.1, 0.2)), ExpertCurve(60.0, (1, 2), (0.2, 0.1)),
                ExpertCurve(0.0, (1,), (0.1,))):
        with pytest.raises(SolverError, match="expert curve"):
            replace(HOST, curves=(bad,)).check()
    assert OFFLOADING.offloads(np.array([1, 2, 3])).tolist() == [False, True, True]
    assert not replace(HOST, offload_min_batch=0).offloads(64)


@pytest.mark.parametrize("host", [HOST, CURVED, OFFLOADING], ids=["roofline", "curves",
                                                                  "offload"])
@pytest.mark.parametrize("seed", range(4))
def test_cpu_replay_equals_hand_computation(seed: int, host: Host) -> None:
    problem = cpu_problem(seed, host=host)
    rng = np.random.default_rng(seed + 10)
    for _ in range(5):
        placement = Placement(rng.integers(0, 2, size=problem.expert_bytes.shape))
        assert cost.objective(problem, placement) == pytest.approx(
            hand_objective(problem, placement), rel=1e-12)


@pytest.mark.parametrize("host", [HOST, OFFLOADING], ids=["roofline", "offload"])
@pytest.mark.parametrize("seed", range(4))
def test_cpu_patterns_and_state_price_every_move_exactly(seed: int, host: Host) -> None:
    problem = cpu_problem(seed, host=host)
    rng = np.random.default_rng(seed)
    pages = rng.integers(0, 2, size=problem.expert_bytes.shape)
    state = CpuState(problem, problem_patterns(problem), pages)
    assert state.objective() == pytest.approx(cost.objective(problem, Placement(pages)),
                                              rel=1e-12)
    every = np.arange(state.entry_row.size)
    rise = np.bincount(state.entry_expert, weights=state.evict_rise(every),
                       minlength=pages.size)
    drop = np.bincount(state.entry_expert, weights=state.restore_drop(every),
                       minlength=pages.size)
    before = state.objective()
    for x in range(pages.size):
        step = -1 if state.pages[x] else +1
        state.move(np.array([x]), step)
        change = state.objective() - before
        assert change == pytest.approx(rise[x] if step < 0 else drop[x], abs=1e-12)
        state.move(np.array([x]), -step)


@pytest.mark.parametrize("host", [HOST, OFFLOADING], ids=["roofline", "offload"])
@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("batch", [1, 2])
def test_cpu_ilp_matches_brute_force(seed: int, batch: int, host: Host) -> None:
    problem = cpu_problem(seed, batch=batch, host=host)
    result = ilp.solve(problem, time_limit=10, seed=0)
    assert result.status == "optimal"
    assert result.objective == pytest.approx(brute_force(problem), rel=1e-9)
    assert result.bound <= result.objective + 1e-12
    assert result.placement.fits(problem)
    for other in (greedy.solve(problem, seed=0), baselines.layer_offload(problem),
                  baselines.uniform(problem, top_k=2, seed=0)):
        assert other.placement.fits(problem), other.solver
        assert other.objective >= result.objective - 1e-12, other.solver


def test_cpu_layer_offload_equals_a_hand_computation() -> None:
    """llama.cpp's --n-cpu-moe N at this budget: the first layer's experts all on the CPU, or
    copied to the GPU in the steps of offload_min_batch tokens."""
    for host in (HOST, replace(HOST, offload_min_batch=2)):
        problem = cpu_problem(1, batch=2, host=host)
        second = np.bincount(problem.home[1], weights=problem.expert_bytes[1], minlength=2)
        problem = replace(problem, capacity=second.astype(np.int64))  # the second layer fits
        placement = baselines.layer_offload(problem).placement
        assert placement.resident_pages.tolist() == [[0, 0, 0, 0], [1, 1, 1, 1]]
        tokens = problem.steps[0].tokens
        expected = []
        for s in range(tokens.shape[0]):
            ids = [e for e in tokens[s, :, 0].ravel().tolist() if e >= 0]
            full = s % 3 != 0  # every third step holds one token
            if full and host.offloads(2):
                expected.append(sum(problem.expert_bytes[0, e] for e in set(ids)) / 1000.0)
                continue
            compute = sum(max(problem.expert_bytes[0, e] / 1000.0,
                              ids.count(e) * problem.expert_flops[0, e] / 3000.0)
                          for e in set(ids))
            waiting = 2 if full else 1
            expected.append(compute + 0.02 + waiting * 2 * 5.0 / 1000.0)  # sync, round trips
        assert cost.objective(problem, placement) == pytest.approx(np.mean(expected),
                                                                   rel=1e-12)


def test_cpu_robust_is_never_worse_than_layer_offload() -> None:
    a, b = cpu_problem(2), cpu_problem(3)
    b = replace(a, steps=b.steps)
    outcome = robust.solve([a, b], time_limit=10, seed=0)
    assert max(outcome.ratios.values()) <= 1.0 + 1e-9
    assert outcome.result.placement.fits(a)


def test_cpu_execution_refuses_pages_and_a_missing_host() -> None:
    problem = cpu_problem(0)
    with pytest.raises(SolverError, match="whole experts"):
        greedy.solve(replace(problem, page_bytes=30))
    with pytest.raises(SolverError, match=r"\[host\]"):
        greedy.solve(replace(problem, host=None))
    with pytest.raises(SolverError, match="tokens of each step"):
        greedy.solve(replace(problem, steps=[replace(problem.steps[0], tokens=None)]))


@pytest.mark.parametrize("page_bytes", [None, 40])
def test_one_card_folds_to_a_knapsack_and_stays_exact(page_bytes: int | None) -> None:
    """On one card every pattern's stall is a sum over its experts: the MILP keeps no time row
    (whatever the number of steps) and still finds the brute-force optimum."""
    rng = np.random.default_rng(5)
    eb = rng.integers(50, 100, size=(2, 4)).astype(np.int64)
    selected = rng.random((300, 2, 4)) < np.array([0.7, 0.4, 0.2, 0.1])
    hw = Cards(np.array([100.0]), np.array([0.1]), np.array([0]), np.array([np.inf]))
    problem = Problem(eb, np.zeros((2, 4), dtype=np.int64), np.array([int(eb.sum() * 0.5)]), hw,
                      [Steps("a", 1, selected, 1.0, 0.01)], page_bytes)
    assert milp_data(problem, problem_patterns(problem)).num_time_rows == 0
    result = ilp.solve(problem, time_limit=10, seed=0)
    ranges = [range(int(n) + 1) for n in problem.num_pages().ravel()]
    best = min(cost.objective(problem, Placement(np.array(p).reshape(eb.shape)))
               for p in itertools.product(*ranges)
               if Placement(np.array(p).reshape(eb.shape)).fits(problem))
    assert result.status == "optimal"
    assert result.objective == pytest.approx(best, rel=1e-9)
