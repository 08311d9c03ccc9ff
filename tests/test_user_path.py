"""A new user's path (issue 34): a spec for your own box (`hardware show --toml`, `probe
--step`), bench's intervals, `--model` from the manifest, prefill rows said to be left out,
human units, "bound n/a", tables that fit 100 columns, `placer --version`."""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
from importlib.metadata import version
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from cli_errors import assert_one_line_error
from rich.table import Table
from tiny_pipeline import BOX, Pipeline, build_pipeline, invoke, write_sealed

from placer.checkpoint.inventory import read_inventory
from placer.checkpoint.step import standin_experts
from placer.hardware.spec import Card, Host, load_spec, preset_names
from placer.hardware.spec_toml import spec_toml
from placer.hardware.timing import ExpertTiming
from placer.plan.options import SolveOptions
from placer.plan.solve import solve_plan
from placer.report.figures import TABLE_WIDTH, bytes_plus_minus, print_table
from placer.report.solve import solver_bound
from placer.serve.bench_plot import error_bars
from placer.serve.bench_predict import MIN_TRIALS, t_interval
from traces.collecting.collect import CollectOptions, _Progress


@pytest.fixture(scope="module")
def pipe(tmp_path_factory: pytest.TempPathFactory, prose: list[str]) -> Pipeline:
    return build_pipeline(tmp_path_factory.mktemp("user-path"), prose)


def write(text: str, path: Path) -> Path:
    path.write_text(text)
    return path


@pytest.mark.parametrize("name", [*preset_names(), str(BOX)])
def test_show_toml_loads_back_to_the_same_spec(name, tmp_path):
    result = invoke("hardware", "show", name, "--toml")
    assert result.exit_code == 0, result.output
    assert load_spec(write(result.output, tmp_path / "box.toml")) == load_spec(name)


def test_odd_figures_round_trip_exactly(tmp_path):
    """Cards that differ, sizes and rates in no round unit, times whose decimal does not
    survive the loader's division by 1e6 unless written with care, measured host experts."""
    base = load_spec("8x-rtx5090d-pcie5")
    rng = np.random.default_rng(7)
    cards = tuple(dataclasses.replace(c, vram=int(rng.integers(2**34, 2**35)),
                                      h2d_bandwidth=float(rng.integers(10**9, 10**11)),
                                      latency_s=float(rng.uniform(1e-6, 1e-4)),
                                      model=f'card "{c.index}"')
                  for c in base.cards)
    host = Host(memory_bandwidth=123456789012.0, flops=1.2345e12, sync_s=3.3e-5, sockets=2,
                offload_min_batch=0, expert=(ExpertTiming(2048, 768, "bfloat16", (1, 8, 64),
                                                          (0.0089, 0.0241, 0.1361)),))
    spec = dataclasses.replace(base, cards=cards, host=host,
                               base_step_ms=((1, 9.123456789), (8, 28.1)))
    assert isinstance(spec.cards[0], Card)
    text = spec_toml(spec, "a comment")
    assert load_spec(write(text, tmp_path / "odd.toml")) == spec
    assert "[[cards]]" in text and "# a comment" in text


