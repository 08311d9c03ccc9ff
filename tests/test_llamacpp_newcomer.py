"""What a new llama.cpp user met (issue #41, "the newcomer defects") and the build-aware
export: each test failed before its fix. Tiny GGUF plans (tests/llamacpp_tiny.py)."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
from llamacpp_tiny import load, one_card, solve, tiny_gguf, tiny_traces
from typer.testing import CliRunner

from placer.cli import app

README = Path(__file__).resolve().parent.parent / "README.md"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(root, GGUF, traces, a one-card plan with host layers)."""
    root = tmp_path_factory.mktemp("newcomer")
    model = tiny_gguf(root)
    traces = tiny_traces(root, model)
    plan, _ = solve(root, model, traces, one_card(root, 2.5))
    return root, model, traces, plan


def run(*args) -> tuple[int, str]:
    done = CliRunner().invoke(app, [str(a) for a in args])
    return done.exit_code, done.output


def last_line(output: str) -> str:
    return output.strip().splitlines()[-1]


def test_quickstart_5b_sends_llamacpp_users_to_solve_engine_llamacpp():
    text = README.read_text()
    block = text[text.index("<!-- quickstart"):]
    block = block[:block.index("```", block.index("```sh") + 5)]
    step = block[block.index("# 5b."):]
    assert "solve --engine llamacpp" in step
    assert "placer export llamacpp plan.json" not in step  # whole-layer offload, not a plan


def test_everything_fits_is_the_ngl_all_command_and_exit_0(tiny, tmp_path):
    root, model, traces, _ = tiny
    code, output = run("solve", "--engine", "llamacpp", "--model", model, "--hardware",
                       one_card(tmp_path, 10), "--traces", traces, "--out", tmp_path / "p.json")
    assert code == 0, output
    engine = load(tmp_path / "p.json")["engine"]
    assert engine["host_layers"] == [] and engine["moe_cache_mib"] == 0
    code, output = run("export", "llamacpp", tmp_path / "p.json")
    assert code == 0, output
    assert re.fullmatch(rf"llama-server -m {re.escape(str(model))} -ngl all( -c \d+)?",
                        last_line(output))


def test_a_budget_beyond_the_card_is_said_in_mib_or_gib(tiny, tmp_path):
    root, model, traces, _ = tiny
    code, output = run("solve", "--engine", "llamacpp", "--model", model, "--hardware",
                       one_card(tmp_path, 2), "--traces", traces, "--budget", "3GiB",
                       "--out", tmp_path / "p.json")
    assert code == 1 and "3.00 GiB" in output and "MiB" in output, output
    assert not re.search(r"\d{7,}", output)  # no raw byte counts


def test_export_model_is_the_plans_gguf_or_checked_against_its_fingerprint(tiny, tmp_path):
    root, model, traces, plan = tiny
    code, output = run("export", "llamacpp", plan)
    assert code == 0 and last_line(output).startswith(f"llama-server -m {model} ")
    other = tiny_gguf(tmp_path, "other.gguf", seed=1, types=(
        *[__import__("gguf").GGMLQuantizationType.Q8_0] * 3,))
    code, output = run("export", "llamacpp", plan, "--model", other)
    assert code == 1 and "fingerprint" in output and len(output.strip().splitlines()) == 1
    code, output = run("export", "llamacpp", plan, "--model", tmp_path / "x.safetensors")
    assert code == 1 and ".gguf" in output
    code, output = run("export", "llamacpp", plan, "--model", model)
    assert code == 0 and f"-m {model} " in last_line(output)


def test_export_devices_are_honoured_or_refused(tiny):
    _, _, _, plan = tiny
    code, output = run("export", "llamacpp", plan, "--devices", "Vulkan0")
    assert code == 0 and " -dev Vulkan0 -ngl all" in last_line(output)
    for bad in ("Vulkan0,Vulkan1", "CPU", ","):
        code, output = run("export", "llamacpp", plan, "--devices", bad)
        assert code == 1 and output.startswith("error: --devices"), (bad, output)


def test_export_option_prints_any_option_and_names_the_build(tiny):
    _, model, _, plan = tiny
    engine = load(plan)["engine"]
    names = [o["name"] for o in engine["options"]]
    assert "ncmoe" in names and any(n.startswith("tuner ") for n in names)
    for option in engine["options"]:
        code, output = run("export", "llamacpp", plan, "--option", option["name"],
                           "--llamacpp-version", "b12170")
        assert code == 0, output
        line = last_line(output)
        assert ("--moe-cache-mib" in line) == (option["moe_cache_mib"] > 0)
        assert ("--moe-cache-cpu-share" in line) == (option.get("cpu_share", 0) > 0)
        assert "# predicted for llama.cpp b12170 (ClassLRU cache, CPU share)" in output
    code, output = run("export", "llamacpp", plan, "--option", "nope")
    assert code == 1 and "no option 'nope'" in output
    # the names hold commas ("tuner 1 MiB, share 0"): each is quoted, the list unambiguous
    listed = output.split("its options: ", 1)[1].strip()
    assert listed == ", ".join(repr(n) for n in names), listed


