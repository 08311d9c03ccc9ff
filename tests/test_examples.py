"""The walk-throughs in examples/ run as a user runs them, and produce what they say."""

from __future__ import annotations

import json
import os
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
    # what its docstring says: an ILP plan and a robust plan, static, and not the same plan
    ilp, robust = (json.loads((out / name).read_text())
                   for name in ("plan.json", "plan-robust.json"))
    assert ilp["solver"]["name"] == "ilp" and robust["solver"]["name"] == "robust"
    assert ilp["cache"]["mode"] == robust["cache"]["mode"] == "off"
    assert set(robust["robust"]["ratios"]) == {f"{name} B={b}" for b in (1, 8)
                                               for name in ("shakespeare_head", "random")}
    assert "did not apply" not in text  # --solver and --time-limit placed both plans
    pinned = [[e["resident_bytes"] > 0 for e in plan["experts"]] for plan in (ilp, robust)]
    assert pinned[0] != pinned[1]  # so the demo's two evaluate tables compare two plans


def test_plan_deepseek_v3_from_config_alone(tmp_path: Path) -> None:
    out = tmp_path / "ds3"
    text = run_example("plan_deepseek_v3.py", "--out", out, "--time-limit", 2, cwd=tmp_path)
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
                       "--time-limit", 2, "--oracle-seconds", 0.5, cwd=tmp_path)
    robust = json.loads((out / "plan-robust.json").read_text())["robust"]
    assert set(robust["ratios"]) == {f"{name} B={b}" for b in (1, 8) for name in
                                     ("shakespeare_head", "vicuna_bench_questions", "random")}
    assert 0 < robust["worst_ratio"] <= 1.0
    assert text.count("$ placer evaluate") == 2


def quickstart_block(readme: Path, marker: str = "<!-- quickstart") -> list[str]:
    """The lines of a README block run by these tests (after `marker`, inside the sh fence)."""
    text = readme.read_text()
    start = text.index("```sh\n", text.index(marker)) + len("```sh\n")
    return text[start:text.index("```", start)].splitlines()


def tiny_user_box(tmp_path: Path) -> Path:
    """A tiny qwen3_moe checkpoint in tmp_path/model and a chat corpus as chat.jsonl."""
    from placer.checkpoint.tiny import build_tiny_model

    prose = (EXAMPLES / "data" / "shakespeare_head.txt").read_text().split("\n\n")
    model = build_tiny_model("qwen3_moe", tmp_path / "model", texts=prose[:200])
    chats = (EXAMPLES / "data" / "vicuna_bench_questions.jsonl").read_text().splitlines()
    (tmp_path / "chat.jsonl").write_text("\n".join(chats[:24]) + "\n")  # 12 + 12 at B = 8
    return model


def run_lines(lines: list[str], model: Path, cwd: Path, warm: str, *,
              other_device: bool = False) -> subprocess.CompletedProcess:
    """`lines` under bash -euo pipefail, `placer` the CLI of this checkout (`warm`: the
    warm_placer fixture's command), MODEL=`model`; with `other_device`, `placer probe
    --step` gets --allow-other-device (this machine has none of the presets' cards)."""
    allow = ('if [ "$1 $2" = "probe --step" ]; then set -- "$@" --allow-other-device; fi; '
             if other_device else "")
    script = "\n".join(["set -euo pipefail", f'placer() {{ {allow}{warm} "$@"; }}',
                        f'MODEL="{model}"', *lines])
    return subprocess.run(["bash", "-c", script], cwd=cwd, capture_output=True, text=True,
                          timeout=900, env={**os.environ, "PYTHONPATH": str(EXAMPLES.parent)})


