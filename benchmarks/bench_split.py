"""`placer solve --cache auto` at DeepSeek-V3 scale: seconds and peak memory as the
calibration traffic grows, and whether the split picks its best candidate.

    .venv/bin/python benchmarks/bench_split.py [--quick]

Model: DeepSeek-V3's shape from examples/deepseek-v3/config.json (58 MoE layers x 256
experts, top-8) with MXFP4 experts; box: the `8x-rtx5090d-pcie5` preset; `--offload 0.5`;
concurrency 1 and 8; `--solver greedy` for the static candidate. Traffic:
`synthetic.deepseek_like` tokens (Zipf-like popularity, topic clusters, drawn per
token: little decode-order reuse), 100 tokens per sequence, imported as a trace
(`placer traces import --format tokens`). Sizes: 20k and 200k tokens (`--quick`: 2k, 20k).

Prints per size the wall seconds of `placer solve` (a subprocess; generating and importing
the traffic is not counted), its peak resident memory, the candidate chosen and the best
candidate's held-out stall, and the ratio of the last run's seconds to the first's (as the
ILP scaling row of bench_routing does). Targets at 200k tokens: at most 120 s on two cores,
peak memory under 4 GB, the chosen candidate within 1% of the best on its own folds. The
machine's load average is printed beside the figures: seconds taken under load are not
this target's.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
CONFIG = REPO / "examples" / "deepseek-v3" / "config.json"
TOKENS_PER_SEQUENCE = 100


def placer(*args: object) -> str:
    done = subprocess.run([sys.executable, "-m", "placer", *map(str, args)],
                          capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"placer {args[0]} failed: {done.stderr.strip()}")
    return done.stdout


def traffic(root: Path, tokens: int) -> Path:
    """Import `tokens` DeepSeek-like tokens as a trace set; its directory."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from synthetic import deepseek_like  # tests/synthetic.py

    selected, seq_ids = deepseek_like(58, 256, 8, num_tokens=tokens,
                                      num_seqs=tokens // TOKENS_PER_SEQUENCE, seed=0)
    npz = root / f"ds3-{tokens}.npz"
    np.savez(npz, expert_ids=selected.astype(np.int16),
             seq_lens=np.bincount(seq_ids, minlength=tokens // TOKENS_PER_SEQUENCE))
    del selected
    out = root / f"ds3-{tokens}"
    placer("traces", "import", npz, "--format", "tokens", "--config", CONFIG, "--out", out,
           "--tag", f"synthetic-{tokens}")
    return out


def solve(root: Path, traces: Path, *extra: str, solver: str = "greedy"
          ) -> tuple[float, float, dict]:
    """(wall seconds, peak resident GB, plan) of one `placer solve --cache auto` (or `extra`
    options) with `solver` for the static candidate (run alone in a child process, so the
    peak is its own)."""
    plan = root / f"{traces.name}{'-'.join(('', *extra))}.json"
    cmd = [sys.executable, "-c", "import resource, subprocess, sys; "
           "subprocess.run(sys.argv[1:], check=True); "
           "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)",
           sys.executable, "-m", "placer", "solve", "--config", str(CONFIG), "--expert-dtype",
           "mxfp4", "--hardware", "8x-rtx5090d-pcie5", "--offload", "0.5", "--concurrency",
           "1,8", "--solver", solver, "--traces", str(traces), "--out", str(plan), *extra]
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode:
        raise SystemExit(f"solve failed: {done.stderr.strip()[-2000:]}")
    peak_kib = int(done.stdout.strip().splitlines()[-1])
    return seconds, peak_kib / 2**20, json.loads(plan.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2k and 20k tokens")
    parser.add_argument("--cache-slots", type=int, default=None, help=(
        "also solve the largest size with --cache N (N slots per card, the rest pinned): the "
        "policy choice (--cache-policy auto) runs, as it does not where static is chosen"))
    args = parser.parse_args()
    sizes = (2_000, 20_000) if args.quick else (20_000, 200_000)
    print(f"solve --cache auto, DeepSeek-V3 shape, 8x-rtx5090d-pcie5, --offload 0.5, B = 1, 8 "
          f"(load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores at the start)")
    runs, peaks = [], []
    with tempfile.TemporaryDirectory(prefix="bench-split-") as tmp:
        root = Path(tmp)
        for tokens in sizes:
            seconds, peak, plan = solve(root, traffic(root, tokens))
            cache = plan["cache"]
            best = min(c["held_out_stall_ms_per_step"] for c in cache["candidates"])
            (mine,) = [c for c in cache["candidates"] if c["chosen"]]  # under the split's policy
            gap = mine["held_out_stall_ms_per_step"] / best - 1
            runs.append(seconds)
            peaks.append(peak)
            print(f"  {tokens:7d} tokens: {seconds:6.1f} s, peak {peak:.2f} GB, "
                  f"{cache['replays']} replays; chose {cache['chosen']} served by "
                  f"{cache['policy']}{' pooled' if cache.get('pooled') else ''} "
                  f"({cache.get('policy_choice')}) "
                  f"({cache['held_out_stall_ms_per_step']:.2f} ms/step held out, "
                  f"{100 * gap:.2f}% above the best candidate: "
                  f"{'PASS' if gap <= 0.01 else 'MISS'}, target <= 1%); load average "
                  f"{os.getloadavg()[0]:.1f}")
        if args.cache_slots is not None:
            seconds, peak, plan = solve(root, root / f"ds3-{sizes[-1]}", "--cache",
                                        str(args.cache_slots))
            cache = plan["cache"]
            rows = {(r["policy"], r["pooled"]): r["held_out_stall_ms_per_step"]
                    for r in cache["policies"]}
            print(f"  {sizes[-1]:7d} tokens, --cache {args.cache_slots}: {seconds:6.1f} s, peak "
                  f"{peak:.2f} GB; served by {cache['policy']}"
                  f"{' pooled' if cache['pooled'] else ''} "
                  f"({cache['held_out_stall_ms_per_step']:.2f} ms/step held out; lfru per layer "
                  f"{rows.get(('lfru', False), float('nan')):.2f}; judged on "
                  f"{cache.get('policy_judged_share', 1.0):.0%} of each fold); load average "
                  f"{os.getloadavg()[0]:.1f}")
    grow = sizes[-1] / sizes[0]
    print(f"  {grow:.0f}x the tokens: {runs[-1] / runs[0]:.2f}x the seconds of the first run")
    if not args.quick:
        print(f"  200k tokens in {runs[-1]:.0f} s ({'PASS' if runs[-1] <= 120 else 'MISS'}, "
              f"target <= 120 s on two unloaded cores), peak {peaks[-1]:.2f} GB "
              f"({'PASS' if peaks[-1] < 4 else 'MISS'}, target < 4 GB)")


if __name__ == "__main__":
    main()
