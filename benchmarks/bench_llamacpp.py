"""llama.cpp's expert cache and the planner for it: what `placer solve --engine llamacpp`
buys over the best `-ncmoe N` alone, on held-out traffic, and how fast the cache replays.

    .venv/bin/python benchmarks/bench_llamacpp.py [--quick]

Data: gpt-oss-20b decode routing (../shared/data/routing/gptoss20b-decode/mmlu_dev.npz: 97
sequences, 24,629 tokens, 24 MoE layers x 32 experts, top-4; MXFP4 experts of 13.2 MB);
skipped, with a line saying so, where ../shared is absent.

Prints:
1. per card (presets 1x-12gb-pcie4: 8 GiB for experts, PCIe 4.0 x16; 1x-8gb-pcie3x4: 4 GiB,
   PCIe 3.0 x4) and concurrency B (1, 8): the planner's choice, solved on a seeded half of
   the sequences, replayed with `placer evaluate` on the other half against `-ncmoe N` at
   the same VRAM (N the fewest leading layers that fit: the best -ncmoe alone, since more
   host layers without a cache only cost more): tok/s of both, their ratio, and the stall
   ratio with its 95% paired interval over held-out sequences.
2. the replay of llama.cpp's cache (solvers/llamacpp/lru.py) over 200,000 tokens x 24
   layers (the routing repeated; one group, 2 GiB), against a plain Python transcription of
   its LRU over the first 5,000 tokens, extrapolated; target: under 10 s.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
GPTOSS = REPO.parent / "shared" / "data" / "routing" / "gptoss20b-decode"
CARDS = ("1x-12gb-pcie4", "1x-8gb-pcie3x4")
BATCHES = (1, 8)
NB2 = 2880 // 32 * 17 * 2880  # one MXFP4 expert matrix of gpt-oss-20b, bytes


def write_half(half: int, out: Path, limit: int | None) -> Path:
    """Half `half` (0: calibration, 1: held out) of mmlu_dev's sequences, split at random
    (seed 0), up to `limit` sequences, imported as a trace directory."""
    from typer.testing import CliRunner

    from placer.cli import app

    data = np.load(GPTOSS / "mmlu_dev.npz")
    lens = data["seq_lens"]
    starts = np.concatenate([[0], np.cumsum(lens)[:-1]])
    mine = np.sort(np.random.default_rng(0).permutation(lens.size)[half::2][:limit])
    rows = np.concatenate([np.arange(starts[s], starts[s] + lens[s]) for s in mine])
    source = out / f"half{half}.npz"
    np.savez(source, expert_ids=data["expert_ids"][rows], seq_lens=lens[mine])
    result = CliRunner().invoke(app, ["traces", "import", str(source), "--format", "tokens",
                                      "--config", str(GPTOSS / "config.json"),
                                      "--out", str(out / f"half{half}"), "--tag", "mmlu"])
    assert result.exit_code == 0, result.output
    return out / f"half{half}"


def planner_section(limit: int | None) -> None:
    from placer.checkpoint.estimate import estimate_inventory
    from placer.hardware.spec import load_spec
    from placer.plan.llamacpp import solve_llamacpp
    from placer.plan.options import SolveOptions
    from placer.predict.evaluate import EvalOptions, evaluate

    inv = estimate_inventory(GPTOSS / "config.json", "mxfp4", None)
    with tempfile.TemporaryDirectory() as tmp:
        calib, held = (write_half(h, Path(tmp), limit) for h in (0, 1))
        print("1. planner's choice vs the best -ncmoe N alone, held-out mmlu_dev half")
        print(f"{'card':>16} {'B':>2} {'choice':>34} {'tok/s':>8} {'-ncmoe':>12} "
              f"{'tok/s':>8} {'ratio':>6} {'stall ratio [95%]':>22} {'solve s':>8}")
        for card in CARDS:
            began = time.perf_counter()
            plan = solve_llamacpp(inv, load_spec(card), [calib],
                                  SolveOptions(concurrency=BATCHES))
            seconds = time.perf_counter() - began
            report = evaluate(plan, [held], EvalOptions())
            ncmoe = next(o for o in plan.engine["options"] if o["name"] == "ncmoe")
            choice = (f"{len(plan.engine['host_layers'])} host layers, cache "
                      f"{plan.engine['moe_cache_mib']} MiB")
            for row in report["results"]:
                mine, base = row["placement"]["tokens_per_s"], row["layer"]["tokens_per_s"]
                low, high = row["ratio_to_layer_ci95"] or (float("nan"),) * 2
                print(f"{card:>16} {row['concurrency']:>2} {choice:>34} "
                      f"{mine:8.2f} {'-ncmoe ' + str(ncmoe['n_cpu_moe']):>12} {base:8.2f} "
                      f"{mine / base:6.3f} {row['ratio_to_layer']:8.3f} [{low:.3f}, "
                      f"{high:.3f}] {seconds:8.1f}")


def python_replay(tokens: np.ndarray, slots: int) -> int:
    """Misses of llama.cpp's LRU (one group, every layer) in plain Python."""
    order, key, where, misses = list(range(slots)), [None] * slots, {}, 0
    for step in tokens:
        for layer, ids in enumerate(step[0]):
            uniq = list(dict.fromkeys(ids.tolist()))
            for e in uniq:
                if (layer, e) in where:
                    order.remove(where[layer, e])
                    order.append(where[layer, e])
            for e in sorted(e for e in uniq if (layer, e) not in where):
                s = order.pop(0)
                if key[s] is not None:
                    del where[key[s]]
                key[s], where[layer, e] = (layer, e), s
                order.append(s)
                misses += 1
    return misses


def replay_section(tokens: int) -> None:
    from solvers.llamacpp.lru import MIB, LlamaCppCache, cache_groups, group_slots

    ids = np.load(GPTOSS / "mmlu_dev.npz")["expert_ids"].astype(np.int64)
    ids = np.resize(ids, (tokens, *ids.shape[1:]))[:, None]  # [S, 1, L, k]
    groups = cache_groups([0] * 24, [("mxfp4", (NB2,) * 3)] * 24, 32)
    slots = group_slots(2048 * MIB, groups, 4)
    LlamaCppCache(groups, slots, 4).replay(ids[:10])  # compile
    began = time.perf_counter()
    fetches = LlamaCppCache(groups, slots, 4).replay(ids)
    compiled = time.perf_counter() - began
    sample = 5000
    began = time.perf_counter()
    misses = python_replay(ids[:sample], int(slots[0]))
    python = (time.perf_counter() - began) * tokens / sample
    assert misses == int(fetches.misses[:sample].sum())
    hits = fetches.hits.sum() / (fetches.hits.sum() + fetches.misses.sum())
    print(f"2. llama.cpp cache replay, {tokens} tokens x 24 layers, {int(slots[0])} slots "
          f"(2 GiB): {compiled:.2f} s compiled (target < 10 s), plain Python ~{python:.0f} s "
          f"extrapolated from {sample} tokens: {python / compiled:.0f}x; hit rate {hits:.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run")
    args = parser.parse_args()
    if not GPTOSS.is_dir():
        print(f"skipped: {GPTOSS} is absent (../shared routing data)")
        return
    planner_section(16 if args.quick else None)
    replay_section(20_000 if args.quick else 200_000)


if __name__ == "__main__":
    main()
