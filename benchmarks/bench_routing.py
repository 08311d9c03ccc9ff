"""Real routing: what a placement buys on traffic recorded from trained models, and how sure.

    .venv/bin/python benchmarks/bench_routing.py [--quick]

Data: ../shared/data/routing (its README names sources and licenses): per-token routing of
four ESFT tasks on DeepSeek-V2-Lite (26 MoE layers x 64 experts, top-6) and per-domain
selection counts of OLMoE-1B-7B (decoder layers 0, 7, 15 x 64 experts, top-8, five domains)
and of Mixtral-8x7B (the same layers and domains, 8 experts, top-2; and all 32 layers on seven
MMLU subjects, from fiddler).
Skipped, with a line saying so, where ../shared is absent (a user's clone).
Box: one card with PCIe 4.0 x16 (25 GB/s, 10 us per copy; benchmarks/one-card.toml), 35% of
the expert bytes on the host, staging execution, B = 1 and 8.

Prints:
1. in profile (ESFT): a plan solved (`placer solve`, every calibration token) on a seeded half
   of a task's sequences, replayed (`placer evaluate`, every token) on the other half:
   placement / oracle and placement / layer offload stall with their 95% intervals (paired
   bootstrap over held-out sequences) for split 0, and placement / oracle over 5 seeded
   splits (mean [min, max]: which sequences calibrate moves it more than the interval of one
   split shows). Target: placement / oracle within 3% at B = 1 and 8.
2. leave-one-domain-out (ESFT tasks; OLMoE domains, steps sampled from counts): plans solved
   on the other domains' calibration halves, replayed on the held-out domain (unseen) and on
   the known domains' held-out halves (in profile): placement / oracle, means over held-out
   domains with 95% intervals (bootstrap over each held-out domain's sequences, or sampled
   steps, every method weighed alike), for plain (mean stall over the known domains), worst
   (minimize the worst ratio to layer offload: placer's former --robust) and robust (mean
   regret, never worse than layer offload: placer's --robust). Target: robust better than
   worst on unseen domains (the paired interval of robust / worst below 1).
3. calibration curve (ESFT intent): calibration tokens against held-out hit rate and stall,
   beside uniform and the oracle (`placer evaluate --curve`).
4. ILP seconds on the one-card ESFT problem from 256 sampled steps and from every one of the
   8,222 tokens of the task (32x): target at most 4x.
5. what placement buys by how skewed the routing is (OLMoE against Mixtral's nearly flat
   routing): per domain, a plan on a sample of its counts (in profile) and a robust plan over
   the other domains (unseen), replayed on a second sample; placement / layer offload and
   placement / uniform (the same bytes on the host, spread at random) with 95% intervals
   over sampled steps, means over domains. On three-layer slices layer offload must put two
   of the three layers on the host (67% of the bytes, not 35%): there / uniform is the fair
   figure.
6. pinned experts plus a cache (gpt-oss-20b decode routing and ESFT): static against a
   plain cache, placer's split and Belady's bound (benchmarks/routing_cache.py says how).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
from routing_cache import cache_section, placer

REPO = Path(__file__).resolve().parent.parent
ROUTING = REPO.parent / "shared" / "data" / "routing"
ESFT = ROUTING / "esft-deepseek-v2-lite"
OLMOE = ROUTING / "olmoe-mixtral-domains" / "olmoe" / "expert_counts"
MIXTRAL = ROUTING / "olmoe-mixtral-domains" / "mixtral" / "expert_counts"
FIDDLER = ROUTING / "fiddler-mixtral-mmlu" / "original"
BOX = REPO / "benchmarks" / "one-card.toml"
TASKS = ("intent", "law", "summary", "translation")
DOMAINS = ("arxiv", "book", "c4", "github", "wikipedia")
BATCHES = (1, 8)
OFFLOAD = 0.35
SPLITS = 5


def write_half(task: str, half: int, out: Path, split: int = 0) -> Path:
    """A tokens file of half `half` (0 calibration, 1 held out) of `task`'s sequences, split at
    random by seed `split`."""
    data = np.load(ESFT / f"{task}.npz")
    lens = data["seq_lens"]
    starts = np.concatenate([[0], np.cumsum(lens)[:-1]])
    order = np.random.default_rng(split).permutation(lens.size)
    mine = np.sort(order[half::2])
    rows = np.concatenate([np.arange(starts[s], starts[s] + lens[s]) for s in mine])
    path = out / f"{task}-{split}-{half}.npz"
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


def shown(point: float, ci95: list[float]) -> str:
    """A figure and its 95% interval: "point [low, high]"."""
    return f"{point:.3f} [{ci95[0]:.3f}, {ci95[1]:.3f}]"


def in_profile(root: Path, tasks: tuple[str, ...], splits: int = SPLITS
               ) -> dict[str, tuple[Path, Path]]:
    """Section 1; returns task -> (calibration dir, held-out dir) of split 0."""
    print(f"\n1. in profile (ESFT): plan on half a task's sequences, every token of the other "
          f"half replayed; split 0 with 95% intervals (bootstrap over held-out sequences), then "
          f"placement / oracle over {splits} seeded splits (mean [min, max]): the interval "
          f"covers which sequences were held out, the splits also which calibrated the plan")
    dirs, over_splits = {}, {}
    for task in tasks:
        for split in range(splits):
            calib, held = (import_tokens(write_half(task, h, root, split),
                                         root / f"{task}-{split}-{h}") for h in (0, 1))
            dirs.setdefault(task, (calib, held))
            sequences = min(len(np.load(root / f"{task}-{split}-{h}.npz")["seq_lens"])
                            for h in (0, 1))
            batches = tuple(b for b in BATCHES if b <= sequences)
            if split == 0 and batches != BATCHES:
                print(f"  {task}: halves of {sequences} sequences make no step of "
                      f"{max(BATCHES)} distinct sequences: B={','.join(map(str, batches))} only")
            report = evaluate(solve(root, f"{task}-{split}-plain", [calib], batches=batches),
                              held)
            for row in report["results"]:
                over_splits.setdefault((task, row["concurrency"]), []).append(
                    row["ratio_to_oracle"])
                if split == 0:
                    print(f"  {task:12s} B={row['concurrency']}: placement / oracle "
                          f"{shown(row['ratio_to_oracle'], row['ratio_to_oracle_ci95'])}, "
                          f"placement / layer offload "
                          f"{shown(row['ratio_to_layer'], row['ratio_to_layer_ci95'])}  "
                          f"({row['verdict']})")
    for (task, b), ratios in over_splits.items():
        mean = float(np.mean(ratios))
        print(f"  {task:12s} B={b}: placement / oracle over {len(ratios)} splits {mean:.3f} "
              f"[{min(ratios):.3f}, {max(ratios):.3f}]  ({'PASS' if mean <= 1.03 else 'MISS'}, "
              f"target <= 1.03)")
    return dirs


METHODS = ("plain", "worst", "robust")


def mean_estimate(estimates: list):
    """The mean of independent figures (each its point and bootstrap replicates)."""
    from solvers.judge.intervals import Estimate

    return Estimate(float(np.mean([e.point for e in estimates])),
                    np.mean([e.replicates for e in estimates], axis=0))


def span(est) -> str:
    """An estimate (solvers.judge.intervals.Estimate) and its 95% interval: "point [low, high]"."""
    return shown(est.point, est.ci95())


def set_steps(sets: dict, num_experts: int, d: str, b: int, kind: str, weight: float = 1.0):
    """Solver steps of sets[(d, b, kind)] (TokenSteps) with `weight`."""
    from solvers.judge.replay import make_steps

    return make_steps(f"{d}-{kind}", sets[(d, b, kind)], num_experts, weight, 0.0)


def plain_over(sets: dict, shape: tuple[int, int], expert_bytes: int, known: list[str]):
    """The ILP placement of the known domains' calibration steps at every B, weighed alike:
    what `placer solve` does with several --traces."""
    from solvers.static import ilp

    weight = 1.0 / (len(known) * len(BATCHES))
    calib = [set_steps(sets, shape[1], d, b, "calib", weight) for d in known for b in BATCHES]
    return ilp.solve(problem_of(shape, expert_bytes, calib), time_limit=30).placement


def robust_over(sets: dict, shape: tuple[int, int], expert_bytes: int, known: list[str],
                objective: str = "regret"):
    """The robust placement over the known domains' calibration steps, one profile per
    (domain, B): placer's --robust ("regret") or its former one ("worst")."""
    from solvers.static import robust

    problems = [problem_of(shape, expert_bytes, [set_steps(sets, shape[1], d, b, "calib")])
                for d in known for b in BATCHES]
    return robust.solve(problems, time_limit=30, objective=objective).result.placement


