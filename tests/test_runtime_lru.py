"""The LRU of staged experts and the staging it predicts."""

from __future__ import annotations

import numpy as np
import pytest

from solvers.cache import ExpertLRU, Lookup, simulate_lru


def test_lru_hits_misses_and_eviction_order():
    lru = ExpertLRU(2)
    assert lru.lookup(["a", "b"]) == [Lookup(False, 0), Lookup(False, 1)]
    assert lru.lookup(["a"]) == [Lookup(True, 0)]  # a is now the most recent
    assert lru.lookup(["c"]) == [Lookup(False, 1)]  # evicts b, the least recent
    assert "b" not in lru and "a" in lru and "c" in lru
    assert lru.lookup(["a", "c"]) == [Lookup(True, 0), Lookup(True, 1)]


def test_lru_never_evicts_what_the_same_fetch_needs():
    lru = ExpertLRU(2)
    lru.lookup(["a", "b"])
    # a and b are hits of this fetch: c and d cannot take their slots, so both go to staging
    assert lru.lookup(["a", "b", "c", "d"]) == [Lookup(True, 0), Lookup(True, 1),
                                                Lookup(False, None), Lookup(False, None)]
    assert lru.lookup(["c"]) == [Lookup(False, 0)]  # a was least recently used
    with pytest.raises(ValueError):
        lru.lookup(["x", "x"])


def test_no_slots_stages_every_selected_cold_expert():
    assert ExpertLRU(0).lookup(["a", "b"]) == [Lookup(False, None)] * 2


def random_traffic(seed: int = 0, steps: int = 30, layers: int = 3, experts: int = 8,
                   cards: int = 2):
    rng = np.random.default_rng(seed)
    selected = rng.random((steps, layers, experts)) < 0.3
    cold = rng.integers(1, 1000, (layers, experts)) * (rng.random((layers, experts)) < 0.7)
    home = rng.integers(0, cards, (layers, experts))
    return selected, cold, home


def test_without_cache_the_prediction_is_the_cost_model_union():
    selected, cold, home = random_traffic()
    counts = simulate_lru(selected, cold, home, 2, 0)
    for c in range(2):
        mine = selected & (cold > 0) & (home == c)
        assert np.array_equal(counts.copies[..., c], mine.sum(axis=2))
        assert np.array_equal(counts.bytes[..., c], (mine * cold).sum(axis=2))
    assert not counts.hits.any()


def test_cache_slots_stage_less_and_enough_slots_stage_each_expert_once():
    selected, cold, home = random_traffic()
    none = simulate_lru(selected, cold, home, 2, 0)
    some = simulate_lru(selected, cold, home, 2, 3)
    every = simulate_lru(selected, cold, home, 2, 24)
    assert every.bytes.sum() <= some.bytes.sum() <= none.bytes.sum()
    ever = (selected & (cold > 0)).any(axis=0)
    assert every.copies.sum() == ever.sum() and every.bytes.sum() == (ever * cold).sum()
    assert np.array_equal(some.copies + some.hits, none.copies)