def test_readme_plan_is_one_command_to_a_plan_its_evaluation_and_a_resumable_rerun(
        tmp_path, warm_placer):
    """The README's `placer plan` block, its very lines, on a tiny model: every stage's
    output under --out, the held-out table and the command to run; run again, every stage
    is skipped; with another --offload, collect and split are skipped and solve reruns."""
    lines = quickstart_block(EXAMPLES.parent / "README.md", "<!-- plan")
    assert lines[0].startswith("MODEL=") and "placer plan" in lines[-1]
    model = tiny_user_box(tmp_path)
    done = run_lines(lines[1:], model, tmp_path, warm_placer)
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    out = tmp_path / "myplan"
    plan = read_plan(out / "plan.json")
    report = json.loads((out / "evaluate.json").read_text())
    assert {r["traces"] for r in report["results"]} == {str(Path("myplan/split/heldout"))}
    assert plan.hardware.name and len(plan.cards) == 1
    for stage in ("collect", "split", "solve", "evaluate", "export"):
        assert f"] {stage}: " in done.stdout and f"{stage}: skipped" not in done.stdout
    assert "/ layer offload" in done.stdout  # the held-out ratios of the summary
    assert printed_command(done.stdout).startswith(
        f"placer emit --plan myplan/plan.json --model {model}")
    assert (out / "run.sh").read_text().splitlines()[-1] == printed_command(done.stdout)
    before = {p: p.stat().st_mtime_ns for p in (out / "plan.json", out / "evaluate.json")}

    again = run_lines(lines[1:], model, tmp_path, warm_placer)
    assert again.returncode == 0, again.stderr
    assert again.stdout.count(": skipped (") == 5, again.stdout
    assert all(p.stat().st_mtime_ns == t for p, t in before.items())
    assert printed_command(again.stdout) == printed_command(done.stdout)

    other = run_lines([*lines[1:-1], lines[-1].replace("--offload 0.3", "--offload 0.6")],
                      model, tmp_path, warm_placer)
    assert other.returncode == 0, other.stderr
    assert "collect: skipped" in other.stdout and "split: skipped" in other.stdout
    assert "solve: skipped" not in other.stdout and "evaluate: skipped" not in other.stdout
    assert read_plan(out / "plan.json").cards[0].budget_bytes < plan.cards[0].budget_bytes


def test_readme_quickstart_from_no_spec_to_a_measured_spec_and_a_plan(tmp_path: Path,
                                                                       warm_placer: str) -> None:
    """The README's quickstart, its very lines, on a tiny model: the MODEL line pointed at it,
    `placer` the CLI of this checkout, a chat corpus as chat.jsonl; everything but `placer
    serve` (it serves until stopped). This machine has no RTX 4090: `probe --step` times the
    CPU and refuses to write that as the preset card's step, so the test's `placer` adds
    --allow-other-device there (the spec then says NOT THE SPEC'S CARD)."""
    from placer.hardware.spec import load_spec

    lines = quickstart_block(EXAMPLES.parent / "README.md")
    assert lines[0].startswith("MODEL=") and any("placer serve" in x for x in lines)
    model = tiny_user_box(tmp_path)
    done = run_lines([x for x in lines[1:] if not x.lstrip().startswith("placer serve")],
                     model, tmp_path, warm_placer, other_device=True)
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    measured, preset = load_spec(tmp_path / "box.toml"), load_spec("1x-rtx4090")
    assert measured.base_step_ms != preset.base_step_ms
    assert "measured on cpu" in (tmp_path / "box.toml").read_text()
    assert "NOT THE SPEC'S CARD" in (tmp_path / "box.toml").read_text()
    plan = read_plan(tmp_path / "plan.json")
    assert plan.hardware == measured
    assert verify_placed(tmp_path / "placed", model).ok
    assert "expert locations ->" in done.stdout  # step 5b: export sglang


def printed_command(stdout: str) -> str:
    """The command `placer plan` printed after "to run it (...):", its continued lines
    (" \\") joined back into the one line run.sh holds."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("to run it (")) + 1
    command = []
    for line in lines[start:]:
        command.append(line.strip().removesuffix(" \\"))
        if not line.endswith(" \\"):
            break
    return " ".join(command)