def test_probe_step_measures_a_tiny_model_into_a_spec(pipe, tmp_path, monkeypatch):
    import placer.checkpoint.step as step

    # at most 16 steps or 2 s a batch (not 64 or 20 s: on a busy box the times never settle
    # and the probe runs to its limit); what is checked does not depend on how many
    monkeypatch.setattr(step, "MAX_STEPS", 16)
    monkeypatch.setattr(step, "STEP_BUDGET_S", 2.0)
    out = tmp_path / "measured.toml"
    result = invoke("probe", "--step", "--model", pipe.model, "--hardware", BOX,
                    "--device", "cpu", "--allow-other-device", "--batch", "1,2", "--out", out,
                    "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    spec = load_spec(out)
    assert not report["estimated"] and "measured on cpu" in report["how"]
    assert [b for b, _ in spec.base_step_ms] == [1, 2]
    assert {str(b): ms for b, ms in spec.base_step_ms} == report["base_step_ms"]
    assert spec.base_step_ms[0][1] > 0 and spec.base_step_ms[1][1] >= spec.base_step_ms[0][1]
    assert dataclasses.replace(spec, base_step_ms=load_spec(BOX).base_step_ms) == load_spec(BOX)
    inv = read_inventory(pipe.model)
    assert f"{standin_experts(inv.config, inv.top_k)} resident experts" in out.read_text()


def test_probe_step_estimate_is_bytes_over_bandwidth_and_says_so(pipe, tmp_path):
    """The bytes a step reads at the fitted share of the bandwidth, plus every layer's fitted
    cost (a card placer does not know: CUDA's fit over every tier). The tiny model's output
    head is its own (lm_head), so a token reads one row of its embedding table."""
    from placer.hardware.backends import fit_for

    fit = fit_for(None, "cuda")
    out = tmp_path / "estimated.toml"
    result = invoke("probe", "--step", "--model", pipe.model, "--hardware", BOX, "--estimate",
                    "--memory-bandwidth", "2GB/s", "--batch", "1,8", "--out", out)
    assert result.exit_code == 0, result.output
    inv = read_inventory(pipe.model)
    sizes = inv.expert_bytes().mean(axis=1)
    e, k = inv.experts_per_layer, inv.top_k
    table = next(t for t in inv.dense_tensors if t.name == "model.embed_tokens.weight")
    assert any(t.name == "lm_head.weight" for t in inv.dense_tensors)
    for b, ms in load_spec(out).base_step_ms:
        dense = inv.dense_bytes - table.length + b * table.length / table.shape[0]
        active = dense + (sizes * e * (1 - (1 - k / e) ** b)).sum()
        assert ms == pytest.approx(1e3 * active / (fit.share * 2e9)
                                   + inv.num_layers * fit.layer_us / 1e3, rel=1e-3)
    assert "ESTIMATED, not measured" in out.read_text()
    assert "ESTIMATED, not measured" in result.output


def test_probe_step_without_a_known_bandwidth_is_one_line(pipe):
    result = invoke("probe", "--step", "--model", pipe.model, "--hardware", BOX, "--estimate")
    assert_one_line_error(result, "--memory-bandwidth")
    result = invoke("probe", "--step", "--model", pipe.model, "--out", "x.toml")
    assert_one_line_error(result, "--hardware")


@pytest.mark.parametrize("values", [[249.36 * 4.1, 249.36 / 4.1], [1.0, 1000.0],
                                    [3.0, 3.1, 2.9], [10.0, 0.01, 5.0, 7.0], [5.0] * 4])
def test_intervals_of_rates_stay_positive_and_hold_their_point(values):
    point, ci = t_interval(values)
    assert point > 0
    if len(values) < MIN_TRIALS:
        assert ci is None
        return
    low, high = ci
    assert 0 < low <= point <= high
    assert point == pytest.approx(math.exp(np.mean(np.log(values))))


def test_bound_nan_reads_na():
    assert solver_bound({"bound": float("nan"), "gap": float("nan")}) == "bound n/a"
    assert solver_bound({"bound": None, "gap": None}) == "bound n/a"
    assert solver_bound({"bound": 2.5, "gap": float("nan")}) == "bound 2.5, gap n/a"
    assert solver_bound({"bound": 2.5, "gap": 0.0123}) == "bound 2.5, gap 1.23%"


def test_cold_bytes_in_human_units():
    figures = {"b": 321065.5 * 1024, "b_ci95": [320000.0 * 1024, 322131.0 * 1024]}
    assert bytes_plus_minus(figures, "b") == "313.54 ± 1.04 MiB"
    assert bytes_plus_minus({"b": 12.0, "b_ci95": None}, "b") == "12.00 ± ? B"


def test_tables_fit_100_columns_and_cut_nothing(capsys):
    table = Table(title="wide")
    for i in range(9):
        table.add_column(f"column {i}")
    long = "/a/very/long/path/" * 6
    table.add_row(long, *[f"{i}.123456 ± 0.000123" for i in range(8)])
    print_table(table)
    out = capsys.readouterr().out
    assert max(map(len, out.splitlines())) <= TABLE_WIDTH
    first = "".join(line.split("│")[1].strip() for line in out.splitlines()
                    if line.startswith("│"))
    assert long in first


def test_version_is_the_package_metadata():
    result = invoke("--version")
    assert result.exit_code == 0 and result.output == f"placer {version('placer')}\n"


def test_model_defaults_to_the_manifests_source(pipe, tmp_path):
    result = invoke("verify", pipe.placed)
    assert result.exit_code == 0 and result.output.startswith("ok: "), result.output
    result = invoke("run", pipe.placed, "--prompt", "To be", "--max-new-tokens", 2,
                    "--device", "cpu", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["new_tokens"] == 2
    moved = tmp_path / "moved"
    shutil.copytree(pipe.model, moved / "model")
    shutil.copytree(pipe.placed, moved / "placed")
    manifest = json.loads((moved / "placed" / "manifest.json").read_text())
    manifest["source"]["dir"] = str(tmp_path / "gone")
    write_sealed(manifest, moved / "placed")
    for args in (["verify", moved / "placed"], ["run", moved / "placed", "--prompt", "x"],
                 ["bench", moved / "placed", "--prompts", BOX],
                 ["serve", moved / "placed"]):
        assert_one_line_error(invoke(*args), "no longer exists: give --model")
    assert invoke("verify", moved / "placed", "--model", moved / "model").exit_code == 0


def test_solve_and_evaluate_say_how_many_prefill_tokens_were_left_out(pipe, tmp_path, prose):
    corpus = write("\n".join(json.dumps({"text": t}) for t in prose[:6]) + "\n",
                   tmp_path / "c.jsonl")
    traces = tmp_path / "gen"
    result = invoke("collect", "--model", pipe.model, "--corpus", corpus, "--mode", "generate",
                    "--max-new-tokens", 4, "--max-length", 12, "--out", traces, "--no-progress",
                    "--json")
    assert result.exit_code == 0, result.output
    stats = json.loads(invoke("traces", "stats", traces, "--json").output)["phases"]
    want = (f"{stats['prefill']:,} prefill tokens of {stats['prefill'] + stats['decode']:,} "
            "left out")
    result = invoke("solve", "--model", pipe.model, "--hardware", BOX, "--traces", traces,
                    "--offload", 0.5, "--solver", "greedy", "--cache", 0, "--out",
                    tmp_path / "plan.json")
    said = " ".join(result.output.split())  # the summary wraps its notes at 100 columns
    assert result.exit_code == 0 and want in said, result.output
    result = invoke("evaluate", pipe.plan, "--traces", traces, "--concurrency", 1, "--json")
    assert any(want in note for note in json.loads(result.output)["notes"]), result.output


def test_solve_tells_its_progress_each_stage_of_the_ilp(pipe):
    stages: list[str] = []
    opts = SolveOptions(solver="ilp", offload=0.5, cache=0, time_limit=5, num_steps=16)
    solve_plan(read_inventory(pipe.model), load_spec(BOX), [pipe.traces], opts, stages.append)
    assert stages[:2] == ["reading traces", "solver ilp"]
    ilp_stages = stages[2:-1]
    assert ilp_stages[0] == "merging patterns" and ilp_stages[-1] == "scoring candidates"
    assert any(s.startswith(("SCIP, ", "PDLP bound, ")) and s.endswith(" s left")
               for s in ilp_stages)
    assert stages[-1] == "predicting on the calibration traffic"


def test_the_collect_bar_ends_at_the_true_total():
    """Generate mode records more tokens than the prompts' budget: the bar's total follows
    the count and ends at what was recorded (it used to end at "9049/8000")."""
    corpus = SimpleNamespace(tag="t", random_tokens=None, num_documents=3)
    progress = _Progress(corpus, CollectOptions(max_tokens=8000, progress=False))
    advance = progress.__enter__()
    advance(2, 5000)
    advance(1, 4049)
    task = progress.bar.tasks[0]
    assert task.completed == 9049 == task.total
    progress.__exit__(None, None, None)
    short = _Progress(corpus, CollectOptions(max_tokens=8000, progress=False))
    short.__enter__()(3, 5000)
    short.__exit__(None, None, None)
    assert short.bar.tasks[0].completed == 5000 == short.bar.tasks[0].total


def test_bench_plot_error_bars_are_never_negative():
    values = np.array([249.36, 10.0, 5.0])
    bars = error_bars(values, [list(t_interval([249.36 * 4.1, 249.36 / 4.1, 249.36])[1]),
                               None, [4.0, 7.5]])
    assert bars.shape == (2, 3) and (bars >= 0).all()
    assert bars[:, 1].tolist() == [0.0, 0.0] and bars[:, 2].tolist() == [1.0, 2.5]
