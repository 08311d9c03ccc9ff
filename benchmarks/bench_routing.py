"""Real routing: what a placement buys on traffic recorded from trained models, and how sure.

    .venv/bin/python benchmarks/bench_routing.py [--quick]

Data: ../shared/data/routing (its README names sources and licenses): per-token routing of
four ESFT tasks on DeepSeek-V2-Lite (26 MoE layers x 64 experts, top-6) and per-domain
selection counts of OLMoE-1B-7B (decoder layers 0, 7, 15 x 64 experts, top-8, five domains).
Skipped, with a line saying so, where ../shared is absent (a user's clone).
Box: one card with PCIe 4.0 x16 (25 GB/s, 10 us per copy; benchmarks/one-card.toml), 35% of
the expert bytes on the host, staging execution, B = 1 and 8.

Prints:
1. in profile (ESFT): a plan solved (`placer solve`, every calibration token) on a seeded half
   of a task's sequences, replayed (`placer evaluate`, every token) on the other half:
   placement / oracle and placement / layer offload stall with their 95% intervals (paired
   bootstrap over sequences). Target: placement / oracle within 3% at B = 1 and 8.
2. leave-one-domain-out (ESFT tasks; OLMoE domains, steps sampled from counts): plans solved
   on the other domains' calibration halves, replayed on the held-out domain (unseen) and on
   the known domains' held-out halves (in profile): placement / oracle, means over held-out
   domains, for plain (mean stall over the known domains), worst (minimize the worst ratio to
   layer offload: placer's former --robust) and robust (mean regret, never worse than layer
   offload: placer's --robust). Target: robust below worst on unseen domains.
3. calibration curve (ESFT intent): calibration tokens against held-out hit rate and stall,
   beside uniform and the oracle (`placer evaluate --curve`).
4. ILP seconds on the one-card ESFT problem from 256 sampled steps and from every one of the
   8,222 tokens of the task (32x): target at most 4x.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
ROUTING = REPO.parent / "shared" / "data" / "routing"
ESFT = ROUTING / "esft-deepseek-v2-lite"
OLMOE = ROUTING / "olmoe-mixtral-domains" / "olmoe" / "expert_counts"
BOX = REPO / "benchmarks" / "one-card.toml"
TASKS = ("intent", "law", "summary", "translation")
DOMAINS = ("arxiv", "book", "c4", "github", "wikipedia")
BATCHES = (1, 8)
OFFLOAD = 0.35


def placer(*args: object) -> str:
    """Run the placer CLI; its stdout."""
    cmd = [sys.executable, "-m", "placer", *map(str, args)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{' '.join(cmd[2:])} failed: {done.stderr.strip()}")
    return done.stdout


def write_half(task: str, half: int, out: Path) -> Path:
    """A tokens file of a seeded half of `task`'s sequences (half 0 calibration, 1 held out)."""
    data = np.load(ESFT / f"{task}.npz")
    lens = data["seq_lens"]
    starts = np.concatenate([[0], np.cumsum(lens)[:-1]])
    order = np.random.default_rng(0).permutation(lens.size)
    mine = np.sort(order[half::2])
    rows = np.concatenate([np.arange(starts[s], starts[s] + lens[s]) for s in mine])
    path = out / f"{task}-{half}.npz"
    np.savez(path, expert_ids=data["expert_ids"][rows], seq_lens=lens[mine])
    return path


def import_tokens(path: Path, out: Path) -> Path:
    placer("traces", "import", path, "--format", "tokens", "--config", ESFT / "config.json",
           "--out", out, "--tag", path.stem)
    return out


def solve(root: Path, name: str, traces: list[Path], *extra: str,
          batches: tuple[int, ...] = BATCHES) -> Path:
    plan = root / f"{name}.json"
    placer("solve", "--config", ESFT / "config.json", "--hardware", BOX, "--offload", OFFLOAD,
           "--concurrency", ",".join(map(str, batches)), "--time-limit", 30, "--out", plan,
           *[a for t in traces for a in ("--traces", t)], *extra)
    return plan


def evaluate(plan: Path, traces: Path, *extra: str) -> dict:
    return json.loads(placer("evaluate", plan, "--traces", traces, "--oracle-time-limit", 30,
                             "--json", *extra))


def interval(row: dict, key: str) -> str:
    low, high = row[f"{key}_ci95"]
    return f"{row[key]:.3f} [{low:.3f}, {high:.3f}]"


