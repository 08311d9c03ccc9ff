"""llama.cpp's expert cache (solvers/llamacpp/lru.py) against the rules of its source:
ggml-org/llama.cpp @4b060f27, src/llama-moe-cache.cpp. Slot counts and hit/miss sequences
below are worked by hand from that code (the comments show the arithmetic), and the compiled
replay is checked against a plain Python transcription of `moe_cache_lru::plan` on random
traffic."""

from __future__ import annotations

import numpy as np
import pytest

from solvers.errors import SolverError
from solvers.llamacpp.lru import (
    MIB,
    TOO_SMALL,
    LlamaCppCache,
    cache_groups,
    cache_mib_for_slots,
    group_budgets,
    group_slots,
    log_stats,
)

# gpt-oss-20b's experts in a GGUF: ffn_gate_exps, ffn_up_exps, ffn_down_exps, each
# [2880, 2880, 32] MXFP4 (blocks of 32 weights in 17 bytes): nb[2] = 2880 / 32 * 17 * 2880
GPTOSS_NB2 = 4_406_400


def one_group(layers: int, nb2: tuple[int, ...], experts: int):
    return cache_groups([0] * layers, [("t", nb2)] * layers, experts)


def test_gptoss_slots_from_mib():
    groups = one_group(24, (GPTOSS_NB2,) * 3, 32)
    assert groups.num_layers == (24,) and groups.host_bytes == [24 * 32 * 3 * GPTOSS_NB2]
    # one device, one group: the budget is all 1 GiB; nb[2] is a multiple of CUDA's 128,
    # so 3 banks of n + 1 slots take 13,219,200 (n + 1) bytes: 81 fit (1,070,755,200), 82
    # do not (1,083,974,400 > 1,073,741,824): 80 slots
    assert group_slots(1024 * MIB, groups, 4).tolist() == [80]
    assert group_slots(1021 * MIB, groups, 4).tolist() == [79]
    assert cache_mib_for_slots(groups, 80) == 1022  # 1022 MiB = 1,071,644,672 >= 81 slots
    # a huge budget stops at every expert of every layer
    assert group_slots(100_000 * MIB, groups, 4).tolist() == [24 * 32]


def test_each_bank_is_padded_to_the_alignment():
    groups = one_group(1, (1000, 1000), 8)
    # budget 10,000: 3 slots take 2 x GGML_PAD(4000, 128) = 8192; 4 take 2 x 5120 = 10240
    assert group_slots(10_000, groups, 2, alignment=128).tolist() == [3]
    assert group_slots(10_000, groups, 2, alignment=1).tolist() == [4]  # 2 x 5000


def test_a_device_splits_its_budget_by_host_bytes_and_refuses_small_groups():
    # layers 0, 2: one layout (2 tensors of 100 bytes an expert), layer 1 another (300)
    groups = cache_groups([0, 0, 0, -1], [("a", (100, 100)), ("b", (300,)),
                                          ("a", (100, 100)), ("a", (100, 100))], 4)
    assert groups.layer_group.tolist() == [0, 1, 0, -1]
    assert groups.host_bytes == [2 * 4 * 200, 4 * 300]  # 1600, 1200
    # 1400 bytes: group 0 gets 1400 x 1600 / 2800 = 800 -> 200 (n + 1) <= 800: 3 slots;
    # group 1 gets 600 -> 300 (n + 1) <= 600: 1 slot, fewer than top-2: not cached
    assert group_budgets(1400, groups).tolist() == [800, 600]
    assert group_slots(1400, groups, 2, alignment=1).tolist() == [3, 0]
    assert group_slots(1400, groups, 1, alignment=1).tolist() == [3, 1]
    # 7000 bytes: 4000 and 3000 would give 19 and 9 slots, capped at layers x 4 experts
    assert group_slots(7000, groups, 2, alignment=1).tolist() == [8, 4]


def test_devices_split_by_free_memory_or_tensor_split():
    groups = cache_groups([0, 1, 2], [("a", (100,))] * 3, 8)  # one layer per device
    cache = 12_000
    # by free memory: 3 : 1 : 2 of 6 parts; device 3 has no host layers and takes nothing
    assert group_budgets(cache, groups, free_bytes=[3e9, 1e9, 2e9, 5e9]).tolist() == [
        6000, 2000, 4000]
    # --tensor-split wins over free memory; all zeros means "not given"
    assert group_budgets(cache, groups, [3e9, 1e9, 2e9], [1, 1, 2]).tolist() == [
        3000, 3000, 6000]
    assert group_budgets(cache, groups, [3e9, 1e9, 2e9], [0, 0, 0]).tolist() == [
        6000, 2000, 4000]
    # devices that report no free memory share alike
    assert group_budgets(cache, groups, [0, 0, 0]).tolist() == [4000] * 3
    assert group_budgets(cache, groups).tolist() == [4000] * 3
    # 1200 bytes, 400 each: 100 (n + 1) <= 400 gives 3 slots; padded to 256 (device 0
    # only), 2 slots take 512 > 400: 1 slot
    assert group_slots(1200, groups, 1, [1, 1, 1], alignment=[256, 1, 1]).tolist() == [
        1, 3, 3]


