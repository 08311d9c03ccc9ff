"""Replaying decode traffic through a cache policy: the compiled replay against a plain Python
replay of the same policy, measured in the same run.

    .venv/bin/python benchmarks/bench_cache.py [--quick]

Traffic: gpt-oss-20b decode routing (../shared/data/routing/gptoss20b-decode/mmlu_dev.npz,
24,629 tokens, repeated) to 200,000 tokens x 24 MoE layers x top-4 (19.2M selections), one
card, 11 slots per layer (264 in all), nothing pinned; a synthetic skewed traffic of the same
shape where ../shared is absent. Prints the seconds of the compiled replay per policy
(`solvers.cache`, what `placer solve` and `placer evaluate` run: lru, lfru, lfuda, classlru,
learned with fixed weights, and lru over one pool of the card's slots; target: under 10 s on
two cores) and of Belady's MIN, and their speed against a plain Python loop of the same LRU over
the first 5,000 tokens, extrapolated (placer's replay before this one, a Python loop with
numpy calls per step and layer, took about 4 minutes for 80k tokens).
"""

from __future__ import annotations

import argparse
import time
from collections import OrderedDict
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
DATA = REPO.parent / "shared" / "data" / "routing" / "gptoss20b-decode" / "mmlu_dev.npz"
LAYERS, EXPERTS, TOP_K, SLOTS = 24, 32, 4, 11
POLICY_ORDER = ("lru", "lfru", "lfuda", "classlru", "learned")
# the learned policy's cost, not its quality: fixed weights (age, decayed_4, decayed_16,
# decayed_64, calibration, transition, bias), its calibration frequencies and transition
# this traffic's own
LEARNED_WEIGHTS = [-0.05, 2.0, 1.0, -0.5, 3.0, 1.5, 0.0]


def traffic(tokens: int) -> np.ndarray:
    """[tokens, L, E] bool selections: the real decode order, repeated to `tokens`."""
    if DATA.exists():
        ids = np.load(DATA)["expert_ids"]
    else:
        rng = np.random.default_rng(0)
        ids = rng.zipf(1.5, (24_629, LAYERS, TOP_K)) % EXPERTS
    ids = np.resize(ids, (tokens, LAYERS, ids.shape[2]))
    out = np.zeros((tokens, LAYERS, EXPERTS), dtype=bool)
    for j in range(ids.shape[2]):
        out[np.arange(tokens)[:, None], np.arange(LAYERS)[None, :], ids[:, :, j]] = True
    return out


def python_lru(selected: np.ndarray) -> int:
    """Misses of the per-layer LRU in plain Python, one fetch at a time."""
    caches = [OrderedDict() for _ in range(LAYERS)]
    misses = 0
    for step in selected:
        for layer, cache in enumerate(caches):
            keys = np.flatnonzero(step[layer]).tolist()
            for k in keys:
                if k in cache:
                    cache.move_to_end(k)
                    continue
                misses += 1
                if len(cache) >= SLOTS:
                    victim = next((v for v in cache if v not in keys), None)
                    if victim is None:
                        continue
                    del cache[victim]
                cache[k] = True
    return misses


def main() -> None:
    from solvers.cache import make_policy
    from solvers.cache.belady import BeladyReplay
    from solvers.cache.learn import transition_matrix
    from solvers.cache.replay import Requests

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="20,000 tokens: a smoke run")
    args = parser.parse_args()
    tokens = 20_000 if args.quick else 200_000
    selected = traffic(tokens)
    home = np.zeros((LAYERS, EXPERTS), dtype=np.int64)
    cold = np.ones((LAYERS, EXPERTS), dtype=bool)
    quotas = np.full((1, LAYERS), SLOTS)
    print(f"{tokens} decode tokens x {LAYERS} layers, {SLOTS * LAYERS} slots, "
          f"{int(selected.sum())} selections"
          + ("" if DATA.exists() else " (synthetic: no ../shared routing)"))
    start = time.perf_counter()
    requests = Requests.of(selected)
    print(f"  requests from [S, L, E] selections: {time.perf_counter() - start:.2f} s")
    seconds, hits_of = {}, {}
    learned = {"weights": LEARNED_WEIGHTS,
               "calibration": np.bincount(requests.keys, minlength=LAYERS * EXPERTS) / tokens,
               "transition": transition_matrix([requests])}
    for name, pooled in [(p, False) for p in POLICY_ORDER] + [("lru", True)]:
        label = name + (" pooled" if pooled else "")
        options = learned if name == "learned" else {}
        requests.hits(make_policy(name, quotas, LAYERS * EXPERTS, pooled=pooled, **options),
                      cold, home)  # compiled
        start = time.perf_counter()
        hits = hits_of[label] = requests.hits(
            make_policy(name, quotas, LAYERS * EXPERTS, pooled=pooled, **options), cold, home)
        seconds[label] = time.perf_counter() - start
        print(f"  {label:10s} replay: {seconds[label]:.2f} s, hit rate {hits.mean():.3f} "
              f"({'PASS' if seconds[label] < 10 else 'MISS'}, target < 10 s)", flush=True)
    start = time.perf_counter()
    BeladyReplay([selected], cold, home, quotas.sum(axis=1))
    print(f"  belady (MIN) replay: {time.perf_counter() - start:.2f} s")
    sample = 5_000
    start = time.perf_counter()
    slow = python_lru(selected[:sample])
    python_s = (time.perf_counter() - start) * tokens / sample
    fast = np.asarray(cold, dtype=bool).ravel()[requests.keys] & ~hits_of["lru"]
    first = Requests.of(selected[:sample]).misses(make_policy("lru", quotas, LAYERS * EXPERTS),
                                                  cold, home)
    assert int(first.sum()) == slow, "the compiled LRU and the Python one disagree"
    print(f"  plain Python LRU: {python_s:.1f} s for {tokens} tokens (extrapolated from "
          f"{sample}, same misses as the compiled one there); compiled: "
          f"{python_s / seconds['lru']:.0f}x as fast; {int(fast.sum())} misses in all")


if __name__ == "__main__":
    main()
