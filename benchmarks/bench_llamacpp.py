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
   its LRU over the first 5,000 tokens, extrapolated; target: under 10 s; and the same
   tokens through ClassLRU (solvers/llamacpp/classlru.py).
3. placer's choice against upstream's tuner (`scripts/moe-cache-tune.py` at b12191, its
   method as `tuner_pick` reads it), per card (the two above and 2x-8gb-pcie4), build (b11669:
   LRU, no CPU share; b12191: ClassLRU and `--moe-cache-cpu-share`) and B (1, 8), both
   replayed on the held-out half: tok/s of each, their ratio, and the stall ratio with its
   95% paired interval over held-out sequences. The markdown table of docs/benchmarks.md
   (about 20 minutes on two shared cores; --quick: 1x-8gb-pcie3x4 alone, 16 sequences).
4. the hit rate of b11669's LRU and of ClassLRU under each reading of its unread clock rule
   (docs/llamacpp.md), at 4 cache sizes and B = 1, 8.
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
TUNER_CARDS = ("1x-12gb-pcie4", "1x-8gb-pcie3x4", "2x-8gb-pcie4")
BUILDS = ("b11669", "b12191")  # the last LRU build placer runs (.venv-llama); the newest read
CALIB_SIZES = (1.0, 0.5)        # the tuner's 2 calibration sizes, of the VRAM -cmoe frees
CALIB_SHARES = (0.0, 0.5, 0.95)  # scripts/moe-cache-tune.py CALIB_SHARES at b12191
TUNER_PINNING = (("tuner", False), ("tuner_pinned", True))  # the user's command: mmap, -lm none
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
    from solvers.llamacpp.classlru import ClassLruCache
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
    ClassLruCache(groups, slots, 4).replay(ids[:10])  # compile
    began = time.perf_counter()
    fetches = ClassLruCache(groups, slots, 4).replay(ids)
    seconds = time.perf_counter() - began
    hits = fetches.hits.sum() / (fetches.hits.sum() + fetches.misses.sum())
    print(f"   ClassLRU (b12170+), the same tokens and slots: {seconds:.2f} s compiled, "
          f"hit rate {hits:.3f}")


def clock_section(limit: int | None) -> None:
    """How much ClassLRU's one unread rule that matters, the clock (solvers/llamacpp/
    classlru.py), moves the hit rate: b11669's LRU and ClassLRU under each reading, one group
    of all 24 layers, on the held-out half at B = 1 and 8."""
    from placer.checkpoint.estimate import estimate_inventory
    from placer.plan.traffic import load_traffic
    from solvers.llamacpp.classlru import CLOCKS, ClassLruCache
    from solvers.llamacpp.lru import MIB, LlamaCppCache, cache_groups, group_slots

    inv = estimate_inventory(GPTOSS / "config.json", "mxfp4", None)
    groups = cache_groups([0] * 24, [("mxfp4", (NB2,) * 3)] * 24, 32)
    with tempfile.TemporaryDirectory() as tmp:
        held = load_traffic(write_half(1, Path(tmp), limit), inv, BATCHES, None, 0)
    print("4. hit rate of b11669's LRU and of ClassLRU under each reading of its clock, "
          "held-out half, every layer on the host")
    print("| `--moe-cache-mib` (slots) | B | LRU (b11669) | "
          + " | ".join(f"ClassLRU, clock {c}" for c in CLOCKS) + " |")
    print("|---|---|---|" + "---|" * len(CLOCKS))
    for mib in (1024, 2048, 4096, 8192):
        slots = group_slots(mib * MIB, groups, 4)
        for b in BATCHES:
            rates = []
            for cache in [LlamaCppCache(groups, slots, 4)] + [
                    ClassLruCache(groups, slots, 4, clock=c) for c in CLOCKS]:
                f = cache.replay(held.steps[b].tokens)
                rates.append(f.hits.sum() / max(1, f.hits.sum() + f.misses.sum()))
            print(f"| {mib} ({int(slots[0])}) | {b} | "
                  + " | ".join(f"{r:.3f}" for r in rates) + " |")