def lodo(shape: tuple[int, int], expert_bytes: int, sets: dict, domains: list[str],
         name: str) -> None:
    """Section 2 for one data set. sets: (domain, B, "calib"|"held"|"full") -> TokenSteps.

    Each held-out domain's figures come with a bootstrap over its sequences (its sampled
    steps where it has none) in which every method and the oracle are weighed alike, so
    robust / worst is a paired ratio; domains are resampled independently and averaged."""
    from solvers.judge.intervals import REPLICATES, verdict
    from solvers.judge.replay import replay_with_intervals
    from solvers.static import ilp

    def solve_on(method: str, known: list[str]):
        if method == "plain":
            return plain_over(sets, shape, expert_bytes, known)
        return robust_over(sets, shape, expert_bytes, known,
                           "worst" if method == "worst" else "regret")

    def ratios(placements: dict, d: str, b: int, kind: str, seed: int) -> dict:
        """Each method's placement / oracle stall on (d, b, kind), with replicates."""
        oracle = ilp.solve(problem_of(shape, expert_bytes, [set_steps(sets, shape[1], d, b, kind)]),
                           time_limit=30).placement
        lines = {**placements, "oracle": oracle}
        got = replay_with_intervals(problem_of(shape, expert_bytes, []), lines,
                                    sets[(d, b, kind)], 0.0, REPLICATES, seed)
        return {m: got.stall[m].ratio_to(got.stall["oracle"]) for m in placements}

    print(f"\n2. leave-one-domain-out ({name}): placement / oracle stall on the unseen domain "
          "and on the known domains' held-out halves (in profile), means over the "
          f"{len(domains)} folds with 95% intervals")
    unseen: dict[tuple[str, int], list] = {}
    inside: dict[tuple[str, int], list] = {}
    for fold, held_out in enumerate(domains):
        known = [d for d in domains if d != held_out]
        placements = {m: solve_on(m, known) for m in METHODS}
        for b in BATCHES:
            seed = 100 * fold + b
            for m, est in ratios(placements, held_out, b, "full", seed).items():
                unseen.setdefault((m, b), []).append(est)
            per_known = [ratios(placements, d, b, "held", seed + 10 * (i + 1))
                         for i, d in enumerate(known)]
            for m in METHODS:
                inside.setdefault((m, b), []).append(mean_estimate([r[m] for r in per_known]))
    for (m, b), ests in unseen.items():
        print(f"  {m:7s} B={b}: unseen {span(mean_estimate(ests))}   "
              f"in profile {span(mean_estimate(inside[(m, b)]))}")
    for b in BATCHES:
        ratio = mean_estimate(unseen[("robust", b)]).ratio_to(mean_estimate(unseen[("worst", b)]))
        said = verdict(ratio.ci95())
        print(f"  robust / worst on unseen domains at B={b}: {span(ratio)}  ({said}; "
              f"{'PASS' if said == 'better' else 'MISS'}, target: better)")


