"""The main job end to end on a tiny real MoE model that this script builds offline.

    python examples/demo.py --out demo-out [--quick]

1. build a tiny qwen3_moe checkpoint with a locally trained tokenizer;
2. placer inspect: the inventory;
3. placer collect: routing traces on calibration prose, held-out prose, chat prompts, and
   uniform random token ids (the traffic on which the motivating placement regressed);
4. placer solve, on a toy 2-card box scaled to the tiny model: an ILP plan learned from the
   calibration prose, and a robust plan over prose + random tokens (the robust MILP: the
   least mean regret, never predicted worse than layer offload on either). Both are static
   placements (--cache 0: pinned experts, the rest staged when selected), since only a
   static placement is placed by --solver (or --robust's MILP) within --time-limit. Solve's
   default, --cache auto, splits the budget between pins and cache slots by replaying
   held-out folds instead (its summary notes that --solver did not apply): on this tiny
   model it picked the same plain cache with and without --robust (tried with --quick), so
   it had no robust plan of its own to show;
5. placer emit + placer verify: the ILP plan's repacked shards, proven byte for byte;
6. placer evaluate: each plan on every traffic set against layer offload, uniform, the
   oracle and a plain cache (lru), with a WARNING where a plan is predicted worse than layer
   offload or lru (here a cache beats both static plans: why --cache auto is the default);
7. placer run: a prompt through the placed model on the reference staging runtime, with
   what it staged.

Every step is a real `placer` command, printed before it runs. `--quick` (what the tests run)
collects fewer tokens and gives the ILP, the robust MILP and the oracle less time: the same
steps, rougher figures.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from walkthrough import DATA, HERE, fresh_dir, placer, tiny_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("demo-out"))
    parser.add_argument("--quick", action="store_true", help="fewer tokens, shorter ILP")
    args = parser.parse_args()
    tokens, seconds, oracle = (1500, 2, 1) if args.quick else (12000, 20, 10)
    out = fresh_dir(args.out)

    model = tiny_model(out / "model")
    print(f"built a tiny qwen3_moe checkpoint in {model}")
    placer("inspect", model)

    corpora = {
        "calib": ["--corpus", DATA / "shakespeare_head.txt"],
        "heldout": ["--corpus", DATA / "shakespeare_tail.txt"],
        "chat": ["--corpus", DATA / "vicuna_bench_questions.jsonl"],
        "random": ["--random-tokens", tokens],
    }
    for name, source in corpora.items():
        placer("collect", "--model", model, *source, "--out", out / "traces" / name,
               "--max-tokens", tokens, "--max-length", 128, "--batch-size", 16)
    placer("traces", "stats", out / "traces" / "calib", "--plot", out / "calib-heatmap.png")

    box = HERE / "tiny-box.toml"
    common = ["--model", model, "--hardware", box, "--offload", 0.5, "--concurrency", "1,8",
              "--cache", 0, "--time-limit", seconds]
    placer("solve", *common, "--traces", out / "traces" / "calib", "--solver", "ilp",
           "--out", out / "plan.json")
    placer("solve", *common, "--traces", out / "traces" / "calib", "--traces",
           out / "traces" / "random", "--robust", "--out", out / "plan-robust.json")

    placer("emit", "--plan", out / "plan.json", "--model", model, "--out", out / "placed")
    placer("verify", out / "placed", "--model", model)

    evals = [a for name in ("heldout", "chat", "random")
             for a in ("--traces", out / "traces" / name)]
    placer("evaluate", out / "placed", *evals, "--oracle-time-limit", oracle,
           "--plot", out / "evaluate.png")
    placer("evaluate", out / "plan-robust.json", *evals, "--oracle-time-limit", oracle)
    placer("run", out / "placed", "--model", model, "--prompt", "To be, or not to be",
           "--max-new-tokens", 16)
    print(f"\ndemo done: everything is in {out}/")


if __name__ == "__main__":
    main()
