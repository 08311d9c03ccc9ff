"""Every estimate marked where a number is shown (issue 52, item 2): on a spec from `hardware
new` every tok/s and ms of solve, evaluate, plan, bench and export's comment lines is marked
ESTIMATED with the probe that replaces it, every --json says which figures with their probes,
and with a `[decode] spread` each tok/s carries its step range beside its traffic interval;
on a measured spec (no `estimated`) there is no mark and no range."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from llamacpp_tiny import tiny_gguf, tiny_traces, two_card_spec
from tiny_pipeline import invoke

from placer.checkpoint.tiny import build_tiny_model
from placer.hardware.spec import ESTIMABLE, load_spec
from placer.plan.placement import read_plan

pytest_plugins = ["fixtures_models"]
SPREAD = (0.8, 1.3)
HELD = ("--oracle-time-limit", "1", "--traces")  # then the held-out traffic
STEP = {"figure": "base_step_ms", "probe": ESTIMABLE["base_step_ms"]}


def ok(*args: object):
    result = invoke(*args)
    assert result.exit_code == 0, result.output
    return result


def new_spec(path: Path) -> Path:
    """A spec from `hardware new` (every figure estimated) with the step's spread SPREAD."""
    ok("hardware", "new", "--card", "RTX 3060", "--pcie", "4.0x16", "--ram", "ddr4-3200x2",
       "--out", path)
    fitted = re.sub(r"(?m)^spread = .*\n", "", path.read_text())  # the fit's own spread
    path.write_text(fitted.replace("[decode]\n", f"[decode]\nspread = {list(SPREAD)}\n"))
    return path