def tuner_pick(machine, tokens: np.ndarray, base_step_s: float, shares: tuple[float, ...],
               pinned: bool = False):
    """Upstream's tuner on `tokens` ([S, B, L, k], its recorded routing) as
    `scripts/moe-cache-tune.py` (b12191) describes its method: every MoE layer on the host
    (`-cmoe`), the server run at 2 cache sizes x 3 CPU shares, the time per token fitted,
    the routing replayed through its copy of the cache logic to predict every size x share of
    its grid, the fastest predicted picked. Only the script's first lines could be read; the
    readings: a "run" is placer's predicted time per token of that setup on these tokens
    (the stand-in for a measured llama-server run, so the tuner's runs see exactly placer's
    model); the fit is least squares of time per token on the replay's uploaded and
    CPU-computed miss bytes per token (plus a constant); the 2 sizes are all and half of the
    VRAM -cmoe frees (CALIB_SIZES); the grid is placer's TUNER_SIZES x `shares` (the build's:
    0 alone without --moe-cache-cpu-share). The tuner does not choose pinning: it runs the
    user's command, its host experts mmap'd as docs/moe-cache.md's example has it (no -lm),
    or pinned (`pinned`: the user added -lm none). Returns (the Setup, what it fitted)."""
    from solvers.errors import SolverError
    from solvers.llamacpp.cost import MIB, cache_full, step_costs, with_cache
    from solvers.llamacpp.search import TUNER_SIZES

    every = np.ones(machine.expert_bytes.shape[0], dtype=bool)
    room = machine.bank_room(every) // MIB
    groups = machine.groups(every)
    per_miss = np.array([groups.slot_bytes(g) if g >= 0 else 0 for g in groups.layer_group])
    n_tokens = max(1, int((tokens >= 0).any(axis=(2, 3)).sum()))
    replays: dict = {}

    def setup(size: float, share: float):
        try:
            return with_cache(machine, f"tuner {size:g} x {share:g}", every,
                              int(size * room), share, pinned=pinned)
        except SolverError:  # llama.cpp refuses a cache this small
            return None

    def features(s) -> list[float]:
        if s.slots not in replays:
            replays[s.slots] = machine.cache(groups, s.slots, machine.top_k).replay(tokens)
        fetches = replays[s.slots]
        miss = fetches.misses * per_miss[None]
        cpu = np.where(cache_full(groups.layer_group, s.slots, fetches), s.cpu_share, 0.0) * miss
        return [1.0, (miss - cpu).sum() / n_tokens, cpu.sum() / n_tokens]

    calib = [s for s in (setup(z, f) for z in CALIB_SIZES for f in CALIB_SHARES
                         if f in shares) if s is not None]
    x = np.array([features(s) for s in calib])
    y = np.array([(base_step_s + step_costs(machine, s, tokens)[:, 0].mean())
                  / tokens.shape[1] for s in calib])
    used = [0, 1] + ([2] if any(shares) else [])
    coef = np.zeros(3)
    coef[used] = np.linalg.lstsq(x[:, used], y, rcond=None)[0]
    grid = [s for s in (setup(z, f) for z in TUNER_SIZES for f in shares) if s is not None]
    best = min(grid, key=lambda s: float(np.dot(coef, features(s))))
    return best, {"calibration_runs": len(calib), "coef": coef.tolist(), "grid": len(grid)}


def tuner_section(limit: int | None, cards: tuple[str, ...] = TUNER_CARDS) -> list[dict]:
    """Placer's choice vs the tuner's pick (module docstring, 3.): rows of the table."""
    import dataclasses

    from placer.checkpoint.estimate import estimate_inventory
    from placer.hardware.spec import load_spec
    from placer.plan.llamacpp import TUNER_SHARES, engine_setup, machine_of, solve_llamacpp
    from placer.plan.options import SolveOptions
    from placer.plan.traffic import load_traffic
    from solvers.llamacpp.builds import parse_build
    from solvers.llamacpp.cost import judge

    inv = estimate_inventory(GPTOSS / "config.json", "mxfp4", None)
    opts = SolveOptions(concurrency=BATCHES)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        calib_dir, held_dir = (write_half(h, Path(tmp), limit) for h in (0, 1))
        calib = load_traffic(calib_dir, inv, BATCHES, None, opts.seed)
        held = load_traffic(held_dir, inv, BATCHES, None, opts.seed)
        print("3. placer's choice vs upstream's tuner (its grid, -cmoe), held-out mmlu_dev half")
        print(f"{'card':>16} {'build':>7} {'B':>2} {'placer':>32} {'tok/s':>8} "
              f"{'tuner (mmap)':>14} {'tok/s':>8} {'tuner (-lm none)':>16} {'tok/s':>8} "
              f"{'ratio':>6} {'stall ratio [95%]':>22}")
        for card in cards:
            spec = load_spec(card)
            for name in BUILDS:
                build = parse_build(name)
                began = time.perf_counter()
                plan = solve_llamacpp(inv, spec, [calib_dir], opts, build)
                seconds = time.perf_counter() - began
                machine = machine_of(inv, spec, opts, build)
                mine = dataclasses.replace(engine_setup(plan), name="placer")
                shares = TUNER_SHARES if build.has_cpu_share else (0.0,)
                for b in BATCHES:
                    picks = [dataclasses.replace(tuner_pick(
                        machine, calib.steps[b].tokens, spec.base_step_s(b), shares,
                        pinned)[0], name=label) for label, pinned in TUNER_PINNING]
                    judged = judge(machine, [mine, *picks], held.steps[b].tokens,
                                   held.steps[b].seqs, spec.base_step_s(b), seed=opts.seed)
                    row = {"card": card, "build": build.name, "policy": build.policy, "B": b,
                           "placer": plan.engine["choice"], "placer_mib": mine.cache_mib,
                           "placer_cpu_share": mine.cpu_share, "placer_pinned": mine.pinned,
                           "placer_host_layers": len(mine.host_layers), "solve_s": seconds}
                    for who, setup in [("placer", mine), *zip(
                            [label for label, _ in TUNER_PINNING], picks, strict=True)]:
                        row[f"{who}_mib"], row[f"{who}_cpu_share"] = (setup.cache_mib,
                                                                      setup.cpu_share)
                        row[f"{who}_tok_s"] = judged.figures[who]["tokens_per_s"]
                        row[f"{who}_tok_s_ci95"] = judged.figures[who]["tokens_per_s_ci95"]
                        if who != "placer":
                            row[f"{who}_stall_ratio"], row[f"{who}_stall_ratio_ci95"] = (
                                judged.ratio("placer", who))
                    rows.append(row)
                    low, high = row["tuner_stall_ratio_ci95"] or (float("nan"),) * 2
                    print(f"{card:>16} {build.name:>7} {b:>2} {placer_label(row):>32} "
                          f"{row['placer_tok_s']:8.2f} {pick_label(row, 'tuner'):>14} "
                          f"{row['tuner_tok_s']:8.2f} {pick_label(row, 'tuner_pinned'):>16} "
                          f"{row['tuner_pinned_tok_s']:8.2f} "
                          f"{row['placer_tok_s'] / row['tuner_tok_s']:6.3f} "
                          f"{row['tuner_stall_ratio']:8.3f} [{low:.3f}, {high:.3f}]")
    print(markdown_table(rows))
    return rows