def test_the_solve_tables_fit_100_columns(tiny, tmp_path):
    """`solve --engine llamacpp --verbose` and the plan.txt beside the plan: every table line
    at most 100 columns (docs/cli.md), a long cell wrapped, nothing cut."""
    root, model, traces, _ = tiny
    plan, output = solve(root, model, traces, one_card(root, 2.5), "--verbose",
                         out="wide.json")
    for text in (output, plan.with_suffix(".txt").read_text()):
        rows = [line for line in text.splitlines() if line[:1] in "┏┃┡│└"]
        assert rows and max(map(len, rows)) <= 100, max(map(len, rows))
        assert "…" not in text and any("ncmoe" in row for row in rows)  # folded, not cut


def test_export_refuses_a_flag_the_named_build_lacks(tiny):
    _, _, _, plan = tiny
    engine = load(plan)["engine"]
    cached = next(o["name"] for o in engine["options"] if o["moe_cache_mib"])
    shared = next(o["name"] for o in engine["options"] if o.get("cpu_share"))
    code, output = run("export", "llamacpp", plan, "--option", cached, "--llamacpp-version",
                       "b11000")
    assert code == 1 and "--moe-cache-mib" in output and "b11000" in output
    code, output = run("export", "llamacpp", plan, "--option", shared, "--llamacpp-version",
                       "version: 0.9.0 (build 11669, commit 0123abc)")
    assert code == 1 and "--moe-cache-cpu-share" in output and "b11669" in output
    code, output = run("export", "llamacpp", plan, "--llamacpp-version", "latest")
    assert code == 1 and output.startswith("error: --llamacpp-version")


def test_solve_records_the_build_and_a_build_without_the_cache_plans_none(tiny, tmp_path):
    root, model, traces, plan = tiny
    assert load(plan)["engine"]["llamacpp_build"]["assumed"] is True
    out, output = solve(tmp_path, model, traces, one_card(tmp_path, 2.5),
                        "--llamacpp-version", "b11000")
    engine = load(out)["engine"]
    assert engine["llamacpp_build"]["given"] == "b11000"
    assert all(o["moe_cache_mib"] == 0 for o in engine["options"])
    assert "llama.cpp b11000 (no expert cache)" in output
    out, _ = solve(tmp_path, model, traces, one_card(tmp_path, 2.5), "--llamacpp-version",
                   "b11669", out="lru.json")
    engine = load(out)["engine"]
    assert all(o.get("cpu_share", 0) == 0 for o in engine["options"])
    assert any(o["moe_cache_mib"] for o in engine["options"])


def test_evaluate_replays_the_plans_build_or_the_one_given(tiny):
    _, _, traces, plan = tiny
    code, output = run("evaluate", plan, "--traces", traces)
    assert code == 0 and "replayed as llama.cpp b12191 (ClassLRU" in output, output
    code, output = run("evaluate", plan, "--traces", traces, "--llamacpp-version", "b11669")
    assert code == 0 and "replayed as llama.cpp b11669 (LRU cache)" in output, output
    code, output = run("evaluate", plan, "--traces", traces, "--llamacpp-version", "b")
    assert code == 1 and output.startswith("error: --llamacpp-version")


@pytest.mark.parametrize(("args", "message"), [
    (["--concurrency", "0"], "--concurrency"),
    (["--concurrency", "1,4", "--weights", "1,2,3"], "--weights"),
    (["--concurrency", "1,4", "--weights", "0,0"], "--weights"),
    (["--concurrency", "1,4", "--weights", "-1,2"], "--weights"),
    (["--concurrency", "1,4", "--weights", f"{math.nan},1"], "--weights"),
    (["--seed", "-1"], "--seed"),
    (["--llamacpp-version", "b12x"], "--llamacpp-version"),
])
def test_solve_engine_llamacpp_checks_its_options_like_the_placer_engine(tiny, tmp_path, args,
                                                                         message):
    _, model, traces, _ = tiny
    code, output = run("solve", "--engine", "llamacpp", "--model", model, "--hardware",
                       one_card(tmp_path, 2), "--traces", traces, "--out", tmp_path / "p.json",
                       *args)
    assert code == 1 and message in output and len(output.strip().splitlines()) == 1, output
    assert not (tmp_path / "p.json").exists()
