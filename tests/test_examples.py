"""The walk-throughs in examples/ run as a user runs them, and produce what they say."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from placer.placed.verify import verify_placed
from placer.plan.placement import read_plan

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def run_example(name: str, *args: object, cwd: Path) -> str:
    """stdout of `python examples/NAME ARGS` run in `cwd`; fails the test on a non-zero exit."""
    done = subprocess.run([sys.executable, str(EXAMPLES / name), *map(str, args)], cwd=cwd,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, f"{name} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def test_demo_runs_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    text = run_example("demo.py", "--quick", "--out", out, cwd=tmp_path)
    for step in ("inspect", "collect", "solve", "emit", "verify", "evaluate", "run"):
        assert f"$ placer {step}" in text
    assert verify_placed(out / "placed", out / "model").ok
    assert "demo done" in text


def test_plan_deepseek_v3_from_config_alone(tmp_path: Path) -> None:
    out = tmp_path / "ds3"
    text = run_example("plan_deepseek_v3.py", "--out", out, "--time-limit", 5, cwd=tmp_path)
    for name in ("plan-greedy.json", "plan-ilp.json"):
        plan = read_plan(out / name)
        assert len(plan.experts) == 58 * 256 and len(plan.cards) == 8
        assert all(c.resident_bytes + c.staging_bytes <= c.budget_bytes for c in plan.cards)
        raw = json.loads((out / name).read_text())
        for row in raw["predicted"]:
            assert row["placement"]["stall_ms_per_step"] < row["layer"]["stall_ms_per_step"]
    assert "--n-cpu-moe" in text and "-ot" in text


def test_robust_over_two_traffic_kinds_and_random_tokens(tmp_path: Path) -> None:
    out = tmp_path / "robust"
    text = run_example("robust_random_tokens.py", "--out", out, "--tokens", 1500,
                       "--oracle-seconds", 1, cwd=tmp_path)
    robust = json.loads((out / "plan-robust.json").read_text())["robust"]
    assert set(robust["ratios"]) == {f"{name} B={b}" for b in (1, 8) for name in
                                     ("shakespeare_head", "vicuna_bench_questions", "random")}
    assert 0 < robust["worst_ratio"] <= 1.0
    assert text.count("$ placer evaluate") == 2