def in_profile(root: Path, tasks: tuple[str, ...]) -> dict[str, tuple[Path, Path]]:
    """Section 1; returns task -> (calibration dir, held-out dir)."""
    print("\n1. in profile (ESFT): plan on half a task's sequences, every token of the other "
          "half replayed; stall ratios with 95% intervals (bootstrap over sequences)")
    dirs = {}
    for task in tasks:
        calib, held = (import_tokens(write_half(task, h, root), root / f"{task}-{h}")
                       for h in (0, 1))
        dirs[task] = (calib, held)
        sequences = min(len(np.load(root / f"{task}-{h}.npz")["seq_lens"]) for h in (0, 1))
        batches = tuple(b for b in BATCHES if b <= sequences)
        if batches != BATCHES:
            print(f"  {task}: halves of {sequences} sequences make no step of "
                  f"{max(BATCHES)} distinct sequences: B={','.join(map(str, batches))} only")
        report = evaluate(solve(root, f"{task}-plain", [calib], batches=batches), held)
        for row in report["results"]:
            print(f"  {task:12s} B={row['concurrency']}: placement / oracle "
                  f"{interval(row, 'ratio_to_oracle')}, placement / layer offload "
                  f"{interval(row, 'ratio_to_layer')}  ({row['verdict']})")
    return dirs


def lodo_table(name: str, held_out: list[str], sets: dict, solve_on, replay) -> None:
    """Section 2 for one data set. sets: (domain, B, "calib"|"held"|"full") -> Steps;
    solve_on(method, known) -> Placement; replay(placement, steps) -> placement / oracle."""
    print(f"\n2. leave-one-domain-out ({name}): placement / oracle stall, mean over held-out "
          "domains")
    rows: dict[tuple[str, int], list[tuple[float, float]]] = {}
    for unseen in held_out:
        known = [d for d in held_out if d != unseen]
        for method in ("plain", "worst", "robust"):
            placement = solve_on(method, known, sets)
            for b in BATCHES:
                got = replay(placement, sets[(unseen, b, "full")])
                inside = np.mean([replay(placement, sets[(d, b, "held")]) for d in known])
                rows.setdefault((method, b), []).append((got, inside))
    for (method, b), values in rows.items():
        unseen, inside = np.mean(values, axis=0)
        print(f"  {method:7s} B={b}: unseen {unseen:.3f}   in profile {inside:.3f}")
    for b in BATCHES:
        worst, robust = (np.mean([v[0] for v in rows[(m, b)]]) for m in ("worst", "robust"))
        print(f"  robust / worst on unseen domains at B={b}: {robust / worst:.3f} "
              f"({'PASS' if robust <= worst else 'MISS'}, target <= 1)")


def problem_of(shape: tuple[int, int], expert_bytes: int, steps: list):
    from solvers.problem import Cards, Problem

    eb = np.full(shape, expert_bytes, dtype=np.int64)
    cards = Cards(np.array([25e9]), np.array([10e-6]), np.array([0]), np.array([np.inf]))
    return Problem(eb, np.zeros(shape, np.int64),
                   np.array([int((1 - OFFLOAD) * eb.sum())]), cards, steps)


def lodo(shape: tuple[int, int], expert_bytes: int, sets: dict, domains: list[str],
         name: str) -> None:
    from solvers import cost, ilp, robust

    oracles: dict[int, float] = {}

    def replay(placement, steps) -> float:
        p = problem_of(shape, expert_bytes, [steps])
        if id(steps) not in oracles:
            oracles[id(steps)] = cost.objective(p, ilp.solve(p, time_limit=30).placement)
        return cost.objective(p, placement) / oracles[id(steps)]

    def solve_on(method: str, known: list[str], sets: dict):
        calib = [sets[(d, b, "calib")] for d in known for b in BATCHES]
        if method == "plain":
            weighted = [replace(st, weight=1.0 / len(calib)) for st in calib]
            return ilp.solve(problem_of(shape, expert_bytes, weighted), time_limit=30).placement
        problems = [problem_of(shape, expert_bytes, [st]) for st in calib]
        objective = "worst" if method == "worst" else "regret"
        return robust.solve(problems, time_limit=30, objective=objective).result.placement

    lodo_table(name, domains, sets, solve_on, replay)