def placer_label(row: dict) -> str:
    """placer's choice, short: host layers, cache MiB, CPU share, pinned or mmap'd."""
    cache = f"{row['placer_mib']} MiB" if row["placer_mib"] else "no cache"
    share = f" x {row['placer_cpu_share']:g}" if row["placer_cpu_share"] else ""
    pin = ", pinned" if row["placer_pinned"] else ""
    return f"{row['placer_host_layers']} host, {cache}{share}{pin}"


def pick_label(row: dict, who: str) -> str:
    """A tuner pick, short: `--moe-cache-mib` x `--moe-cache-cpu-share`."""
    return f"{row[f'{who}_mib']} x {row[f'{who}_cpu_share']:g}"


def markdown_table(rows: list[dict]) -> str:
    """docs/benchmarks.md's table of the tuner comparison."""
    out = ["| card | build (cache) | B | placer's choice | tok/s [95%] | tuner's pick, mmap'd "
           "(MiB x share) | tok/s [95%] | placer / tuner | stall ratio [95%] | tuner's pick, "
           "`-lm none` | tok/s | placer / tuner |", "|---" * 12 + "|"]
    for r in rows:
        (pl, ph), (tl, th) = r["placer_tok_s_ci95"], r["tuner_tok_s_ci95"]
        low, high = r["tuner_stall_ratio_ci95"] or (float("nan"),) * 2
        out.append(f"| {r['card']} | {r['build']} ({r['policy']}) | {r['B']} | "
                   f"{placer_label(r)} | {r['placer_tok_s']:.2f} [{pl:.2f}, {ph:.2f}] | "
                   f"{pick_label(r, 'tuner')} | {r['tuner_tok_s']:.2f} [{tl:.2f}, {th:.2f}] | "
                   f"**{r['placer_tok_s'] / r['tuner_tok_s']:.3f}** | "
                   f"{r['tuner_stall_ratio']:.3f} [{low:.3f}, {high:.3f}] | "
                   f"{pick_label(r, 'tuner_pinned')} | {r['tuner_pinned_tok_s']:.2f} | "
                   f"**{r['placer_tok_s'] / r['tuner_pinned_tok_s']:.3f}** |")
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run")
    args = parser.parse_args()
    if not GPTOSS.is_dir():
        print(f"skipped: {GPTOSS} is absent (../shared routing data)")
        return
    planner_section(16 if args.quick else None)
    replay_section(20_000 if args.quick else 200_000)
    if args.quick:  # a smoke run: the card where the two part ways (docs/benchmarks.md)
        tuner_section(16, ("1x-8gb-pcie3x4",))
    else:
        tuner_section(None)
    clock_section(16 if args.quick else None)


if __name__ == "__main__":
    main()
