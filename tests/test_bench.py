"""`placer bench`: two placed directories measured on this box beside what evaluate's cost
model predicts for the very decode steps they served, each with its interval."""

from __future__ import annotations

import json

import numpy as np
import pytest
from placed_plans import cached_plan, layer_plan
from test_runtime import PROMPTS
from test_runtime_placed import placed_model

from placer.checkpoint.inventory import read_inventory
from placer.hardware.spec import load_spec
from placer.plan.placement import read_plan
from placer.predict.evaluate import cache_lines, plan_placement, plan_problem
from placer.predict.staging import expected_staging
from placer.report.serving import print_bench
from placer.serve.bench_predict import cache_verdicts, predict_arm
from solvers.cache_table import POLICY_NAMES
from solvers.judge.replay import replay_with_intervals
from traces.storing.profile import TokenSteps, step_mask

pytest_plugins = ["fixtures_models"]


@pytest.fixture(scope="module")
def arms(trace_models, tmp_path_factory, cli):
    checkpoint = trace_models["qwen3_moe"]
    root = tmp_path_factory.mktemp("bench")
    placed = placed_model(checkpoint, root / "plan", cli)
    staging = int(read_inventory(checkpoint).expert_bytes().sum(axis=1).max())
    (root / "layer").mkdir()
    cli("emit", "--plan", layer_plan(checkpoint, root / "layer", staging), "--model",
        checkpoint, "--out", root / "layer" / "placed")
    return checkpoint, [placed, root / "layer" / "placed"]


def test_bench_measures_and_predicts_every_arm(arms, tmp_path, cli, capsys):
    checkpoint, placed = arms
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n\n".join(PROMPTS) + "\n")
    plot, spec = tmp_path / "bench.png", tmp_path / "measured.toml"
    report = json.loads(cli("bench", *placed, "--model", checkpoint, "--prompts", prompts,
                            "--concurrency", "1,2", "--trials", "2", "--max-new-tokens", "6",
                            "--device", "cpu", "--plot", plot, "--spec-out", spec, "--json"
                            ).output)
    rows = report["arms"]
    assert [(r["placed"], r["concurrency"]) for r in rows] == [
        (str(p), c) for p in placed for c in (1, 2)]
    for r in rows:
        low, high = r["predicted_tokens_per_s_ci95"]
        assert 0 < low <= r["predicted_tokens_per_s"] <= high
        for key in ("measured_tokens_per_s", "ttft_ms", "measured_ratio_to_first"):
            assert r[key] > 0 and r[f"{key}_ci95"] is None  # 2 trials: too few, a note says
        assert r["measured_step_ms"] > 0 and 0 < r["measured_base_step_ms"] <= r[
            "measured_step_ms"]
        assert len(r["measured_tokens_per_s_trials"]) == 2 and r["decode_steps"] > 0
        assert r["batching"] == "continuous" and r["predicted_interval_over"] == "prompts"
    assert report["notes"] == ["2 trials per arm and concurrency: too few for an interval of "
                               "the measured figures (give --trials 3 or more)"]
    first = [r for r in rows if r["placed"] == str(placed[0])]
    assert all(r["measured_ratio_to_first"] == 1 == r["predicted_ratio_to_first"] for r in first)
    layer = [r for r in rows if r["placed"] == str(placed[1])]
    assert all(r["predicted_staged_bytes_per_token"] > 0 for r in layer)
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    measured = load_spec(spec)
    bases = [float(f"{r['measured_base_step_ms']:.4g}") for r in first]  # C = 1, 2
    assert measured.base_step_ms == ((1, bases[0]), (2, max(bases)))  # never falling
    assert report["spec_out"] == str(spec) and "measured by placer bench" in spec.read_text()
    capsys.readouterr()
    print_bench(report)
    table = capsys.readouterr().out
    assert "decode tok/s" in table and "measured" in table and "predicted" in table
    assert max(map(len, table.splitlines()[:-3])) <= 100  # the table; notes and paths after
    assert "(no interval)" in table and "note: 2 trials" in table
    assert report["estimated"] == [] and "ESTIMATED" not in table  # a measured spec: no mark
    assert "step estimated" not in table and "predicted_tokens_per_s_step" not in rows[0]
    assert f"{rows[0]['measured_step_ms']:.2f} ms at C=1" in table
    assert f"{layer[0]['predicted_ratio_to_first']:.3f}" in table
    for r, v in zip(rows, report["verdicts"], strict=True):
        low = (r["predicted_stall_ratio_to_lru_ci95"] or [0, 0])[0]
        assert v["ok"] == (low <= 1.0) and v["measured_vs_plain_cache"] is None
        assert all(m in table for m in v["messages"])


