"""The per-layer classlru (solvers/cache/classlru.py, placer's compiled walk) against llama.cpp's
ClassLRU replay (solvers/llamacpp/classlru.py) where they model the same thing: one layer per
group, the same slots per layer, every step fetching every layer through the cache (one card,
nothing pinned, ubatches of at most 32 tokens that fit the slots), each step's distinct experts
first appearing in ascending order (placer's fetch is a set, served ascending; llama.cpp's
updates its hits in order of first appearance). Both clocks then count the tokens served."""

from __future__ import annotations

import numpy as np
import pytest

from solvers.cache import make_policy
from solvers.cache.replay import cache_hits
from solvers.llamacpp.classlru import ClassLruCache
from solvers.llamacpp.lru import cache_groups
from tests.real_routing import GPTOSS


def ascending_steps(rng: np.random.Generator, steps: int, batch: int, layers: int,
                    experts: int, k: int) -> np.ndarray:
    """[S, B, L, k] ids: each step's tokens take its distinct experts in ascending order of
    first appearance (a later token repeats earlier ones or adds larger ones)."""
    out = np.empty((steps, batch, layers, k), dtype=np.int64)
    for s in range(steps):
        for layer in range(layers):
            # skewed popularity, so that classes differ
            pool = np.sort(rng.choice(experts, size=batch * k, replace=False,
                                      p=np.arange(experts, 0, -1) / (experts * (experts + 1) / 2)))
            for b in range(batch):
                out[s, b, layer] = pool[b * k:(b + 1) * k]
    return out


def both(tokens: np.ndarray, experts: int, slots: int
         ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """[S, L, E]: what llama.cpp's ClassLRU held and what placer's per-layer classlru hit of
    the selected experts, and those."""
    steps, batch, layers, k = tokens.shape
    groups = cache_groups([0] * layers, [(f"layer {i}", (1,)) for i in range(layers)], experts)
    llama = ClassLruCache(groups, [slots] * layers, k)
    fetches = llama.replay(tokens, held=True)
    assert fetches.used.all()  # every fetch went through the cache
    selected = np.zeros((steps, layers, experts), dtype=bool)
    for b in range(batch):
        for j in range(k):
            np.put_along_axis(selected, tokens[:, b, :, j][..., None], True, axis=2)
    ours = cache_hits(make_policy("classlru", np.full((1, layers), slots), layers * experts),
                      selected, np.ones((layers, experts)), np.zeros((layers, experts), int),
                      tokens=batch)
    return fetches.held & selected, ours, selected


@pytest.mark.parametrize(("batch", "slots", "seed"), [(1, 3, 0), (1, 6, 1), (2, 5, 2),
                                                      (3, 8, 3)])
def test_per_layer_classlru_is_llamacpps_with_a_layer_per_group(batch: int, slots: int,
                                                                 seed: int):
    tokens = ascending_steps(np.random.default_rng(seed), 300, batch, 3, 12, 2)
    llama, ours, selected = both(tokens, 12, slots)
    assert 0 < ours.sum() < selected.sum()  # some hits, some misses
    assert np.array_equal(ours, llama)


@pytest.mark.skipif(not GPTOSS.is_dir(), reason="no ../shared routing data")
def test_the_same_on_real_decode_routing():
    """gpt-oss-20b decode routing (mmlu_dev, the first 1,500 tokens, 6 layers), ids ascending
    within each token: the same hits, and not those of an LRU."""
    ids = np.load(GPTOSS / "mmlu_dev.npz")["expert_ids"][:1500, :6].astype(np.int64)
    tokens = np.sort(ids, axis=2)[:, None]
    llama, ours, selected = both(tokens, 32, 6)
    assert np.array_equal(ours, llama)
    lru = cache_hits(make_policy("lru", np.full((1, 6), 6), 6 * 32), selected,
                     np.ones((6, 32)), np.zeros((6, 32), int))
    assert not np.array_equal(lru, ours)
