"""The learned eviction score's fit (solvers/cache/learn.py): its reference walk against the
runtime's kernel, the ranking fit on a known order, and on a slice of real gpt-oss decode
routing the fitted weights' held-out misses below lfru's."""

from __future__ import annotations

import numpy as np
import pytest

from solvers.cache import learn, make_policy
from solvers.cache.learn import (
    FEATURES,
    LRU_WEIGHTS,
    calibration_feature,
    fit_learned,
    rank_fit,
    replay_misses,
    transition_matrix,
)
from solvers.cache.replay import Requests
from tests.real_routing import GPTOSS

LAYERS, EXPERTS = 24, 32
needs_routing = pytest.mark.skipif(not GPTOSS.is_dir(), reason="no ../shared/data/routing")


def gptoss_requests(first: int, count: int, batch: int = 1) -> Requests:
    """Requests of gpt-oss mmlu_dev sequences first .. first + count - 1, `batch` tokens per
    step (consecutive tokens of the slice grouped, enough for the clock's sake)."""
    data = np.load(GPTOSS / "mmlu_dev.npz")
    lens = data["seq_lens"]
    start = int(lens[:first].sum())
    ids = data["expert_ids"][start:start + int(lens[first:first + count].sum())]
    steps = len(ids) // batch
    tokens = ids[:steps * batch].reshape(steps, batch, LAYERS, -1).astype(np.int64)
    requests = Requests.of_tokens(tokens, EXPERTS)
    return Requests(requests.keys, requests.offsets, requests.shape, batch)