@pytest.mark.parametrize("where", ["spec", "plot"])
def test_an_output_inside_a_placed_directory_or_on_the_other_is_refused_first(arms, tmp_path,
                                                                            cli, where):
    """#44 class 8: --spec-out (or --plot) inside the second placed directory is one line
    and exit 1 before anything is measured or written."""
    checkpoint, placed = arms
    prompts = tmp_path / "prompts.txt"
    prompts.write_text(PROMPTS[0] + "\n")
    inside = {"spec": ["--spec-out", placed[1] / "box.toml"],
              "plot": ["--plot", placed[1] / "bench.png"]}
    before = sorted(p.name for p in placed[1].iterdir())
    result = cli("bench", *placed, "--model", checkpoint, "--prompts", prompts, "--device",
                 "cpu", "--trials", "1", *inside[where], ok=False)
    lines = result.output.strip().splitlines()
    assert result.exit_code == 1 and len(lines) == 1, result.output
    assert "placed directory" in lines[0], lines
    assert sorted(p.name for p in placed[1].iterdir()) == before


def test_bench_warns_where_an_arm_is_behind_the_plain_cache():
    """Predicted: the stall ratio to lru on the bench's steps; measured: tokens/s over a
    plain-cache arm's, trial by trial (Student's t on the logarithms, so the interval of a
    ratio stays positive)."""
    def arm(name, plain, trials, ci):
        return {"placed": name, "concurrency": 1, "plain_cache": plain,
                "measured_tokens_per_s_trials": trials,
                "predicted_stall_ratio_to_lru": sum(ci) / 2,
                "predicted_stall_ratio_to_lru_ci95": ci}

    plain = arm("plain", True, [10.0, 10.2, 9.9], [0.99, 1.01])
    ahead = arm("ahead", False, [12.0, 12.1, 12.3], [0.8, 0.9])
    behind = arm("behind", False, [8.0, 8.1, 7.9], [1.1, 1.3])
    verdicts = {v["placed"]: v for v in cache_verdicts([plain, ahead, behind])}
    assert verdicts["plain"]["ok"] and verdicts["ahead"]["ok"]
    assert verdicts["ahead"]["measured_vs_plain_cache"]["ratio"] == pytest.approx(
        np.exp(np.mean(np.log([12.0 / 10.0, 12.1 / 10.2, 12.3 / 9.9]))))  # geometric mean
    assert not verdicts["behind"]["ok"] and len(verdicts["behind"]["messages"]) == 2
    assert all(m.startswith("WARNING: behind C=1") for m in verdicts["behind"]["messages"])
    assert "[1.100, 1.300]" in verdicts["behind"]["messages"][0]


def random_steps(plan, num_steps: int, batch: int, prompts: int, seed: int = 0) -> TokenSteps:
    rng = np.random.default_rng(seed)
    layers, top_k = len(plan.moe_layers), int(plan.model["top_k"])
    tokens = np.stack([[[rng.choice(plan.experts_per_layer, top_k, replace=False)
                         for _ in range(layers)] for _ in range(batch)]
                       for _ in range(num_steps)]).astype(np.int16)
    seqs = np.stack([rng.choice(prompts, batch, replace=False) for _ in range(num_steps)])
    return TokenSteps(tokens, seqs.astype(np.int64))