def problem_of(shape: tuple[int, int], expert_bytes: int, steps: list):
    from solvers.problem import Cards, Problem

    eb = np.full(shape, expert_bytes, dtype=np.int64)
    cards = Cards(np.array([25e9]), np.array([10e-6]), np.array([0]), np.array([np.inf]))
    return Problem(eb, np.zeros(shape, np.int64),
                   np.array([int((1 - OFFLOAD) * eb.sum())]), cards, steps)


def esft_sets(dirs: dict[str, tuple[Path, Path]], full: dict[str, Path]) -> dict:
    from traces.storing.profile import every_token_steps, load_profile

    sets = {}
    for task, (calib, held) in dirs.items():
        for b in BATCHES:
            for kind, path in (("calib", calib), ("held", held), ("full", full[task])):
                # A half with fewer sequences than B (summary: 13 in all) runs at its count.
                batch = min(b, load_profile(path).sequences)
                sets[(task, b, kind)] = every_token_steps(path, batch, groupings=1, seed=0)
    return sets


def count_sets(counts: dict[str, np.ndarray], top_k: int, num_steps: int) -> dict:
    """Steps sampled from each domain's [L, E] selection counts, (domain, B, kind) ->
    TokenSteps: no sequences, so held-out intervals are over sampled steps. "held" and
    "full" are the same sample (a count matrix has no halves)."""
    from solvers.steps import gumbel_top_k
    from traces.storing.profile import TokenSteps

    sets = {}
    for d, matrix in counts.items():
        matrix = matrix.astype(np.float64)
        layers, experts = matrix.shape
        with np.errstate(divide="ignore"):
            logits = np.log(matrix / matrix.sum(axis=1, keepdims=True))
        for b in BATCHES:
            for kind, seed in (("calib", 1), ("held", 2), ("full", 2)):
                rng = np.random.default_rng(seed)
                tok = np.empty((num_steps, b, layers, top_k), dtype=np.int16)
                for layer in range(layers):
                    tiled = np.broadcast_to(logits[layer], (num_steps * b, experts))
                    tok[:, :, layer] = gumbel_top_k(tiled, top_k, rng).reshape(num_steps, b,
                                                                                top_k)
                sets[(d, b, kind)] = TokenSteps(tok, np.full((num_steps, b), -1, np.int64))
    return sets


