"""Calibrated by measurement (issue #41, deliverable 4): after `placer bench --engine llamacpp
--spec-out` fits the spec on at most 3 options, how close the prediction of the other
options comes to their measured decode tok/s, on real llama.cpp (b11669, the bundled binding;
Vulkan's first device: Mesa's software device where there is no GPU).

    .venv/bin/python benchmarks/bench_llamacpp_measured.py [--quick]

A tiny qwen3_moe (3 MoE layers, 16 experts of 96 KiB, top-2) is built, converted by
llama.cpp's converter, its routing recorded through llama.cpp, planned for a 3 MiB card
(`solve --engine llamacpp`), and benched: every option of the plan's table plus the bench's
references, interleaved over trials. The table: each option's measured tok/s (95% interval
over trials), the plan spec's prediction, the calibrated prediction and its error; the
target is |error| <= 15% on every option not fitted.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

TARGET = 0.15


def placer(*args: object) -> str:
    done = subprocess.run([sys.executable, "-m", "placer", *map(str, args)],
                          capture_output=True, text=True, cwd=REPO)
    if done.returncode != 0:
        raise SystemExit(f"placer {' '.join(map(str, args[:3]))} failed: "
                         f"{done.stderr.strip()[-800:]}")
    return done.stdout


def build(root: Path, prompts: int) -> tuple[Path, Path, Path]:
    from gguf_models import convert
    from llamacpp_boxes import write_one_card_spec

    from placer.checkpoint.tiny import build_tiny_model

    data = REPO.parent / "shared" / "data"
    text = (data / "shakespeare.txt") if (data / "shakespeare.txt").exists() else (
        REPO / "examples" / "data" / "shakespeare_head.txt")
    blocks = [b for b in text.read_text().split("\n\n") if b.strip()]
    model = build_tiny_model("qwen3_moe", root / "model", texts=blocks[:600],
                             router_scale=3.0, hidden=128, experts=16)
    gguf = convert(model, root / "model.gguf")
    placer("collect", "--gguf", gguf, "--tokenizer", model, "--corpus",
           REPO / "examples" / "data" / "vicuna_bench_questions.jsonl", "--mode", "generate",
           "--max-new-tokens", 8, "--max-length", 24, "--max-tokens", 300, "--out",
           root / "traces", "--no-progress")
    spec = write_one_card_spec(root / "box.toml", 3 * 2**20)
    plan = root / "plan.json"
    placer("solve", "--engine", "llamacpp", "--model", gguf, "--hardware", spec, "--traces",
           root / "traces", "--concurrency", "1,4", "--out", plan)
    prompt_file = root / "prompts.txt"
    prompt_file.write_text("\n\n".join(blocks[200:200 + prompts]) + "\n")
    return plan, gguf, prompt_file


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run")
    parser.add_argument("--out", type=Path, help="keep the files here (default: temporary)")
    args = parser.parse_args()
    trials, prompts, new = (3, 5, 3) if args.quick else (5, 8, 8)
    with tempfile.TemporaryDirectory() as tmp:
        root = args.out or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        plan, gguf, prompt_file = build(root, prompts)
        report = json.loads(placer(
            "bench", "--engine", "llamacpp", plan, "--model", gguf, "--prompts", prompt_file,
            "--trials", trials, "--max-new-tokens", new, "--max-prompt-tokens", 4,
            "--threads", 2, "--spec-out", root / "calibrated.toml", "--allow-other-device",
            "--json"))
    cal = report["calibration"]
    predicted = {r["option"]: r["predicted_tokens_per_s"] for r in report["options"]}
    print(f"llama.cpp {report['build']} ({report['source']}): {report['num_prompts']} prompts "
          f"x {trials} trials, {new} new tokens; calibrated on {', '.join(cal['options'])}")
    print(f"fitted: {json.dumps({k: round(v, 4) for k, v in cal['fitted'].items()})}")
    print(f"{'option':<20} {'fitted':>6} {'measured tok/s [95%]':>26} {'plan spec':>10} "
          f"{'calibrated':>10} {'error':>7}")
    for h in cal["rows"]:
        ci = h["measured_tokens_per_s_ci95"]
        span = f"[{ci[0]:.2f}, {ci[1]:.2f}]" if ci else "(none)"
        print(f"{h['option']:<20} {'yes' if h['fitted_on'] else 'no':>6} "
              f"{h['measured_tokens_per_s']:>9.2f} {span:>16} {predicted[h['option']]:>10.2f} "
              f"{h['calibrated_tokens_per_s']:>10.2f} {100 * h['error']:>6.1f}%")
    worst = cal["max_error_not_fitted"]
    cached = [r for r in report["options"] if r["cache"]]
    print(f"cache: logged hits/misses equal to placer's replay for "
          f"{sum(r['cache']['agrees'] for r in cached)} of {len(cached)} cached options")
    if worst is None:
        print("every option was fitted: no held-out error")
    else:
        print(f"largest |error| on options not fitted: {100 * worst:.1f}% (target "
              f"{100 * TARGET:.0f}%): {'met' if worst <= TARGET else 'NOT met'}")


if __name__ == "__main__":
    main()
