"""The one table of option rules (issue 44, class 3; traces/options.py): every command's
numeric options are checked by it before the command does any work, whatever code path the
command would take (`solve --engine llamacpp` skipped the placer engine's checks; `traces
split` and `bench` passed a negative --seed to numpy)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from cli_errors import assert_one_line_error
from real_routing import GPTOSS, routing_trace
from typer.testing import CliRunner

from placer.cli import app
from traces.errors import TraceError
from traces.options import AGREE, OVERRIDES, RULES, Rule, check_rules

needs_routing = pytest.mark.skipif(not GPTOSS.is_dir(), reason="no ../shared/data/routing")


def commands() -> dict:
    """{"solve": ..., "traces split": ...}: every leaf command of the real app (typer's own
    copy of click's Command)."""
    found: dict = {}

    def walk(cmd, prefix: str) -> None:
        if hasattr(cmd, "commands"):
            for name, sub in cmd.commands.items():
                walk(sub, f"{prefix} {name}".strip())
        else:
            found[prefix] = cmd
    walk(typer.main.get_command(app), "")
    return found


NUMERIC_TYPES = {"IntParamType": int, "IntRange": int, "FloatParamType": float,
                 "FloatRange": float}


def numeric(param) -> bool:
    """Whether a typer parameter takes an int or a float (or None): its click type."""
    return type(param.type).__name__ in NUMERIC_TYPES


def bad_value(rule: Rule) -> str:
    """A value the rule refuses: below its low end (or at an open one)."""
    low = rule.low if rule.low is not None else 0
    return str(low if rule.open_low else (int(low) - 1 if rule.kind is int else low - 0.5))


def dummy_argv(cmd) -> list[str]:
    """Values for every required parameter of `cmd` (names of files that do not exist):
    enough for click to call the command, whose inputs would all fail later."""
    argv: list[str] = []
    for param in cmd.params:
        if not param.required:
            continue
        value = "1" if numeric(param) else "nowhere"
        if param.param_type_name == "option":
            argv += [param.opts[0], value]
        else:
            argv += [value] * (param.nargs if param.nargs > 0 else 1)
    return argv


def ruled_options() -> list[tuple[str, str, str]]:
    """(command, option flag, parameter name) of every option the table rules."""
    out = []
    for path, cmd in commands().items():
        for param in cmd.params:
            if param.param_type_name == "option" and not param.is_flag and (
                    OVERRIDES.get((path.split()[-1], param.name), RULES.get(param.name))):
                out.append((path, param.opts[0], param.name))
    return out


def test_the_table_covers_the_numeric_options() -> None:
    """Every int or float option of every command is in the table (a new one must be added
    with its rule), and every rule is used by some command."""
    used, missing = set(), []
    for path, cmd in commands().items():
        for param in cmd.params:
            if param.param_type_name != "option" or param.is_flag:
                continue
            if numeric(param):
                (used.add(param.name) if param.name in RULES else missing.append(
                    f"{path} {param.opts[0]}"))
            elif param.name in RULES:
                used.add(param.name)
    assert not missing, missing
    assert set(RULES) <= used, sorted(set(RULES) - used)


@pytest.mark.parametrize(("path", "flag", "name"), ruled_options())
def test_every_ruled_option_is_refused_before_any_work(path: str, flag: str, name: str) -> None:
    """A value out of range is one line naming the option, before the command looks at its
    inputs (here files that do not exist: had it started, it would name them instead)."""
    cmd = commands()[path]
    rule = OVERRIDES.get((path.split()[-1], name)) or RULES[name]
    result = CliRunner().invoke(app, [*path.split(), *dummy_argv(cmd), flag, bad_value(rule)])
    assert_one_line_error(result, flag, "must")
    assert "nowhere" not in result.output


@pytest.mark.parametrize(("values", "needle"), [
    ({"seed": -1}, "--seed must be in 0..2**31-1, got -1"),
    ({"seed": 2**31}, "--seed must be in 0..2**31-1"),
    ({"concurrency": "1,0"}, "--concurrency: every value must be in 1..65536, got 1,0"),
    ({"concurrency": "1,x"}, "--concurrency: expected a comma-separated list"),
    ({"concurrency": (1, 2**20)}, "--concurrency: every value must be in 1..65536"),
    ({"weights": "0,0", "concurrency": "1,8"}, "--weights must not all be 0"),
    ({"weights": "-1,2", "concurrency": "1,8"}, "--weights: every value must be >= 0"),
    ({"weights": "nan,1", "concurrency": "1,8"}, "--weights: every value must be >= 0"),
    ({"weights": "inf,1", "concurrency": "1,8"}, "--weights: every value must be >= 0"),
    ({"weights": "1,2,3", "concurrency": "1,8"},
     "--weights: 3 values for 2 --concurrency values; give one for each"),
    ({"fraction": 1.0}, "--fraction must be in (0, 1), got 1.0"),
    ({"offload": 0.0}, "--offload must be in (0, 1)"),
    ({"time_limit": float("nan")}, "--time-limit must be a positive number, got nan"),
    ({"folds": 1}, "--folds must be >= 2"),
    ({"cache": "-3"}, "--cache must be auto or in 0..16777216, got -3"),
    ({"cache": "lots"}, "--cache must be auto or in 0..16777216, got 'lots'"),
    ({"max_length": 2**32}, "--max-length must be in 1..2**31-1, got 4294967296"),
    ({"port": 70000}, "--port must be in 0..65535"),
    ({"steps": True}, "--steps must be in 1..16777216, got True"),
    ({"steps": 2**24 + 1}, "--steps must be in 1..16777216, got 16777217"),
])
def test_rules_word_what_they_expect(values: dict, needle: str) -> None:
    with pytest.raises(TraceError) as err:
        check_rules(values)
    assert str(err.value).startswith(needle), str(err.value)


def test_values_that_keep_the_rules_pass() -> None:
    check_rules({"seed": 0, "concurrency": "1,8", "weights": "0,2", "fraction": 0.5,
                 "cache": "auto", "max_length": 2**31 - 1, "time_limit": 1e-3, "port": 0,
                 "steps": None, "unknown_option": -5})
    check_rules({"cache_slots": 2**31}, "evaluate")  # evaluate's own bound (OVERRIDES)
    with pytest.raises(TraceError, match="--cache-slots must be in 0..65536"):
        check_rules({"cache_slots": 2**31}, "run")
    assert AGREE == (("weights", "concurrency"),)


def test_a_negative_seed_never_reaches_numpy(tmp_path: Path) -> None:
    """`traces split --seed -1` was numpy's ValueError traceback; `split_traces` itself (the
    library entry point) applies the same table."""
    from traces.storing.split import split_traces

    with pytest.raises(TraceError, match="--seed must be in 0..2\\*\\*31-1, got -1"):
        split_traces(tmp_path / "nowhere", tmp_path / "a", tmp_path / "b", seed=-1)
    result = CliRunner().invoke(app, ["traces", "split", str(tmp_path / "nowhere"), "--out-a",
                                      str(tmp_path / "a"), "--out-b", str(tmp_path / "b"),
                                      "--seed", "-1"])
    assert_one_line_error(result, "--seed must be in 0..2**31-1, got -1")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


@pytest.fixture(scope="module")
def llamacpp_calib(tmp_path_factory) -> Path:
    return routing_trace(GPTOSS, "mmlu_dev", tmp_path_factory.mktemp("calib") / "t", 600)


@needs_routing
@pytest.mark.parametrize(("extra", "needle"), [
    (["--concurrency", "0"], "--concurrency: every value must be in 1..65536, got 0"),
    (["--concurrency", "1,2", "--weights", "1"], "--weights: 1 values for 2 --concurrency"),
    (["--concurrency", "1,2", "--weights", "0,0"], "--weights must not all be 0"),
    (["--concurrency", "1,2", "--weights", "-1,2"], "--weights: every value must be >= 0"),
    (["--concurrency", "1,2", "--weights", "nan,1"], "--weights: every value must be >= 0"),
    (["--seed", "-1"], "--seed must be in 0..2**31-1"),
    (["--steps", "0"], "--steps must be in 1..16777216"),
])
def test_solve_engine_llamacpp_goes_through_the_table(tmp_path: Path, llamacpp_calib: Path,
                                                       extra: list[str], needle: str) -> None:
    """The cases that were an IndexError, a zip() error, a ZeroDivisionError or -1 / NaN
    weights written into plan.json: one line, no plan written."""
    out = tmp_path / "p.json"
    result = CliRunner().invoke(app, [
        "solve", "--engine", "llamacpp", "--config", str(GPTOSS / "config.json"),
        "--expert-dtype", "mxfp4", "--hardware", "1x-8gb-pcie3x4", "--traces",
        str(llamacpp_calib), "--out", str(out), *extra])
    assert_one_line_error(result, needle)
    assert not out.exists()


@needs_routing
def test_solve_engine_llamacpp_with_valid_weights_still_solves(tmp_path: Path,
                                                               llamacpp_calib: Path) -> None:
    out = tmp_path / "p.json"
    result = CliRunner().invoke(app, [
        "solve", "--engine", "llamacpp", "--config", str(GPTOSS / "config.json"),
        "--expert-dtype", "mxfp4", "--hardware", "1x-8gb-pcie3x4", "--traces",
        str(llamacpp_calib), "--out", str(out), "--concurrency", "1,2", "--weights", "0,1"])
    assert result.exit_code == 0, result.output
    assert json.loads(out.read_text())["engine"]["choice"]


def test_output_targets_are_checked_before_any_work(tmp_path: Path) -> None:
    """`solve --out` and `evaluate --plot` under a regular file (or naming a directory) are
    refused before the inputs are even read: a bad path never loses a solve or an
    evaluation (placer.files.check_target)."""
    blocker = tmp_path / "file"
    blocker.write_text("x")
    result = CliRunner().invoke(app, ["solve", "--config", str(tmp_path / "nowhere.json"),
                                      "--hardware", "1x-8gb-pcie3x4", "--out",
                                      str(blocker / "p.json")])
    assert_one_line_error(result, f"--out {blocker / 'p.json'}: {blocker} is not a directory")
    result = CliRunner().invoke(app, ["evaluate", str(tmp_path / "nowhere.json"), "--traces",
                                      str(tmp_path / "traces"), "--plot", str(blocker / "e.png")])
    assert_one_line_error(result, f"--plot {blocker / 'e.png'}: {blocker} is not a directory")
    (tmp_path / "d.png").mkdir()
    result = CliRunner().invoke(app, ["evaluate", str(tmp_path / "nowhere.json"), "--traces",
                                      str(tmp_path / "traces"), "--plot", str(tmp_path / "d.png")])
    assert_one_line_error(result, f"cannot write {tmp_path / 'd.png'}: it is a directory "
                          "(name a file)")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.png", "file"]


def test_check_target_accepts_what_can_be_written(tmp_path: Path) -> None:
    from placer.files import check_target

    check_target(tmp_path / "new" / "deeper" / "p.json")  # parents made at write time
    (tmp_path / "old.json").write_text("{}")
    check_target(tmp_path / "old.json")
    check_target(Path("/dev/null"))
    check_target(tmp_path, directory=True)
    assert not (tmp_path / "new").exists()


@pytest.mark.parametrize("command", ["solve", "evaluate"])
def test_a_trace_directory_given_twice_is_refused(tmp_path: Path, monkeypatch, command: str
                                                  ) -> None:
    """The same --traces directory twice (by another path to it too) counted its sequences
    twice (evaluate's folds went from 4 to 2): one line naming the option, before any work."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tr").mkdir()
    first = ["plan.json"] if command == "evaluate" else ["--model", "m", "--hardware", "h",
                                                         "--out", "p.json"]
    done = CliRunner().invoke(app, [command, *first, "--traces", "tr", "--traces",
                                    str(tmp_path / "tr") + "/"])
    assert_one_line_error(done, f"--traces {tmp_path / 'tr'}: given twice (as tr too)")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tr"]
