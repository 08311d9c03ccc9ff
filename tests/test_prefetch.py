"""The prefetch replay (solvers/cache/prefetch.py) on hand-made routing, counts worked out by
hand, and its MIN line against solvers.cache.belady's bound on random routing."""

from __future__ import annotations

import numpy as np
import pytest

from solvers.cache.belady import _min_hits
from solvers.cache.prefetch import Counts, Link, Prefetch, quality, replay

N = -1
# 3 steps x 2 MoE layers x top-2, 4 experts a layer. Layer 0 needs expert 0 every step;
# layer 1 needs 1, 1, then {2, 3}.
ACTUAL = np.array([[[0, N], [1, N]],
                   [[0, N], [1, N]],
                   [[0, N], [2, 3]]])
# Predicted for layer 1: 1 (right), 2 (wrong), then 3 and 2 (both right, best first).
PREDICTED = np.array([[[N, N], [1, N]],
                      [[N, N], [2, N]],
                      [[N, N], [3, 2]]])
LINK = Link(copy_s=1.0, window_s=1.5, expert_bytes=10)


def test_per_layer_quotas_keep_layers_apart():
    """One slot per layer: layer 1's prefetches never evict layer 0's expert 0, so it hits
    in steps 1 and 2 (pooled, the same 2 slots missed it in step 2); layer 1 has one slot:
    step 2 prefetches 3 (useful) and, cap 1 reached, not 2 (a miss)."""
    got = replay(ACTUAL, PREDICTED, np.array([1, 1]), LINK, Prefetch(slot_share=1.0))
    assert (got.hits, got.misses, got.prefetched, got.useful, got.wasted) == (2, 3, 3, 2, 1)


def test_useful_useless_late_and_an_evicted_prefetch_counted_by_hand():
    """2 slots, LRU, every prefetch allowed. Step 0: layer 0 misses 0 (stall 1); 1 is
    prefetched, lands at 1.0 <= 1.5: useful. Step 1: 0 hits; 2 is prefetched (wasted),
    evicting 1 (least recently used: 0 was just touched); 1 then misses, copied after the
    useless prefetch: lands at max(1.5, 1.0) + 1 = 2.5, stall 1.0; it evicts 0. Step 2: 0
    misses (stall 1), evicting the unused prefetch 2; 3 and 2 are prefetched (evicting 1
    and 0): 3 lands at 1.0 (useful), 2 at 2.0 (late: stall 0.5)."""
    got = replay(ACTUAL, PREDICTED, slots=2, link=LINK, prefetch=Prefetch(slot_share=1.0))
    assert got == Counts(hits=1, misses=3, prefetched=4, useful=2, late=1, wasted=1,
                         evicted_unused=1, stall_s=3.5, staged_bytes=70)


def test_without_prefetch_every_miss_is_one_copy_of_stall():
    """LRU, 2 slots: misses 0 and 1 in step 0, hits in step 1, 0 hits and 2, 3 miss in
    step 2 (stall 2: two copies)."""
    got = replay(ACTUAL, None, slots=2, link=LINK)
    assert got == Counts(hits=3, misses=4, stall_s=4.0, staged_bytes=40)


def test_slot_share_and_max_per_layer_limit_the_prefetches():
    """Half of 2 slots: one unused prefetch at a time. Steps 0 and 1 go as in the test
    above; step 2's layer-0 miss evicts the unused 2, so 3 is prefetched (useful), but 2 is
    not as well while 3 is unused: 2 misses."""
    got = replay(ACTUAL, PREDICTED, slots=2, link=LINK, prefetch=Prefetch(slot_share=0.5))
    assert (got.prefetched, got.useful, got.wasted, got.hits, got.misses) == (3, 2, 1, 1, 4)
    one = replay(ACTUAL, PREDICTED, slots=2, link=LINK,
                 prefetch=Prefetch(max_per_layer=1, slot_share=1.0))
    # step 2 prefetches only 3 (lands at 1.0, useful); 2 misses: stall 1.5 + 1 - 1.5 = 1.
    assert (one.prefetched, one.useful, one.late, one.misses) == (3, 2, 0, 4)
    assert one.stall_s == 1.0 + 0 + 0 + 1.0 + 1.0 + 1.0


def test_a_copy_in_flight_carries_into_the_next_layer():
    """One layer a step, a 0.5 s window, copies of 1 s. Step 0 prefetches 1 (useless); 0
    misses, copied after it: lands at max(0.5, 1) + 1 = 2, stall 1.5. Step 1 prefetches 2
    (lands at 1: late, stall 0.5) and 3 (lands at 2, wasted here), 1 s past step 1's end.
    Step 2 needs 3: resident, but its copy lands 1 s into the window: stall 0.5."""
    actual = np.array([[[0]], [[2]], [[3]]])
    predicted = np.array([[[1, N]], [[2, 3]], [[N, N]]])
    got = replay(actual, predicted, slots=4, link=Link(copy_s=1.0, window_s=0.5),
                 prefetch=Prefetch(slot_share=1.0))
    assert got == Counts(hits=1, misses=1, prefetched=3, late=1, wasted=2, stall_s=2.5)


@pytest.mark.parametrize("seed", range(4))
def test_min_without_prefetch_is_beladys_bound(seed):
    """One pool of slots, and per-layer quotas (a MIN per layer)."""
    rng = np.random.default_rng(seed)
    steps, layers, experts, k = 60, 3, 8, 2
    actual = np.stack([[rng.choice(experts, k, replace=False) for _ in range(layers)]
                       for _ in range(steps)])
    pinned = rng.random((layers, experts)) < 0.2
    slots = int(rng.integers(1, 7))
    keys = [m * experts + e for s in range(steps) for m in range(layers)
            for e in sorted(actual[s, m]) if not pinned[m, e]]
    bound = len(keys) - int(_min_hits(np.array(keys, np.int64), slots, layers * experts).sum())
    got = replay(actual, None, slots, Link(copy_s=1.0, window_s=0.0), pinned=pinned,
                 eviction="min")
    assert got.misses == bound
    lru = replay(actual, None, slots, Link(copy_s=1.0, window_s=0.0), pinned=pinned)
    assert lru.misses >= bound and lru.hits + lru.misses == len(keys)
    quotas = rng.integers(0, 4, layers)
    per_layer = sum(
        len(layer_keys) - int(_min_hits(np.array(layer_keys, np.int64), int(quotas[m]),
                                        layers * experts).sum())
        for m in range(layers)
        for layer_keys in [[key for key in keys if key // experts == m]])
    got = replay(actual, None, quotas, Link(copy_s=1.0, window_s=0.0), pinned=pinned,
                 eviction="min")
    assert got.misses == per_layer


def test_recall_and_precision_per_layer():
    """Layer 0 has no prediction. Layer 1: predicted 1 (right), 2 (wrong), 3 and 2 (right):
    3 of 4 selections predicted, 3 of 4 predictions right."""
    q = quality(ACTUAL, PREDICTED)
    assert q.right.tolist() == [0, 3] and q.selected.tolist() == [0, 4]
    assert q.predicted.tolist() == [0, 4]
    recall = q.recall()
    assert recall[0] is None and recall[1][0] == 0.75 and recall[1][1] < 0.75 < recall[1][2]
    assert q.precision()[1][0] == 0.75


def test_parameters_out_of_range_are_refused():
    for bad in ({"depth": 2}, {"max_per_layer": -1}, {"slot_share": 1.5}):
        with pytest.raises(ValueError):
            Prefetch(**bad)
    with pytest.raises(ValueError):
        replay(ACTUAL, None, 2, LINK, eviction="fifo")
