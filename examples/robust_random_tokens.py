"""Robust placement: one plan that is never predicted worse than layer offload on prose,
chat or uniform random tokens, beside a plan learned from prose alone.

    python examples/robust_random_tokens.py --out robust-out

The motivating result: a placement learned from real traffic raised decode speed on that
traffic but lowered it on uniform random tokens. This walk-through shows the same risk on a
tiny real model and the way out:

1. build a tiny qwen3_moe checkpoint and collect routing traces on real prose, real chat
   prompts and uniform random token ids (calibration halves);
2. placer solve --traces prose: the plan that fits prose best;
3. placer solve --traces prose --traces chat --traces random --robust: the plan that
   minimizes the mean regret (stall over each traffic's own best) across the three, never
   worse than layer offload on any;
4. placer evaluate: both plans on held-out prose and on fresh random tokens, each beside layer
   offload and the oracle, with a WARNING wherever a plan is predicted worse than layer
   offload.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from walkthrough import DATA, HERE, fresh_dir, placer, tiny_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("robust-out"))
    parser.add_argument("--tokens", type=int, default=6000, help="tokens per trace")
    parser.add_argument("--time-limit", type=float, default=10.0, help="ILP seconds per solve")
    parser.add_argument("--oracle-seconds", type=float, default=10.0,
                        help="time for each oracle ILP of evaluate")
    args = parser.parse_args()
    out = fresh_dir(args.out)

    model = tiny_model(out / "model")
    traces = out / "traces"
    sources = {"prose": ["--corpus", DATA / "shakespeare_head.txt"],
               "chat": ["--corpus", DATA / "vicuna_bench_questions.jsonl"],
               "random": ["--random-tokens", args.tokens, "--seed", 1],
               "heldout-prose": ["--corpus", DATA / "shakespeare_tail.txt"],
               "heldout-random": ["--random-tokens", args.tokens, "--seed", 2]}
    for name, source in sources.items():
        placer("collect", "--model", model, *source, "--out", traces / name,
               "--max-tokens", args.tokens, "--max-length", 128, "--batch-size", 16,
               "--no-progress")

    common = ["--model", model, "--hardware", HERE / "tiny-box.toml", "--offload", 0.5,
              "--concurrency", "1,8", "--time-limit", args.time_limit]
    placer("solve", *common, "--traces", traces / "prose", "--out", out / "plan-prose.json")
    placer("solve", *common, "--traces", traces / "prose", "--traces", traces / "chat",
           "--traces", traces / "random", "--robust", "--out", out / "plan-robust.json")
    held_out = ["--traces", traces / "heldout-prose", "--traces", traces / "heldout-random"]
    for plan in ("plan-prose.json", "plan-robust.json"):
        placer("evaluate", out / plan, *held_out, "--oracle-time-limit", args.oracle_seconds)
    print(f"\nplans and traces in {out}/")


if __name__ == "__main__":
    main()
