"""The execution mode end to end: solve --execution cpu records it in the plan and the
manifest, evaluate --execution both shows the two models side by side, each replayed with
the cost model the solver optimizes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from placer.plan.placement import read_plan
from placer.predict.evaluate import plan_problem
from solvers import cost
from solvers.judge.replay import make_steps
from solvers.static import baselines
from traces.storing.profile import every_token_steps, step_mask

pytest_plugins = ["fixtures_models"]
REPO = Path(__file__).resolve().parent.parent
BOX = REPO / "examples" / "tiny-box.toml"


@pytest.fixture(scope="module")
def plans(tmp_path_factory: pytest.TempPathFactory, trace_models, collected, placer_run):
    root = tmp_path_factory.mktemp("execution")
    model, traces = trace_models["qwen3_moe"], collected[("qwen3_moe", "score")]
    out = {"model": model, "traces": traces, "root": root}
    for mode in ("stage", "cpu"):
        out[mode] = root / f"{mode}.json"
        placer_run("solve", "--model", model, "--hardware", BOX, "--traces", traces,
                   "--offload", "0.5", "--concurrency", "1,2", "--solver", "greedy",
                   "--execution", mode, "--out", out[mode])
    return out


def test_the_plan_records_its_execution_and_cpu_plans_reserve_no_staging(plans):
    stage, cpu = (json.loads(plans[m].read_text()) for m in ("stage", "cpu"))
    assert (stage["execution"], cpu["execution"]) == ("stage", "cpu")
    assert all(c["staging_bytes"] == 0 for c in cpu["cards"])
    assert all(c["staging_bytes"] > 0 for c in stage["cards"])
    flops = np.array(cpu["model"]["expert_flops"])
    assert flops.shape == (len(cpu["model"]["moe_layers"]), cpu["model"]["experts_per_layer"])
    config = json.loads((plans["model"] / "config.json").read_text())
    weights = 3 * config["hidden_size"] * config["moe_intermediate_size"]  # gate, up, down
    assert np.all(flops == 2 * weights)


def test_evaluate_both_replays_each_model_as_the_solver_prices_it(plans, placer_run):
    report = json.loads(placer_run("evaluate", plans["cpu"], "--traces", plans["traces"],
                                   "--execution", "both", "--oracle-time-limit", "2",
                                   "--json").output)
    modes = [(r["concurrency"], r["execution"]) for r in report["results"]]
    assert modes == [(1, "stage"), (1, "cpu"), (2, "stage"), (2, "cpu")]
    plan = read_plan(plans["cpu"])
    for row in report["results"]:
        steps = every_token_steps(plans["traces"], row["concurrency"], seed=report["seed"],
                                  groupings=report["groupings"])
        problem = plan_problem(plan, [], row["execution"])
        st = make_steps("x", steps, plan.experts_per_layer, 1.0, 0.0)
        layer = baselines.layer_offload(problem).placement
        want = cost.replay(problem, layer, st).step_stall.mean() * 1e3
        assert row["layer"]["stall_ms_per_step"] == pytest.approx(want, rel=1e-9)
        assert step_mask(steps.tokens, plan.experts_per_layer).shape[0] == row["steps"]
    cpu_rows = [r for r in report["results"] if r["execution"] == "cpu"]
    stage_rows = [r for r in report["results"] if r["execution"] == "stage"]
    assert all(c["layer"]["stall_ms_per_step"] != s["layer"]["stall_ms_per_step"]
               for c, s in zip(cpu_rows, stage_rows, strict=True))


def test_the_manifest_carries_the_execution(plans, placer_run):
    out = plans["root"] / "placed-cpu"
    placer_run("emit", "--plan", plans["cpu"], "--model", plans["model"], "--out", out)
    assert json.loads((out / "manifest.json").read_text())["execution"] == "cpu"
    assert "ok:" in placer_run("verify", out, "--model", plans["model"]).output


def test_cpu_execution_needs_a_host_and_whole_experts(plans, placer_run, tmp_path):
    spec = tmp_path / "nohost.toml"
    spec.write_text("\n".join(line for line in BOX.read_text().split("[host]")[0].splitlines()))
    result = placer_run("solve", "--model", plans["model"], "--hardware", spec, "--traces",
                        plans["traces"], "--offload", "0.5", "--execution", "cpu",
                        "--out", tmp_path / "p.json", ok=False)
    assert result.exit_code == 1 and "[host]" in result.stderr
    assert "Traceback" not in result.output
    result = placer_run("solve", "--model", plans["model"], "--hardware", BOX, "--traces",
                        plans["traces"], "--offload", "0.5", "--execution", "cpu",
                        "--page-size", "1KiB", "--out", tmp_path / "p.json", ok=False)
    assert result.exit_code == 1 and "--page-size" in result.stderr
    assert not (tmp_path / "p.json").exists()
