"""Calibrated by measurement (issue #41, deliverable 4; issue #52's held-back shape): after
`placer bench --engine llamacpp --spec-out` fits the spec on at most 3 options, how close the
prediction of the other options comes to their measured decode tok/s, and whether the
cache's logged hits and misses equal placer's replay at every cache size run, on real
llama.cpp (b11669, the bundled binding; Vulkan's first device: Mesa's software device where
there is no GPU).

    .venv/bin/python benchmarks/bench_llamacpp_measured.py [--shape tests|held-back] [--quick]

A tiny qwen3_moe of the shape (`--shape`, SHAPES) is built, converted by llama.cpp's
converter, its routing recorded through llama.cpp, planned for a small card (`solve --engine
llamacpp`), and benched: every option of the plan's table that b11669 runs plus the bench's
references, interleaved over trials. `tests` is the shape the tests' bench GGUF has (3 MoE
layers, 16 experts of 96 KiB, top-2, a 3 MiB card); `held-back` is a shape no test builds (5
MoE layers, 12 experts of 216 KiB, top-3, a 6 MiB card: its 1 MiB cache holds 3 slots, top-k).
The tables: each cached option's slots, logged and replayed hits/misses; each option's
measured tok/s (95% interval over trials), the plan spec's prediction, the calibrated
prediction and its error. Targets: logged == replayed for every cached option (the exit
status is 1 where not), |error| <= 15% on every option not fitted.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

TARGET = 0.15


@dataclass(frozen=True)
class Shape:
    """A tiny qwen3_moe's shape (every layer MoE; experts of 3 x hidden x hidden/2 float32
    weights) and the VRAM of the card it is planned for."""

    layers: int
    experts: int
    top_k: int
    hidden: int
    card_mib: int


SHAPES = {"tests": Shape(3, 16, 2, 128, 3), "held-back": Shape(5, 12, 3, 192, 6)}


def placer(*args: object) -> str:
    done = subprocess.run([sys.executable, "-m", "placer", *map(str, args)],
                          capture_output=True, text=True, cwd=REPO)
    if done.returncode != 0:
        raise SystemExit(f"placer {' '.join(map(str, args[:3]))} failed: "
                         f"{done.stderr.strip()[-800:]}")
    return done.stdout


def build(root: Path, prompts: int, shape: Shape) -> tuple[Path, Path, Path]:
    from gguf_models import convert
    from llamacpp_boxes import write_one_card_spec

    from placer.checkpoint.tiny import build_tiny_model

    data = REPO.parent / "shared" / "data"
    text = (data / "shakespeare.txt") if (data / "shakespeare.txt").exists() else (
        REPO / "examples" / "data" / "shakespeare_head.txt")
    blocks = [b for b in text.read_text().split("\n\n") if b.strip()]
    model = build_tiny_model("qwen3_moe", root / "model", texts=blocks[:600],
                             router_scale=3.0, hidden=shape.hidden, experts=shape.experts,
                             layers=shape.layers, top_k=shape.top_k)
    gguf = convert(model, root / "model.gguf")
    placer("collect", "--gguf", gguf, "--tokenizer", model, "--corpus",
           REPO / "examples" / "data" / "vicuna_bench_questions.jsonl", "--mode", "generate",
           "--max-new-tokens", 8, "--max-length", 24, "--max-tokens", 300, "--out",
           root / "traces", "--no-progress")
    spec = write_one_card_spec(root / "box.toml", shape.card_mib * 2**20)
    plan = root / "plan.json"
    placer("solve", "--engine", "llamacpp", "--model", gguf, "--hardware", spec, "--traces",
           root / "traces", "--concurrency", "1,4", "--out", plan)
    prompt_file = root / "prompts.txt"
    prompt_file.write_text("\n\n".join(blocks[200:200 + prompts]) + "\n")
    return plan, gguf, prompt_file


def print_cache(report: dict) -> bool:
    """Each cached option's slots and its logged beside its replayed hits/misses; whether
    they are equal for every one."""
    cached = [r for r in report["options"] if r["cache"]]
    print(f"{'option':<22} {'MiB':>4} {'slots logged/replayed':>22} "
          f"{'logged hits/misses':>19} {'replayed':>10} {'equal':>6}")
    for r in cached:
        c = r["cache"]
        logged = [sum(v[i] for v in c["logged"].values()) for i in (0, 1)]
        replayed = [sum(v[i] for v in c["replayed"].values()) for i in (0, 1)]
        slots = f"{c['slots_logged']}/{c['slots_replayed']}"
        print(f"{r['option']:<22} {r['moe_cache_mib']:>4} {slots:>22} "
              f"{logged[0]:>9}/{logged[1]:<9} {replayed[0]:>4}/{replayed[1]:<5} "
              f"{'yes' if c['agrees'] and c['timed_logs_equal'] else 'NO':>6}")
    equal = [r["cache"]["agrees"] and r["cache"]["timed_logs_equal"] for r in cached]
    print(f"cache: logged hits/misses equal to placer's replay (recording and every timed "
          f"pass) for {sum(equal)} of {len(cached)} cached options")
    return all(equal)


def print_calibration(report: dict, trials: int, new: int) -> None:
    cal = report["calibration"]
    predicted = {r["option"]: r["predicted_tokens_per_s"] for r in report["options"]}
    device = report["device"] or {}
    print(f"llama.cpp {report['build']} ({report['source']}) on {device.get('name', '?')} "
          f"({device.get('kind', '?')}): {report['num_prompts']} prompts x {trials} trials, "
          f"{new} new tokens; calibrated on {', '.join(cal['options'])}")
    print(f"fitted: {json.dumps({k: round(v, 4) for k, v in cal['fitted'].items()})}")
    print(f"{'option':<22} {'fitted':>6} {'measured tok/s [95%]':>26} {'plan spec':>10} "
          f"{'calibrated':>10} {'error':>7}")
    for h in cal["rows"]:
        ci = h["measured_tokens_per_s_ci95"]
        span = f"[{ci[0]:.2f}, {ci[1]:.2f}]" if ci else "(none)"
        print(f"{h['option']:<22} {'yes' if h['fitted_on'] else 'no':>6} "
              f"{h['measured_tokens_per_s']:>9.2f} {span:>16} {predicted[h['option']]:>10.2f} "
              f"{h['calibrated_tokens_per_s']:>10.2f} {100 * h['error']:>6.1f}%")
    worst = cal["max_error_not_fitted"]
    if worst is None:
        print("every option was fitted: no held-out error")
    else:
        print(f"largest |error| on options not fitted: {100 * worst:.1f}% (target "
              f"{100 * TARGET:.0f}%): {'met' if worst <= TARGET else 'NOT met'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="tests")
    parser.add_argument("--out", type=Path, help="keep the files here (default: temporary)")
    parser.add_argument("--trials", type=int, help="timed passes per option (5; --quick 3)")
    parser.add_argument("--prompts", type=int, help="prompts (8; --quick 5)")
    parser.add_argument("--new-tokens", type=int, help="decode tokens a prompt (8; --quick 3)")
    parser.add_argument("--threads", type=int, default=2, help="llama.cpp's CPU threads")
    args = parser.parse_args()
    trials, prompts, new = (3, 5, 3) if args.quick else (5, 8, 8)
    trials, prompts, new = args.trials or trials, args.prompts or prompts, args.new_tokens or new
    shape = SHAPES[args.shape]
    print(f"shape {args.shape}: {shape.layers} MoE layers x {shape.experts} experts, top-"
          f"{shape.top_k}, hidden {shape.hidden}; a {shape.card_mib} MiB card")
    with tempfile.TemporaryDirectory() as tmp:
        root = args.out or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        plan, gguf, prompt_file = build(root, prompts, shape)
        text = placer(
            "bench", "--engine", "llamacpp", plan, "--model", gguf, "--prompts", prompt_file,
            "--trials", trials, "--max-new-tokens", new, "--max-prompt-tokens", 4,
            "--threads", args.threads, "--spec-out", root / "calibrated.toml",
            "--allow-other-device", "--json")
        (root / "bench.json").write_text(text)
        report = json.loads(text)
    print(f"load average at the end (1, 5, 15 min; this box's {os.cpu_count()} cores shared): "
          f"{', '.join(f'{x:.1f}' for x in os.getloadavg())}")
    for note in report["notes"]:
        print(f"note: {note}")
    print_calibration(report, trials, new)
    if not print_cache(report):
        sys.exit(1)


if __name__ == "__main__":
    main()