@needs_routing
@pytest.mark.parametrize(("batch", "pooled"), [(1, False), (1, True), (3, False), (3, True)])
def test_reference_walk_equals_the_kernel(batch: int, pooled: bool):
    requests = gptoss_requests(0, 6, batch)
    rng = np.random.default_rng(batch + 2 * pooled)
    home = np.zeros((LAYERS, EXPERTS), dtype=np.int64)
    home[:, rng.permutation(EXPERTS)[:EXPERTS // 2]] = 1
    cacheable = rng.random((LAYERS, EXPERTS)) > 0.15
    quotas = rng.integers(1, 7, (2, LAYERS))
    calibration = calibration_feature([requests])
    moves = transition_matrix([requests])
    for weights, transition in ((rng.normal(size=len(FEATURES)), moves),
                                (np.array(LRU_WEIGHTS), None),
                                (rng.normal(size=(LAYERS, len(FEATURES))), moves),
                                (rng.normal(size=(LAYERS, len(FEATURES))), None)):
        policy = make_policy("learned", quotas, LAYERS * EXPERTS, pooled=pooled,
                             weights=weights, calibration=calibration, transition=transition)
        kernel = int(requests.misses(policy, cacheable, home).sum())
        assert replay_misses(requests, cacheable, home, quotas, weights, calibration,
                             pooled, transition) == kernel


def test_rank_fit_recovers_a_known_order():
    """Next uses drawn from a known linear score: the fit ranks the candidates as it does."""
    rng = np.random.default_rng(0)
    rows, candidates = 4000, 8
    x = np.column_stack([rng.normal(size=(rows * candidates, len(FEATURES) - 1)),
                         np.ones(rows * candidates)])
    truth = np.array([-1.0, 0.5, 0.0, 0.25, 0.75, -0.5])
    dist = np.exp2(4 - 2 * (x[:, :-1] @ truth) + rng.normal(scale=0.3, size=len(x)))
    weights = rank_fit(x, np.repeat(np.arange(rows), candidates), np.ceil(dist).astype(int))
    assert weights[-1] == 0 and np.abs(weights).max() == pytest.approx(1.0)
    cosine = weights[:-1] @ truth / np.linalg.norm(weights[:-1]) / np.linalg.norm(truth)
    assert cosine > 0.95


@needs_routing
def test_fitted_weights_beat_lfru_on_held_out_routing():
    """Weights fitted on four folds of 24 calibration sequences, judged on 24 others: fewer
    misses than lfru (and lru) at the same slots; the fit sees the folds only."""
    folds = [gptoss_requests(6 * i, 6) for i in range(4)]
    held = gptoss_requests(24, 24)
    home = np.zeros((LAYERS, EXPERTS), dtype=np.int64)
    cacheable = np.ones((LAYERS, EXPERTS), dtype=bool)
    quotas = np.full((1, LAYERS), 8)
    fit = fit_learned(folds, cacheable, home, quotas)
    again = fit_learned(folds, cacheable, home, quotas)
    assert np.array_equal(fit.weights, again.weights)  # deterministic
    assert fit.weights.shape == (LAYERS, len(FEATURES))
    assert np.allclose(fit.transition, transition_matrix(folds))
    assert len(np.unique(fit.weights, axis=0)) > LAYERS // 2  # each layer ranked on its own
    assert np.allclose(fit.calibration.ravel(), calibration_feature(folds))
    assert fit.misses[-1] < fit.misses[0]  # the fitted score replays fewer than LRU, in sample
    misses = {name: int(held.misses(make_policy(name, quotas, LAYERS * EXPERTS, **extra),
                                    cacheable, home).sum())
              for name, extra in (("lru", {}), ("lfru", {}), ("learned", fit.options))}
    assert misses["learned"] < 0.95 * misses["lfru"]
    assert misses["learned"] < misses["lru"]


def test_transition_counts_the_next_steps_selections(monkeypatch):
    """T[l, k, v]: of the steps selecting k in layer l that have a next step, the share whose
    next step selects v there; counted alike in chunks of any size and across Requests."""
    tokens = np.array([[[0, 1], [2, 3]], [[1, 2], [2, 3]], [[0, 2], [0, 1]],
                       [[0, 1], [2, 3]]])[:, None]  # [steps, 1 token, 2 layers, top-2], E = 4
    requests = Requests.of_tokens(tokens, 4)
    moves = transition_matrix([requests])
    assert moves.shape == (2, 4, 4)
    assert moves[0, 0].tolist() == [0.5, 1.0, 0.5, 0.0]  # 0 at steps 0 and 2 (3 has none)
    assert moves[0, 1].tolist() == [0.5, 0.5, 1.0, 0.0]  # 1 at steps 0 and 1
    assert moves[1, 2].tolist() == [0.5, 0.5, 0.5, 0.5]  # 2, 3 at steps 0 and 1
    assert moves[0, 3].tolist() == [0.0] * 4  # never selected
    monkeypatch.setattr(learn, "TRANSITION_CHUNK", 8)  # 2 steps per chunk
    assert np.array_equal(transition_matrix([requests]), moves)
    halves = [Requests.of_tokens(tokens[:2], 4), Requests.of_tokens(tokens[2:], 4)]
    apart = transition_matrix(halves)  # no step follows across the two
    assert apart[0, 1].tolist() == [0.0, 1.0, 1.0, 0.0]  # 1 at step 0, then [1, 2]


@needs_routing
def test_without_transition_the_fit_leaves_the_feature_out(monkeypatch):
    """Beyond TRANSITION_KEYS the fit has no T: every layer's transition weight is 0, the
    policy carries no T, and the kernel still equals the reference walk."""
    monkeypatch.setattr(learn, "TRANSITION_KEYS", 10)
    folds = [gptoss_requests(2 * i, 2) for i in range(2)]
    home = np.zeros((LAYERS, EXPERTS), dtype=np.int64)
    cacheable = np.ones((LAYERS, EXPERTS), dtype=bool)
    quotas = np.full((1, LAYERS), 6)
    fit = fit_learned(folds, cacheable, home, quotas, rounds=1)
    assert fit.transition is None and not fit.weights[:, FEATURES.index("transition")].any()
    assert fit.weights[:, 0].any()  # the rest was fitted
    policy = make_policy("learned", quotas, LAYERS * EXPERTS, **fit.options)
    assert policy.transition is None and len(policy.calibration()) == LAYERS * EXPERTS
    held = gptoss_requests(4, 2)
    assert int(held.misses(policy, cacheable, home).sum()) == replay_misses(
        held, cacheable, home, quotas, fit.weights, fit.calibration)


@needs_routing
def test_without_identity_the_fit_names_no_expert_and_renaming_changes_little():
    """identity False: the calibration and transition weights are 0 in every layer, the plan
    carries a 0 calibration feature and no T, and the score (age and decayed counts) misses
    about as often on the held-out traffic with each layer's experts renamed; the fit with
    identity, on the same folds, loses more there (it favours the calibration's experts)."""
    folds = [gptoss_requests(6 * i, 6) for i in range(4)]
    held = gptoss_requests(24, 24)
    home = np.zeros((LAYERS, EXPERTS), dtype=np.int64)
    cacheable = np.ones((LAYERS, EXPERTS), dtype=bool)
    quotas = np.full((1, LAYERS), 8)
    free = fit_learned(folds, cacheable, home, quotas, identity=False)
    named = [FEATURES.index("calibration"), FEATURES.index("transition")]
    assert not free.weights[:, named].any() and free.weights[:, 0].any()
    assert free.transition is None and not free.calibration.any()
    renamed = held.relabeled(home, 7)

    def misses(fit, requests: Requests) -> int:
        policy = make_policy("learned", quotas, LAYERS * EXPERTS, **fit.options)
        return int(requests.misses(policy, cacheable, home).sum())

    assert abs(misses(free, renamed) / misses(free, held) - 1) < 0.002
    lfru = int(held.misses(make_policy("lfru", quotas, LAYERS * EXPERTS), cacheable,
                           home).sum())
    assert misses(free, held) < 0.97 * lfru
    named_fit = fit_learned(folds, cacheable, home, quotas)
    assert misses(named_fit, renamed) / misses(named_fit, held) > \
        misses(free, renamed) / misses(free, held)
