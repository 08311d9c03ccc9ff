"""The main job end to end on a tiny real MoE model that this script builds offline.

    python examples/demo.py --out demo-out

1. build a tiny qwen3_moe checkpoint with a locally trained tokenizer;
2. placer inspect: the inventory;
3. placer collect: routing traces on calibration prose, held-out prose, chat prompts, and
   uniform random token ids (the traffic on which the motivating placement regressed);
4. placer solve: an ILP plan learned from the calibration prose, and a robust plan over
   prose + random tokens, on a toy 2-card box scaled to the tiny model;
5. placer emit + placer verify: the repacked shards, proven byte for byte;
6. placer evaluate: each plan on every traffic set against layer offload, uniform and the
   oracle, with a WARNING where a plan is predicted worse than layer offload;
7. placer run: a prompt through the placed model on the reference staging runtime, with
   what it staged.

Every step is a real `placer` command, printed before it runs.
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
DATA = HERE / "data"
PLACER = [sys.executable, "-m", "placer"]


def placer(*args: object) -> None:
    """Run one placer command, echoing it as a user would type it."""
    words = [str(a) for a in args]
    print(f"\n$ placer {shlex.join(words)}", flush=True)
    subprocess.run([*PLACER, *words], check=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("demo-out"))
    args = parser.parse_args()
    out: Path = args.out
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)

    from placer.tinymodel import build_tiny_model

    texts = [b for b in (DATA / "shakespeare_head.txt").read_text().split("\n\n") if b.strip()]
    model = build_tiny_model("qwen3_moe", out / "model", texts=texts, layers=4, experts=16,
                             top_k=2, hidden=64, router_scale=4.0)
    print(f"built a tiny qwen3_moe checkpoint in {model}")
    placer("inspect", model)

    corpora = {
        "calib": ["--corpus", DATA / "shakespeare_head.txt"],
        "heldout": ["--corpus", DATA / "shakespeare_tail.txt"],
        "chat": ["--corpus", DATA / "vicuna_bench_questions.jsonl"],
        "random": ["--random-tokens", 12000],
    }
    for name, source in corpora.items():
        placer("collect", "--model", model, *source, "--out", out / "traces" / name,
               "--max-tokens", 12000, "--max-length", 128, "--batch-size", 16)
    placer("traces", "stats", out / "traces" / "calib", "--plot", out / "calib-heatmap.png")

    box = HERE / "tiny-box.toml"
    common = ["--model", model, "--hardware", box, "--offload", 0.5, "--concurrency", "1,8",
              "--time-limit", 20]
    placer("solve", *common, "--traces", out / "traces" / "calib", "--solver", "ilp",
           "--out", out / "plan.json")
    placer("solve", *common, "--traces", out / "traces" / "calib", "--traces",
           out / "traces" / "random", "--robust", "--out", out / "plan-robust.json")

    placer("emit", "--plan", out / "plan.json", "--model", model, "--out", out / "placed")
    placer("verify", out / "placed", "--model", model)

    evals = [a for name in ("heldout", "chat", "random")
             for a in ("--traces", out / "traces" / name)]
    placer("evaluate", out / "placed", *evals, "--plot", out / "evaluate.png")
    placer("evaluate", out / "plan-robust.json", *evals)
    placer("run", out / "placed", "--model", model, "--prompt", "To be, or not to be",
           "--max-new-tokens", 16)
    print(f"\ndemo done: everything is in {out}/")


if __name__ == "__main__":
    main()