@pytest.fixture(scope="module")
def box(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A tiny GGUF, its calibration and held-out traffic, the estimated spec and a measured
    one (two small cards, no `estimated`)."""
    root = tmp_path_factory.mktemp("marks")
    model = tiny_gguf(root)
    return {"root": root, "model": model, "calib": tiny_traces(root, model),
            "held": tiny_traces(root, model, "held", seed=1),
            "estimated": new_spec(root / "box.toml"),
            "measured": two_card_spec(root / "two.toml", 8 << 20), "solved": {}}


def solved(box: dict, spec: str, *extra: object) -> tuple[Path, str]:
    """The plan of `spec` (solved once per module for each `extra`) and what solve printed."""
    out = box["root"] / f"{spec}-{'-'.join(map(str, extra)) or 'placer'}.json"
    if out not in box["solved"]:
        box["solved"][out] = ok(
            "solve", "--model", box["model"], "--hardware", box[spec], "--traces", box["calib"],
            "--concurrency", "1,4", "--out", out,
            *(() if "llamacpp" in extra else ("--offload", "0.5", "--solver", "greedy",
                                               "--cache-policy", "lru")),
            *extra).output
    return out, box["solved"][out]


def assert_step_ranges(figures: list[dict], spec: Path) -> None:
    """Each figure's step range is B / (base x hi + stall), B / (base x lo + stall)."""
    loaded = load_spec(spec)
    for batch, fig in figures:
        base, stall = loaded.base_step_s(batch), fig["stall_ms_per_step"] / 1e3
        assert fig["tokens_per_s_step"] == pytest.approx(
            [batch / (base * SPREAD[1] + stall), batch / (base * SPREAD[0] + stall)], rel=1e-12)
        low, high = fig["tokens_per_s_step"]
        assert low < fig["tokens_per_s"] < high


def headers(text: str) -> str:
    """The header rows of the rich tables in `text` (a narrow column wraps its header)."""
    return "\n".join(line for line in text.splitlines() if "┃" in line)


def cell(figure: dict) -> str:
    """A figure's step range as a table's cell shows it."""
    low, high = figure["tokens_per_s_step"]
    return f"{low:.2f}-{high:.2f}"


def test_solve_marks_its_tok_s_and_gives_each_its_step_range(box) -> None:
    plan, summary = solved(box, "estimated", "--json")
    printed = json.loads(summary)
    assert printed["estimated"] == [{"figure": f, "probe": p} for f, p in ESTIMABLE.items()]
    rows = read_plan(plan).predicted
    assert_step_ranges([(r["concurrency"], r[k]) for r in rows for k in ("placement", "layer")],
                       box["estimated"])
    text = solved(box, "estimated")[1]
    assert "tok/s ESTIMATED" in text and "step estimated: " in text
    assert f"base_step_ms: {ESTIMABLE['base_step_ms']}" in text
    full = plan.with_suffix(".txt").read_text()
    assert "ESTIMATED" in headers(full) and all(cell(r["placement"]) in full for r in rows)
    assert f"ESTIMATED: base_step_ms: {ESTIMABLE['base_step_ms']}" in full
    measured, said = solved(box, "measured")
    assert "ESTIMATED" not in said + measured.with_suffix(".txt").read_text()
    assert "step estimated" not in said
    assert all("tokens_per_s_step" not in r["placement"] for r in read_plan(measured).predicted)


def test_evaluate_marks_its_tables_summary_and_json(box) -> None:
    plan = solved(box, "estimated")[0]
    report = json.loads(ok("evaluate", plan, *HELD, box["held"], "--json").output)
    assert STEP in report["estimated"]
    assert_step_ranges([(r["concurrency"], r[k]) for r in report["results"]
                        for k in ("placement", "layer", "uniform")], box["estimated"])
    summary = ok("evaluate", plan, *HELD, box["held"]).output
    assert "estimate: every tok/s and ms rests on the spec's ESTIMATED" in summary
    tables = ok("evaluate", plan, *HELD, box["held"], "--verbose").output
    assert "ESTIMATED" in headers(tables)
    assert all(cell(r["placement"]) in tables for r in report["results"])
    assert f"ESTIMATED: base_step_ms: {ESTIMABLE['base_step_ms']}" in tables
    measured = solved(box, "measured")[0]
    report = json.loads(ok("evaluate", measured, *HELD, box["held"], "--json").output)
    assert report["estimated"] == []
    assert all("tokens_per_s_step" not in r["placement"] for r in report["results"])
    for extra in ((), ("--verbose",)):
        said = ok("evaluate", measured, *HELD, box["held"], *extra).output
        assert "ESTIMATED" not in said and "step estimated" not in said


def test_a_llamacpp_plan_and_its_export_comment_lines_are_marked(box) -> None:
    plan, summary = solved(box, "estimated", "--engine", "llamacpp")
    assert "tok/s ESTIMATED" in summary and "step estimated: " in summary
    assert_step_ranges([(r["concurrency"], fig) for r in read_plan(plan).predicted
                        for fig in r["options"].values()], box["estimated"])
    comments = [line for line in ok("export", "llamacpp", plan).output.splitlines()
                if line.startswith("#")]
    decode = [line for line in comments if line.startswith("# predicted decode")]
    assert len(decode) == 2 and all("tok/s ESTIMATED (step estimated: " in c for c in decode)
    assert f"# ESTIMATED: base_step_ms: {ESTIMABLE['base_step_ms']}" in comments
    assert STEP in json.loads(ok("export", "llamacpp", plan, "--json").output)["estimated"]
    measured = solved(box, "measured", "--engine", "llamacpp")[0]
    said = ok("export", "llamacpp", measured).output
    assert "# predicted decode" in said and "ESTIMATED" not in said
    assert "step estimated" not in said
    assert json.loads(ok("export", "llamacpp", measured, "--json").output)["estimated"] == []


def test_plan_marks_its_summary_and_json(tmp_path, prose) -> None:
    model = build_tiny_model("qwen3_moe", tmp_path / "model", texts=prose[:200])
    corpus = tmp_path / "prose.jsonl"
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in prose[:8]))
    spec = new_spec(tmp_path / "box.toml")
    common = ["--model", model, "--corpus", corpus, "--hardware", spec, "--offload", 0.5,
              "--solver", "greedy", "--max-length", 16, "--oracle-time-limit", 1,
              "--concurrency", "1", "--cache", "0"]
    printed = json.loads(ok("plan", *common, "--out", tmp_path / "out", "--json").stdout)
    assert STEP in printed["estimated"] and printed["report"]["estimated"] == printed["estimated"]
    said = ok("plan", *common, "--out", tmp_path / "out").output  # resumed: every stage kept
    assert "estimate: every tok/s and ms rests on the spec's ESTIMATED" in said
    assert f"estimate: base_step_ms: {ESTIMABLE['base_step_ms']}" in said


