"""ClassLRU, llama.cpp b12170+'s expert cache (solvers/llamacpp/classlru.py), against its rules.

Rules cited as [H] are read in the header comment of `src/llama-moe-cache.cpp` at
ggml-org/llama.cpp c4fb5796 (one LRU list per frequency class, CRF = uses decayed with a
half-life of 128 tokens and kept across evictions, class = floor(log2(CRF)) capped at 7,
victim = an empty slot else the largest age / 2^class among each list's least recently used
slot not in the current plan); [R] in the b12170 release's commit list (#31233: the clock
advances by the real token count); READING marks a rule that could not be read and the reading
the module chose (its docstring and docs/llamacpp.md list them). Values are worked by hand in
the comments: d = 2^(-1/128) = 0.994599..., a use adds 1 to the decayed CRF.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from solvers.llamacpp.classlru import CRF_HALF_LIFE, ClassLruCache
from solvers.llamacpp.lru import LlamaCppCache, cache_groups, log_stats

D = 2.0 ** (-1.0 / 128.0)


def one_group(layers: int, experts: int, nb2: tuple[int, ...] = (1,)):
    return cache_groups([0] * layers, [("t", nb2)] * layers, experts)


def one_token_steps(experts_in_order: list[int], layers: int = 1) -> np.ndarray:
    """[S, 1, layers, 1]: one token a step selecting the same expert at every layer."""
    return np.array(experts_in_order).reshape(-1, 1, 1, 1).repeat(layers, axis=2)


def test_class_is_floor_log2_crf_capped_at_7():
    # [H] class = floor(log2(CRF)), at most n_class - 1 = 7. Expert 0 used by every token:
    # CRF_n = 1 + d CRF_(n-1) = (1 - d^n) / (1 - d): 1, 1.9946 (class 0), 2.9838, 3.9677
    # (class 1), 4.9463 (class 2); 127.9886 after 217 uses (class 6), 128.2974 after 218
    # (class 7); after 1000, 185.165 (1 - 2^(-1000/128)) = 184.342, still class 7, as is the
    # limit 1 / (1 - d) = 185.165 (log2 = 7.53: the header's "class of CRF_max").
    cache = ClassLruCache(one_group(1, 4), [1], 1)
    seen, done = {}, 0
    for n in (1, 2, 3, 4, 5, 217, 218, 1000):
        cache.replay(one_token_steps([0] * (n - done)))
        done = n
        seen[n] = (round(cache.crf(0, 0), 3), cache.frequency_class(0, 0))
    assert seen == {1: (1.0, 0), 2: (1.995, 0), 3: (2.984, 1), 4: (3.968, 1),
                    5: (4.946, 2), 217: (127.989, 6), 218: (128.297, 7), 1000: (184.342, 7)}


def test_a_ubatch_counts_a_distinct_expert_once():
    # READING: plan() deduplicates the ids first (as b11669 does) and a use adds 1 per
    # distinct expert: 8 tokens all selecting expert 3 give CRF 1, not 8
    cache = ClassLruCache(one_group(1, 8), [8], 1)
    f = cache.replay(np.full((1, 8, 1, 1), 3))
    assert (f.hits[0, 0], f.misses[0, 0], cache.crf(0, 3)) == (0, 1, 1.0)


def test_crf_decays_with_the_real_token_count():
    # [H] half-life 128 tokens; [R] the clock advances by the ubatch's tokens. Expert 0 at
    # clock 1 (one token), then 3 ubatches of 32 tokens and one of 31 selecting experts
    # 1..32 (clock 128), then expert 0 again at clock 129: age 128, CRF 1 x 2^-1 + 1 = 1.5
    cache = ClassLruCache(one_group(1, 64), [64], 1)
    cache.replay(one_token_steps([0]))
    busy = np.full((4, 32, 1, 1), -1)
    busy[:, :, 0, 0] = np.arange(1, 33)
    busy[3, 31] = -1                         # the last of them has 31 tokens
    assert cache.replay(busy).used.all()
    # READING: a ubatch of 33 tokens does not go through the cache, so it ticks no clock
    assert not cache.replay(np.arange(33, 66).reshape(1, 33, 1, 1)).used.any()
    cache.replay(one_token_steps([0]))
    assert cache.crf(0, 0) == 1.5 and cache.frequency_class(0, 0) == 0
    assert CRF_HALF_LIFE == 128.0


def test_the_victim_has_the_largest_age_over_2_to_the_class():
    # [H] one slot per group of 2; expert 0 five times (clock 1..5: CRF 4.9463, class 2),
    # then experts 1, 2, 3, 4, 5 at clocks 6..10, each new (class 0):
    # clock 6: expert 1 takes the empty slot 1;
    # clock 7: candidates 0 (age 2 / 2^2 = 0.5) and 1 (age 1 / 2^0 = 1): 1 goes;
    # clock 8: 0 (3 / 4 = 0.75) against 2 (1): 2 goes;
    # clock 9: 0 (4 / 4 = 1) against 3 (1): a tie, READING: the lowest class goes: 3;
    # clock 10: 0 (5 / 4 = 1.25) against 4 (1): 0 goes at last.
    cache = ClassLruCache(one_group(1, 8), [2], 1)
    held = []
    for e in [0, 0, 0, 0, 0, 1, 2, 3, 4, 5]:
        cache.replay(one_token_steps([e]))
        held.append([x for x in range(8) if cache.holds(0, x)])
    assert held[5:] == [[0, 1], [0, 2], [0, 3], [0, 4], [4, 5]]
    # b11669's plain LRU evicts expert 0 at clock 7 already (the least recently used)
    lru = LlamaCppCache(one_group(1, 8), [2], 1)
    lru.replay(one_token_steps([0, 0, 0, 0, 0, 1, 2]))
    assert [x for x in range(8) if lru.holds(0, x)] == [1, 2]


def test_crf_survives_eviction():
    # [H] CRF retained across evictions: expert 0 (CRF 4.9463 at clock 5, evicted at clock
    # 10 as above) comes back at clock 11: victim 4 (age 2, score 2) over 5 (age 1); its CRF
    # is 4.9463 x d^6 + 1 = 5.7882, class 2 at once, where a new expert starts at 1, class 0
    cache = ClassLruCache(one_group(1, 8), [2], 1)
    cache.replay(one_token_steps([0, 0, 0, 0, 0, 1, 2, 3, 4, 5]))
    assert not cache.holds(0, 0) and cache.crf(0, 0) == pytest.approx(4.946285, rel=1e-6)
    cache.replay(one_token_steps([0]))
    assert [x for x in range(8) if cache.holds(0, x)] == [0, 5]
    assert cache.crf(0, 0) == pytest.approx(4.946285 * D ** 6 + 1, rel=1e-6)
    assert round(cache.crf(0, 0), 4) == 5.7882 and cache.frequency_class(0, 0) == 2


def test_the_current_plans_experts_are_never_evicted():
    # [H] "not in the current plan()". Two layers, one group of 2 slots, top-1.
    # steps 1-3, one token: expert 0 at both layers (slot 0 layer 0, slot 1 layer 1; CRF
    # 2.9838, class 1 each; list 1 = [s0, s1]).
    # step 4, two tokens: layer 0 selects 0 twice (clock0 5: a hit, CRF 2.9838 d^2 + 1 =
    # 3.9517, list 1 = [s1, s0]); layer 1 selects 2 and 3 (clock1 5):
    #   miss 2: list 1's head s1 (layer 1's expert 0, age 5 - 3 = 2, score 2 / 2 = 1) goes;
    #     expert 2 enters class 0: list 0 = [s1];
    #   miss 3: list 0's head s1 is this plan's (layer 1, last use 5 = now): skipped, no
    #     candidate there; list 1's head s0 (layer 0's expert 0, age 0 by layer 0's clock,
    #     READING) goes. Without the rule, s1 (score 0, class 0) would tie s0 (score 0,
    #     class 1) and, the lowest class winning ties, evict expert 2 that this fetch uses.
    cache = ClassLruCache(one_group(2, 8), [2], 1)
    steps = np.full((4, 2, 2, 1), -1)
    steps[:3, 0, :, 0] = 0
    steps[3, :, 0, 0] = 0
    steps[3, :, 1, 0] = [2, 3]
    f = cache.replay(steps)
    assert f.hits[3].tolist() == [1, 0] and f.misses[3].tolist() == [0, 2]
    assert f.runs[3, 1] == 2                # 2 -> slot 1, 3 -> slot 0: not consecutive
    assert [cache.holds(1, e) for e in (2, 3)] == [True, True]
    assert not cache.holds(0, 0) and round(cache.crf(0, 0), 4) == 3.9517


def test_empty_slots_fill_in_ascending_order_and_uploads_merge():
    # READING: empty slots are taken from slot 0 up; [R] misses sorted: ids [5, 2, 3] ->
    # 2 -> slot 0, 3 -> slot 1, 5 -> slot 2: runs (2, 3) and (5), as b11669 uploads them
    cache = ClassLruCache(one_group(1, 8), [4], 3)
    f = cache.replay(np.array([[[[5, 2, 3]]]]))
    assert (f.misses[0, 0], f.runs[0, 0]) == (3, 2)
    assert [cache.state[11][0, e] for e in (2, 3, 5)] == [0, 1, 2]


def test_only_ubatches_of_at_most_32_tokens_that_fit_use_it_and_the_log_lines():
    # b11669's get_slot_map rule, unchanged: 33 tokens only read the cache
    groups = one_group(1, 64, nb2=(10, 20))
    cache = ClassLruCache(groups, [64], 1)
    big = np.arange(33).reshape(1, 33, 1, 1)
    f = cache.replay(big[:, :32])
    assert f.used.all() and f.misses[0, 0] == 32
    f = cache.replay(big, held=True)
    assert not f.used.any() and f.held[0, 0].sum() == 32 and not cache.holds(0, 32)
    assert cache.crf(0, 0) == 1.0                 # untouched by the read-only ubatch
    small = ClassLruCache(one_group(1, 8), [4], 2)  # min(3 x 2, 8) = 6 > 4 slots
    assert not small.replay(np.array([[[[0, 1]], [[2, 3]], [[4, 5]]]])).used.any()
    # log lines: hits and misses count distinct experts per fetch; bytes = misses x 30
    steps = np.full((2, 9, 1, 1), -1)
    steps[0, :8, 0, 0] = np.arange(40, 48)     # 8 tokens: 8 misses
    steps[1, :, 0, 0] = np.arange(44, 53)      # 9 tokens: 4 hits, 5 misses
    f = cache.replay(steps)
    assert log_stats(f, np.array([8, 9]), groups) == {"ubatch <= 8": (0, 8, 240),
                                                      "ubatch  > 8": (4, 5, 150)}


def test_the_group_clock_reading_ages_a_group_faster():
    # the reading NOT chosen, kept to measure how much it matters: one clock per group,
    # advanced by every layer's fetch. Two layers, expert 0 at both for 3 tokens: layer 0's
    # uses at clock 1, 3, 5: CRF 1 + d^2 (1 + d^2) = 2.9678 (the layer clock: 2.9838)
    steps = one_token_steps([0, 0, 0], layers=2)
    group = ClassLruCache(one_group(2, 8), [4], 1, clock="group")
    layer = ClassLruCache(one_group(2, 8), [4], 1)
    group.replay(steps)
    layer.replay(steps)
    assert group.crf(0, 0) == pytest.approx(1 + D ** 2 + D ** 4, rel=1e-6)
    assert layer.crf(0, 0) == pytest.approx(1 + D + D ** 2, rel=1e-6)
    with pytest.raises(ValueError, match="clock"):
        ClassLruCache(one_group(1, 8), [4], 1, clock="token")


class Reference:
    """The rules of the module docstring in plain Python: per group, 8 lists of slots (least
    recently used first), per key its CRF and last use, per layer (or group) a clock."""

    def __init__(self, layer_group, slots, per_layer):
        self.layer_group, self.slots = layer_group, slots
        self.lists = [[[] for _ in range(8)] for _ in slots]
        self.key = [[None] * n for n in slots]
        self.filled = [0] * len(slots)
        self.crf, self.last, self.where, self.clock = {}, {}, {}, {}
        self.clock_key = (lambda layer: ("layer", layer)) if per_layer else \
            (lambda layer: ("group", layer_group[layer]))

    def use(self, g, slot, key, now):
        age = now - self.last[key] if key in self.last else None
        self.crf[key] = float(np.float32(
            1.0 + (self.crf[key] * 2.0 ** (-age / 128.0) if age is not None else 0.0)))
        self.last[key] = now
        for lst in self.lists[g]:
            if slot in lst:
                lst.remove(slot)
        self.lists[g][min(7, math.floor(math.log2(self.crf[key])))].append(slot)

    def fetch(self, layer, ids, n_tokens):
        g = self.layer_group[layer]
        ck = self.clock_key(layer)
        now = self.clock[ck] = self.clock.get(ck, 0) + n_tokens
        uniq = list(dict.fromkeys(ids))
        hits = [e for e in uniq if (layer, e) in self.where]
        for e in hits:
            self.use(g, self.where[layer, e], (layer, e), now)
        fills = []
        for e in sorted(set(uniq) - set(hits)):
            if self.filled[g] < self.slots[g]:
                slot = self.filled[g]
                self.filled[g] += 1
            else:
                best = None
                for c, lst in enumerate(self.lists[g]):
                    out = [s for s in lst
                           if not (self.key[g][s][0] == layer and self.last[self.key[g][s]] == now)]
                    if out:
                        k = self.key[g][out[0]]
                        score = (self.clock[self.clock_key(k[0])] - self.last[k]) / 2 ** c
                        if best is None or score > best[0]:
                            best = (score, out[0])
                slot = best[1]
                del self.where[self.key[g][slot]]
            self.key[g][slot] = (layer, e)
            self.where[layer, e] = slot
            self.use(g, slot, (layer, e), now)
            fills.append((e, slot))
        runs = sum(1 for i, (e, s) in enumerate(fills)
                   if i == 0 or fills[i - 1] != (e - 1, s - 1))
        return len(hits), len(fills), runs


@pytest.mark.parametrize(("seed", "clock"), [(0, "layer"), (1, "layer"), (2, "group"),
                                             (3, "group")])
def test_compiled_replay_equals_a_plain_transcription_of_the_rules(seed, clock):
    rng = np.random.default_rng(seed)
    experts, k, layers = 8, 2, 4
    groups = cache_groups([0, 0, 1, 0], [("a", (5,)), ("b", (7,)), ("a", (5,)), ("a", (5,))],
                          experts)
    slots = [int(rng.integers(2, 9)), int(rng.integers(2, 5)), int(rng.integers(2, 9))]
    cache = ClassLruCache(groups, slots, k, clock=clock)
    ref = Reference(groups.layer_group.tolist(), slots, clock == "layer")
    # skewed routing, so that classes above 0 occur
    p = np.array([8, 6, 4, 3, 2, 1, 1, 1], dtype=float)
    tokens = np.stack([rng.choice(experts, size=k, replace=False, p=p / p.sum())
                       for _ in range(150 * 3 * layers)]).reshape(150, 3, layers, k)
    tokens[rng.random((150, 3)) < 0.4] = -1  # ubatches of 0 .. 3 tokens
    for chunk in (tokens[:70], tokens[70:]):  # state carries across calls
        f = cache.replay(chunk)
        for s in range(len(chunk)):
            n = int((chunk[s] >= 0).any(axis=(1, 2)).sum())
            for layer in range(layers):
                g = groups.layer_group[layer]
                ids = [int(e) for e in chunk[s, :, layer].ravel() if e >= 0]
                fits = 0 < n and min(n * k, experts) <= slots[g]
                assert f.used[s, layer] == fits
                if fits:
                    assert (f.hits[s, layer], f.misses[s, layer], f.runs[s, layer]) == \
                        ref.fetch(layer, ids, n)
    assert max(cache.frequency_class(la, e) for la in range(layers) for e in range(experts)) > 1
    for (layer, e), value in ref.crf.items():
        assert cache.crf(layer, e) == value


def test_each_fetch_holds_all_its_experts_after_it():
    # [H] the plan's experts are never evicted: with one layer per group nothing else runs
    # between a fetch and the check, so after each step every expert it selected is held
    rng = np.random.default_rng(7)
    experts, k, layers = 16, 4, 3
    groups = cache_groups([0, 0, 0], [("a", (1,)), ("b", (2,)), ("c", (3,))], experts)
    cache = ClassLruCache(groups, [8, 9, 12], k)
    for _ in range(300):
        n = int(rng.integers(1, 3))
        step = np.stack([rng.permutation(experts)[:k] for _ in range(n * layers)])
        step = step.reshape(1, n, layers, k)
        f = cache.replay(step)
        assert f.used.all()
        for layer in range(layers):
            chosen = set(step[0, :, layer].ravel().tolist())
            assert f.hits[0, layer] + f.misses[0, layer] == len(chosen)
            assert all(cache.holds(layer, e) for e in chosen)
