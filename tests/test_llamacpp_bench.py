"""`placer bench --engine llamacpp` on real llama.cpp (b11669, Vulkan's software device
here): a plan's options run interleaved over trials, decode tok/s with 95% intervals beside
placer's prediction for the very tokens served, the cache's logged hits and misses equal to
placer's replay, `--spec-out` calibrated on 3 options; one-line errors, nothing left
running."""

from __future__ import annotations

import json
import os
import tomllib
from pathlib import Path

from placer.hardware.spec import parse_spec

pytest_plugins = ["gguf_models", "fixtures_models", "llamacpp_bench_plan"]

# the prompts cut to the device's default length (4 tokens on the software device);
# --allow-other-device: the tests' spec card is not that device
BENCH = ("--trials", 3, "--max-new-tokens", 2, "--threads", 1, "--allow-other-device")


def four_options(plan: Path) -> str:
    """The choice, -ncmoe N, the first cached row of the table that b11669 runs (no
    --moe-cache-cpu-share) and the bench's `cmoe` reference: four different setups (the
    plan's table may repeat one under two names)."""
    rows = json.loads(plan.read_text())["engine"]["options"]
    cached = next(r["name"] for r in rows if r["moe_cache_mib"] and not r["cpu_share"])
    return ",".join(["chosen", "ncmoe", cached, "cmoe"])


def children() -> list[str]:
    """Live (not zombie) child processes of this one."""
    kids = Path(f"/proc/{os.getpid()}/task/{os.getpid()}/children").read_text().split()
    return [k for k in kids if Path(f"/proc/{k}").exists()
            and Path(f"/proc/{k}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"]


def test_bench_llamacpp_measures_predicts_replays_and_calibrates(bench_plan, placer_run,
                                                                 tmp_path):
    plan, gguf, prompts = bench_plan
    out = tmp_path / "calibrated.toml"
    result = placer_run("bench", "--engine", "llamacpp", plan, "--model", gguf, "--prompts",
                        prompts, *BENCH, "--options", four_options(plan), "--spec-out", out,
                        "--json")
    report = json.loads(result.stdout)
    assert report["build"] == "b11669" and report["num_prompts"] == 5
    assert report["max_prompt_tokens"] == (4 if report["device"]["kind"] == "CPU" else 256)
    rows = report["options"]
    assert len(rows) == 4 and len({(tuple(r["host_layers"]), r["moe_cache_mib"])
                                   for r in rows}) == 4
    assert rows[0]["option"] == "chosen"
    assert report["estimated"] == []  # a measured spec: no mark, no step range
    assert not any("predicted_tokens_per_s_step" in r for r in rows)
    for r in rows:
        low, high = r["measured_tokens_per_s_ci95"]
        assert 0 < low <= r["measured_tokens_per_s"] <= high
        assert len(r["measured_tokens_per_s_trials"]) == 3
        low, high = r["predicted_tokens_per_s_ci95"]
        assert 0 < low <= r["predicted_tokens_per_s"] <= high
        assert r["decode_tokens"] > 0
    cached = [r for r in rows if r["moe_cache_mib"]]
    assert cached, "no option with a cache"
    for r in cached:
        c = r["cache"]
        assert c["slots_logged"] == c["slots_replayed"]
        assert c["agrees"] and c["timed_logs_equal"], c
        assert sum(v[1] for v in c["logged"].values()) > 0  # misses happened
    assert report["cache_policy_agrees"] is True
    cal = report["calibration"]
    assert len(cal["options"]) <= 3 and Path(cal["spec_out"]) == out
    assert all(abs(h["error"]) < 1.0 for h in cal["rows"]), cal["rows"]
    spec = parse_spec(tomllib.loads(out.read_text()))
    assert abs(spec.base_step_s(1) * 1e3 - cal["fitted"]["base_step_ms"]) < 0.01 * max(
        1.0, cal["fitted"]["base_step_ms"])
    assert not children()


def test_bench_llamacpp_refusals_are_one_line_before_anything_runs(bench_plan, placer_run,
                                                                   tmp_path, monkeypatch):
    """Every refusal before a worker starts (no llama.cpp environment at all here)."""
    plan, gguf, prompts = bench_plan
    monkeypatch.setenv("PLACER_LLAMA_PYTHON", str(tmp_path / "missing" / "python"))
    base = ("bench", "--engine", "llamacpp", plan, "--model", gguf, "--prompts", prompts)
    other = tmp_path / "other.json"
    other.write_text(json.dumps({**json.loads(plan.read_text()), "engine": None}))
    for args, says in (
            ((*base, "--spec-out", tmp_path / "box.txt"), "TOML"),
            ((*base, "--spec-out", tmp_path / "no" / "box.toml"), "does not exist"),
            ((*base, "--spec-out", plan.with_suffix(".toml"), "--calibrate-on", "x,y"),
             "--calibrate-on"),
            ((*base, "--options", "nope"), "no option 'nope'"),
            ((*base, "--concurrency", "4"), "--concurrency is for placer's own runtime"),
            (("bench", "--engine", "llamacpp", other, "--model", gguf, "--prompts", prompts),
             "expected a plan of"),
            (("bench", "--engine", "llamacpp", plan, "--model", prompts, "--prompts",
              prompts), "runs a GGUF"),
            ((*base,), "make llama-env")):
        result = placer_run(*args, ok=False)
        lines = result.output.strip().splitlines()
        assert result.exit_code == 1 and len(lines) == 1 and says in lines[0], result.output
    assert not (tmp_path / "box.txt").exists()
    assert not children()