def test_a_cache_with_no_group_left_is_refused_and_no_host_layer_means_no_cache():
    groups = one_group(2, (GPTOSS_NB2,) * 3, 32)
    # 40 MiB = 41,943,040: 3 banks of 4 slots take 52,876,800 > budget: 2 slots < top-4
    with pytest.raises(SolverError, match=TOO_SMALL):
        group_slots(40 * MIB, groups, 4)
    assert group_slots(40 * MIB, groups, 2).tolist() == [2]
    none = cache_groups([-1, -1], [("a", (1,))] * 2, 4)
    assert none.layer_group.tolist() == [-1, -1] and group_slots(MIB, none, 2).size == 0


def two_layers_three_slots() -> LlamaCppCache:
    return LlamaCppCache(one_group(2, (1,), 4), [3], 2)


def test_one_lru_per_group_and_its_layers_evict_each_other():
    cache = two_layers_three_slots()
    # step 0, one token. LRU head -> tail: slots 0 1 2, all empty.
    # layer 0 ids [2, 0]: misses sorted 0 -> slot 0, 2 -> slot 1 (LRU 2 0 1), 2 runs
    # layer 1 ids [1, 3]: 1 -> slot 2, 3 -> slot 0 evicting layer 0's expert 0 (LRU 1 2 0)
    # step 1: layer 0 ids [2, 0]: 2 hits (slot 1 to the tail: LRU 2 0 1); 0 misses ->
    #   slot 2, evicting layer 1's expert 1 (LRU 0 1 2)
    # layer 1 ids [3, 1]: 3 hits (slot 0: LRU 1 2 0); 1 misses -> slot 1, evicting layer
    #   0's expert 2 (LRU 2 0 1)
    tokens = np.array([[[[2, 0], [1, 3]]], [[[2, 0], [3, 1]]]])
    f = cache.replay(tokens, held=True)
    assert f.used.all()
    assert f.hits.tolist() == [[0, 0], [1, 1]]
    assert f.misses.tolist() == [[2, 2], [1, 1]]
    assert f.runs.tolist() == [[2, 2], [1, 1]]
    assert f.held[1, 0].tolist() == [False, False, True, False]
    assert f.held[1, 1].tolist() == [False, False, False, True]
    held = [[cache.holds(layer, e) for e in range(4)] for layer in range(2)]
    assert held == [[True, False, False, False], [False, True, False, True]]


def test_hits_are_touched_in_order_of_first_appearance():
    def after(order):
        cache = LlamaCppCache(one_group(1, (1,), 4), [2], 1)
        # two tokens, top-1: 0 -> slot 0, 1 -> slot 1 (LRU 0 1); then both hit, touched
        # in the order the tokens come; then one token selects 2 and evicts the head
        cache.replay(np.array([[[[0]], [[1]]], [[[order[0]]], [[order[1]]]],
                               [[[2]], [[-1]]]]))
        return [cache.holds(0, e) for e in range(3)]

    assert after((1, 0)) == [True, False, True]   # LRU 1 0: expert 1 goes
    assert after((0, 1)) == [False, True, True]   # LRU 0 1: expert 0 goes


def test_misses_fill_in_ascending_expert_order_and_merge_uploads():
    cache = LlamaCppCache(one_group(1, (1,), 8), [4], 3)
    # ids [5, 2, 3]: sorted 2 -> slot 0, 3 -> slot 1, 5 -> slot 2: runs (2, 3) and (5)
    f = cache.replay(np.array([[[[5, 2, 3]]]]))
    assert (f.misses[0, 0], f.runs[0, 0]) == (3, 2)
    assert [cache.state[6][0, e] for e in (2, 3, 5)] == [0, 1, 2]