def test_bench_marks_the_predicted_rows(trace_models, tmp_path, cli, capsys) -> None:
    """A placed directory of a plan whose spec has the marks and spread of `hardware new`:
    its predicted rows marked with their step range, --json names the figures (a measured
    spec's bench: test_bench.py)."""
    from placed_plans import layer_plan
    from test_runtime import PROMPTS

    from placer.checkpoint.inventory import read_inventory
    from placer.report.serving import print_bench

    checkpoint = trace_models["qwen3_moe"]
    staging = int(read_inventory(checkpoint).expert_bytes().sum(axis=1).max())
    plan = layer_plan(checkpoint, tmp_path, staging)
    data = json.loads(plan.read_text())  # the plan's own cards, with the marks of hardware new
    estimated = load_spec(new_spec(tmp_path / "box.toml")).to_json()
    data["hardware"] |= {k: estimated[k] for k in ("estimated", "step_spread")}
    plan.write_text(json.dumps(data))
    cli("emit", "--plan", plan, "--model", checkpoint, "--out", tmp_path / "placed")
    prompts = tmp_path / "prompts.txt"
    prompts.write_text(PROMPTS[0] + "\n")
    report = json.loads(cli("bench", tmp_path / "placed", "--model", checkpoint, "--prompts",
                            prompts, "--trials", "1", "--max-new-tokens", "3", "--device",
                            "cpu", "--concurrency", "1", "--json").output)
    assert STEP in report["estimated"]
    arm = report["arms"][0]
    base, stall = arm["predicted_base_step_ms"] / 1e3, arm["predicted_stall_ms_per_step"] / 1e3
    assert arm["predicted_tokens_per_s_step"] == pytest.approx(
        [1 / (base * s + stall) for s in reversed(SPREAD)], rel=1e-12)
    capsys.readouterr()
    print_bench(report)
    table = capsys.readouterr().out
    assert "ESTIMATED" in table.split("┘")[0]  # the predicted row, in the table
    assert cell({"tokens_per_s_step": arm["predicted_tokens_per_s_step"]}) in table
    assert f"ESTIMATED: base_step_ms: {ESTIMABLE['base_step_ms']}" in table


def test_evaluate_flags_marks_each_command_line(box) -> None:
    """`evaluate --flags` on the spec alone: each line's tok/s marked, its step range under the
    table, --json's "estimated"; on a measured spec neither."""
    args = ["evaluate", "--flags", "-ngl 99 -ncmoe 2", "--model", box["model"], "--traces",
            box["held"], "--concurrency", "1", "--hardware"]
    report = json.loads(ok(*args, box["estimated"], "--json").output)
    assert STEP in report["estimated"]
    assert_step_ranges([(r["concurrency"], fig) for r in report["results"]
                        for fig in r["lines"].values()], box["estimated"])
    said = ok(*args, box["estimated"]).output
    assert "ESTIMATED" in headers(said)
    assert all(cell(fig) in said for r in report["results"] for fig in r["lines"].values())
    assert f"ESTIMATED: base_step_ms: {ESTIMABLE['base_step_ms']}" in said
    report = json.loads(ok(*args, box["measured"], "--json").output)
    assert report["estimated"] == [] and "ESTIMATED" not in ok(*args, box["measured"]).output