@pytest.mark.parametrize("batch", [1, 4])
def test_the_prediction_is_evaluates_replay_of_the_same_steps(arms, batch):
    """Without cache slots the bench's prediction is `placer evaluate`'s: the same tokens/s
    and interval from the same steps; cache slots only lower the staging."""
    plan = read_plan(arms[1][0])
    steps = random_steps(plan, 40, batch, prompts=6)
    mine = predict_arm(plan, steps, 6, cache_slots=0, seed=3, replicates=200)
    theirs = replay_with_intervals(plan_problem(plan, [], "stage"),
                                   {"placement": plan_placement(plan, "stage")}, steps,
                                   plan.hardware.base_step_s(batch), 200, 3)
    figures = theirs.figures["placement"]
    assert mine["tokens_per_s"] == pytest.approx(figures["tokens_per_s"], rel=1e-12)
    assert mine["tokens_per_s_ci95"] == pytest.approx(figures["tokens_per_s_ci95"], rel=1e-12)
    assert mine["staged_bytes_per_token"] == pytest.approx(figures["staged_bytes_per_token"])
    lru = replay_with_intervals(plan_problem(plan, [], "stage"),
                                {"placement": plan_placement(plan, "stage"),
                                 **{k: v for k, v in cache_lines(
                                     plan, plan_problem(plan, [], "stage"),
                                     plan_placement(plan, "stage"), 0).items() if k == "lru"}},
                                steps, plan.hardware.base_step_s(batch), 200, 3)
    ratio = lru.ratio("to_lru", "lru")
    assert mine["stall_ratio_to_lru"] == pytest.approx(ratio["to_lru"], rel=1e-12)
    assert mine["stall_ratio_to_lru_ci95"] == pytest.approx(ratio["to_lru_ci95"], rel=1e-12)
    cached = predict_arm(plan, steps, 6, cache_slots=4, seed=3, replicates=200)
    assert cached["staged_bytes_per_token"] < mine["staged_bytes_per_token"]
    assert cached["tokens_per_s"] > mine["tokens_per_s"]


# every policy of the table per layer, and the two whose pooled cache differs most from it
SERVED = [(name, False) for name in POLICY_NAMES] + [("lfru", True), ("learned", True)]


@pytest.fixture(scope="module")
def served(trace_models, tmp_path_factory, cli):
    """A placed directory of the tiny qwen3_moe served by each policy of SERVED: every third
    expert pinned, 1-3 slots per layer and card (placed_plans.cached_plan; learned with its
    weights, calibration and transition in the plan's cache_params)."""
    checkpoint = trace_models["qwen3_moe"]
    root = tmp_path_factory.mktemp("served")
    staging = int(read_inventory(checkpoint).expert_bytes().sum(axis=1).max())
    out = {}
    for policy, pooled in SERVED:
        name = f"{policy}-pooled" if pooled else policy
        (root / name).mkdir()
        cli("emit", "--plan", cached_plan(checkpoint, root / name, policy, staging, pooled),
            "--model", checkpoint, "--out", root / name / "placed")
        out[(policy, pooled)] = root / name / "placed"
    return checkpoint, out


def test_bench_runs_a_placed_directory_served_by_each_policy(served, tmp_path, cli):
    """#51 item 6: bench predicted a learned plan without its weights (a ValueError from the
    replay) and a pooled one per layer; now each arm's prediction runs the plan's caches."""
    checkpoint, placed = served
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n\n".join(PROMPTS) + "\n")
    placed = {k: v for k, v in placed.items() if not k[1]}  # each row per layer
    report = json.loads(cli("bench", *placed.values(), "--model", checkpoint, "--prompts",
                            prompts, "--concurrency", "1", "--trials", "1",
                            "--max-new-tokens", "3", "--device", "cpu", "--json").output)
    rows = report["arms"]
    assert [r["placed"] for r in rows] == [str(p) for p in placed.values()]
    for (policy, pooled), r in zip(placed, rows, strict=True):
        plan = read_plan(r["placed"])
        assert plan.cards[0].cache_policy == policy and plan.cache_params["pooled"] == pooled
        assert r["decode_steps"] > 0 and r["measured_tokens_per_s"] > 0
        assert r["predicted_tokens_per_s"] > 0 and r["predicted_stall_ratio_to_lru"] > 0
        assert r["predicted_staged_bytes_per_token"] > 0  # a third pinned, few slots


@pytest.mark.parametrize(("policy", "pooled"), SERVED)
def test_the_prediction_replays_the_caches_the_runtime_loads_from_the_plan(served, policy,
                                                                         pooled):
    """The bench's predicted staging of a cached plan is what the runtime's own caches
    (plan_caches: the plan's policy, pooled or not, with its cache_params) stage for the same
    steps: the prediction goes through the plan's policy, its weights included."""
    plan = read_plan(served[1][(policy, pooled)])
    steps = random_steps(plan, 60, 1, prompts=6, seed=5)
    predicted = predict_arm(plan, steps, 6, cache_slots=None, seed=3, replicates=50)
    staged = expected_staging(plan, step_mask(steps.tokens, plan.experts_per_layer))
    assert predicted["staged_bytes_per_token"] == pytest.approx(
        staged.bytes.sum() / len(steps), rel=1e-12)
    assert staged.hits.sum() > 0  # the caches hit: the policy mattered