def esft_sets(dirs: dict[str, tuple[Path, Path]], full: dict[str, Path]) -> dict:
    from placer.replay import make_steps
    from traces.profile import every_token_steps, load_profile

    sets = {}
    for task, (calib, held) in dirs.items():
        for b in BATCHES:
            for kind, path in (("calib", calib), ("held", held), ("full", full[task])):
                # A half with fewer sequences than B (summary: 13 in all) runs at its count.
                batch = min(b, load_profile(path).sequences)
                steps = every_token_steps(path, batch, groupings=1, seed=0)
                sets[(task, b, kind)] = make_steps(kind, steps, 64, 1.0, 0.0)
    return sets


def olmoe_sets(num_steps: int) -> dict:
    from solvers.problem import Steps
    from solvers.steps import gumbel_top_k
    from traces.profile import step_mask

    sets = {}
    for d in DOMAINS:
        counts = np.load(OLMOE / f"{d}.npy").astype(np.float64)
        logits = np.log(counts / counts.sum(axis=1, keepdims=True))
        for b in BATCHES:
            for kind, seed in (("calib", 1), ("held", 2), ("full", 2)):
                rng = np.random.default_rng(seed)
                tok = np.empty((num_steps, b, 3, 8), dtype=np.int64)
                for layer in range(3):
                    tiled = np.broadcast_to(logits[layer], (num_steps * b, 64))
                    tok[:, :, layer] = gumbel_top_k(tiled, 8, rng).reshape(num_steps, b, 8)
                sets[(d, b, kind)] = Steps(kind, b, step_mask(tok, 64), 1.0, 0.0, tok)
    return sets


def curve(root: Path, dirs: dict[str, tuple[Path, Path]]) -> None:
    print("\n3. calibration curve (ESFT intent, 4 folds over sequences, B=1)")
    plan = solve(root, "intent-curve", [dirs["intent"][0]], batches=(1,))
    report = evaluate(plan, dirs["intent"][1], "--curve", "--concurrency", "1")
    for row in report["curve"]:
        share = "" if row["fraction"] is None else f"{row['fraction']:g} of the calibration"
        tokens = f", {row['tokens']:.0f} tokens" if "tokens" in row else ""
        print(f"  {row['line']:9s} {share}{tokens}: held-out hit rate {row['hit_rate']:.3f}, "
              f"stall {row['stall_ms_per_step']:.3f} ms/step")


def ilp_scaling(full: Path) -> None:
    from placer.replay import make_steps
    from solvers import ilp
    from traces.profile import every_token_steps, sampled_token_steps

    print("\n4. ILP seconds against calibration size (ESFT intent, one card, B=1)")
    every = every_token_steps(full, 1, groupings=1, seed=0)
    sampled = sampled_token_steps(full, 1, 256, seed=0)
    times = []
    for name, steps in (("256 sampled steps", sampled), (f"{len(every)} tokens", every)):
        problem = problem_of((26, 64), 3 * 2048 * 1408 * 2,
                             [make_steps(name, steps, 64, 1.0, 0.0)])
        runs = []
        for _ in range(3):
            start = time.perf_counter()
            result = ilp.solve(problem, time_limit=60)
            runs.append(time.perf_counter() - start)
        times.append(float(np.median(runs)))
        print(f"  {name:18s}: {times[-1]:.3f} s (median of 3), {result.status}, "
              f"gap {result.gap:.2%}")
    grow = times[1] / times[0]
    print(f"  {len(every) / 256:.0f}x the steps: {grow:.2f}x the seconds "
          f"({'PASS' if grow <= 4 else 'MISS'}, target <= 4x)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="two tasks, no OLMoE: a smoke run")
    args = parser.parse_args()
    if not ESFT.is_dir():
        print(f"skipped: no real routing at {ROUTING} (a clone without ../shared)")
        return
    tasks = TASKS[:2] if args.quick else TASKS
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        dirs = in_profile(root, tasks)
        full = {t: import_tokens(ESFT / f"{t}.npz", root / f"{t}-full") for t in tasks}
        lodo((26, 64), 3 * 2048 * 1408 * 2, esft_sets(dirs, full), list(tasks),
             "ESFT tasks, every token")
        if not args.quick:
            lodo((3, 64), 3 * 2048 * 1024 * 2, olmoe_sets(2048), list(DOMAINS),
                 "OLMoE domains, 2048 steps sampled from counts")
        curve(root, dirs)
        ilp_scaling(full["intent"])


if __name__ == "__main__":
    main()