def test_only_ubatches_of_at_most_32_tokens_that_fit_use_the_cache():
    cache = LlamaCppCache(one_group(1, (1,), 64), [64], 1)
    big = np.arange(33).reshape(1, 33, 1, 1)
    f = cache.replay(big, held=True)
    assert not f.used.any() and not f.held.any() and not cache.holds(0, 0)
    f = cache.replay(big[:, :32])
    assert f.used.all() and f.misses[0, 0] == 32
    f = cache.replay(big, held=True)  # read only: it finds 32 of its experts and changes nothing
    assert not f.used.any() and f.held[0, 0].sum() == 32 and not cache.holds(0, 32)
    # min(tokens x n_expert_used, E) <= slots: 4 slots, top-2 of 8 experts
    small = LlamaCppCache(one_group(1, (1,), 8), [4], 2)
    three = np.array([[[[0, 1]], [[2, 3]], [[4, 5]]]])
    assert not small.replay(three).used.any()          # min(6, 8) = 6 > 4
    assert small.replay(three[:, :2]).used.all()        # 4 <= 4
    narrow = LlamaCppCache(one_group(1, (1,), 4), [4], 2)
    assert narrow.replay(three % 4).used.all()          # min(6, 4) = 4 <= 4


def test_log_stats_split_at_8_tokens():
    groups = one_group(1, (10, 20), 64)
    cache = LlamaCppCache(groups, [64], 1)
    steps = np.full((2, 9, 1, 1), -1)
    steps[0, :8, 0, 0] = np.arange(8)   # 8 tokens: 8 misses
    steps[1, :, 0, 0] = np.arange(4, 13)  # 9 tokens: 4 hits, 5 misses
    f = cache.replay(steps)
    assert log_stats(f, np.array([8, 9]), groups) == {"ubatch <= 8": (0, 8, 8 * 30),
                                                      "ubatch  > 8": (4, 5, 5 * 30)}


class Reference:
    """moe_cache_lru::plan in plain Python: one list per group, least recently used first."""

    def __init__(self, layer_group, slots, experts):
        self.layer_group, self.slots, self.experts = layer_group, slots, experts
        self.order = [list(range(n)) for n in slots]
        self.key = [[None] * n for n in slots]
        self.where = {}

    def fetch(self, layer, ids):
        g = self.layer_group[layer]
        uniq = list(dict.fromkeys(ids))
        hits = [e for e in uniq if (layer, e) in self.where]
        for e in hits:
            self.order[g].remove(self.where[layer, e])
            self.order[g].append(self.where[layer, e])
        fills = []
        for e in sorted(set(uniq) - set(hits)):
            s = self.order[g].pop(0)
            if self.key[g][s] is not None:
                del self.where[self.key[g][s]]
            self.key[g][s] = (layer, e)
            self.where[layer, e] = s
            self.order[g].append(s)
            fills.append((e, s))
        runs = sum(1 for i, (e, s) in enumerate(fills)
                   if i == 0 or fills[i - 1] != (e - 1, s - 1))
        return len(hits), len(fills), runs


@pytest.mark.parametrize("seed", range(4))
def test_compiled_replay_equals_a_plain_transcription(seed):
    rng = np.random.default_rng(seed)
    experts, k, layers = 8, 2, 4
    groups = cache_groups([0, 0, 1, 0], [("a", (5,)), ("b", (7,)), ("a", (5,)), ("a", (5,))],
                          experts)
    slots = [int(rng.integers(2, 9)), int(rng.integers(2, 5)), int(rng.integers(2, 9))]
    cache = LlamaCppCache(groups, slots, k)
    ref = Reference(groups.layer_group.tolist(), slots, experts)
    tokens = np.stack([rng.permutation(experts)[:k] for _ in range(60 * 3 * layers)])
    tokens = tokens.reshape(60, 3, layers, k)
    tokens[rng.random((60, 3)) < 0.4] = -1  # ubatches of 0 .. 3 tokens
    for chunk in (tokens[:25], tokens[25:]):  # state carries across calls
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
                        ref.fetch(layer, ids)


CACHED_WALKS = """
import numpy as np
from solvers.llamacpp.classlru import ClassLruCache
from solvers.llamacpp.lru import LlamaCppCache, cache_groups
from solvers.llamacpp.walk import walk
groups = cache_groups([0, 0], [("t", (1,))] * 2, 8)
for cache in (LlamaCppCache(groups, [4], 2), ClassLruCache(groups, [4], 2)):
    cache.replay(np.zeros((2, 1, 2, 2), dtype=np.int64))
print(sum(walk.stats.cache_hits.values()), sum(walk.stats.cache_misses.values()))
"""


def test_both_policies_walks_come_from_numbas_disk_cache_in_a_new_process():
    # solvers/llamacpp/walk.py: one walk, compiled per policy by its state's type; a walk
    # given its kernels as arguments would be compiled again in every process (seconds)
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parent.parent
    env = {**__import__("os").environ, "PYTHONPATH": str(repo)}
    runs = [subprocess.run([sys.executable, "-c", CACHED_WALKS], cwd=repo, env=env,
                           capture_output=True, text=True, timeout=300, check=True)
            for _ in range(2)]
    hits, misses = map(int, runs[1].stdout.split())
    assert (hits, misses) == (2, 0), runs[1].stderr