def olmoe_counts() -> dict[str, np.ndarray]:
    return {d: np.load(OLMOE / f"{d}.npy") for d in DOMAINS}


def mixtral_counts() -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Mixtral-8x7B's per-domain counts (layers 0, 7, 15) and, from fiddler, per-MMLU-subject
    counts of all 32 layers (original model)."""
    domains = {d: np.load(MIXTRAL / f"{d}.npy") for d in DOMAINS}
    subjects = {p.stem: np.array(json.loads(p.read_text())["expert_popularity"])
                for p in sorted(FIDDLER.glob("*.json"))}
    return domains, subjects


def skewed_and_flat() -> None:
    """Section 5."""
    print("\n5. what placement buys by how skewed routing is (2048 steps sampled from counts, "
          "one card, 35% of expert bytes on the host): placement / layer offload and "
          "placement / uniform stall, means over domains with their 95% intervals")
    skew("OLMoE-1B-7B, domains", olmoe_counts(), 8, 3 * 2048 * 1024 * 2)
    domains, subjects = mixtral_counts()
    mixtral_expert = 3 * 4096 * 14336 * 2
    skew("Mixtral-8x7B, domains", domains, 2, mixtral_expert)
    skew("Mixtral-8x7B, MMLU subjects (fiddler)", subjects, 2, mixtral_expert)


def skew(name: str, counts: dict[str, np.ndarray], top_k: int, expert_bytes: int) -> None:
    """Section 5 for one data set: in profile (plan on a domain's calibration sample, replayed
    on a second sample) and unseen (robust plan over the other domains), placement / layer
    offload with its 95% interval, means over the domains."""
    from solvers.judge.intervals import REPLICATES, verdict
    from solvers.judge.replay import replay_with_intervals
    from solvers.static import baselines

    sets = count_sets(counts, top_k, 2048)
    shape = next(iter(counts.values())).shape
    domains = list(counts)
    empty = problem_of(shape, expert_bytes, [])
    layer = baselines.layer_offload(empty).placement
    uniform = baselines.uniform(empty, top_k=top_k, seed=0).placement
    cold = 1 - layer.resident_bytes(empty).sum() / empty.expert_bytes.sum()
    rows: dict[tuple[str, int], list] = {}
    for i, d in enumerate(domains):
        plans = {"in profile": plain_over(sets, shape, expert_bytes, [d]),
                 "unseen": robust_over(sets, shape, expert_bytes,
                                       [o for o in domains if o != d])}
        for b in BATCHES:
            got = replay_with_intervals(problem_of(shape, expert_bytes, []),
                                        {**plans, "layer": layer, "uniform": uniform},
                                        sets[(d, b, "held")], 0.0, REPLICATES, 100 * i + b)
            for line in plans:
                rows.setdefault((line, b), []).append(
                    [got.stall[line].ratio_to(got.stall[base]) for base in ("layer", "uniform")])
    print(f"  {name} ({len(domains)} domains, {shape[0]} layers x {shape[1]} experts, "
          f"top-{top_k}; layer offload puts {cold:.0%} of the bytes on the host, whole "
          f"layers):")
    for (line, b), ests in rows.items():
        to_layer, to_uniform = (mean_estimate([e[i] for e in ests]) for i in (0, 1))
        print(f"    {line:10s} B={b}: placement / layer offload {span(to_layer)} "
              f"({verdict(to_layer.ci95())}), / uniform {span(to_uniform)} "
              f"({verdict(to_uniform.ci95())})")


def curve(root: Path, dirs: dict[str, tuple[Path, Path]]) -> None:
    from placer.report.figures import plus_minus

    print("\n3. calibration curve (ESFT intent, 4 folds over sequences, B=1; means over folds "
          "± the 95% interval over folds)")
    plan = solve(root, "intent-curve", [dirs["intent"][0]], batches=(1,))
    report = evaluate(plan, dirs["intent"][1], "--curve", "--concurrency", "1")
    for row in report["curve"]:
        share = "" if row["fraction"] is None else f"{row['fraction']:g} of the calibration"
        tokens = f", {row['tokens']:.0f} tokens" if "tokens" in row else ""
        print(f"  {row['line']:9s} {share}{tokens}: held-out hit rate "
              f"{plus_minus(row, 'hit_rate')}, stall {plus_minus(row, 'stall_ms_per_step')} "
              f"ms/step")


def ilp_scaling(full: Path) -> None:
    from solvers.judge.replay import make_steps
    from solvers.static import ilp
    from traces.storing.profile import every_token_steps, sampled_token_steps

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
    parser.add_argument("--quick", action="store_true",
                        help="two tasks, two splits, no OLMoE: a smoke run")
    args = parser.parse_args()
    if not ESFT.is_dir():
        print(f"skipped: no real routing at {ROUTING} (a clone without ../shared)")
        return
    tasks = TASKS[:2] if args.quick else TASKS
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        dirs = in_profile(root, tasks, 2 if args.quick else SPLITS)
        full = {t: import_tokens(ESFT / f"{t}.npz", root / f"{t}-full") for t in tasks}
        lodo((26, 64), 3 * 2048 * 1408 * 2, esft_sets(dirs, full), list(tasks),
             "ESFT tasks, every token")
        if not args.quick:
            lodo((3, 64), 3 * 2048 * 1024 * 2, count_sets(olmoe_counts(), 8, 2048),
                 list(DOMAINS), "OLMoE domains, 2048 steps sampled from counts")
        curve(root, dirs)
        ilp_scaling(full["intent"])
        if not args.quick:
            skewed_and_flat()
        cache_section(root, args.quick)


if __name__ == "__main__":
    main()
