"""The llama.cpp section of a plan checked like any input (issue #53 item 6,
placer/plan/engine_check.py): every option's cache against the cards' budgets (as the
choice's), non-finite -ts sums refused before any arithmetic, and a bad recorded build named
by its field. Each is one `error: PLAN: engine.FIELD: ...` line, exit 1, from both `export
llamacpp` and `evaluate`, and nothing else printed (no numpy warning)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from llamacpp_tiny import load, two_card_plan
from typer.testing import CliRunner

from placer.cli import app
from solvers.llamacpp.lru import cache_groups, group_slots


@pytest.fixture(scope="module")
def valid(tmp_path_factory):
    """(plan JSON, traces) of a two-card plan (cards of about 2 MiB) with cached options."""
    plan, _, traces = two_card_plan(tmp_path_factory.mktemp("section"))
    return load(plan), traces


def derived_slots(d: dict, option: dict) -> list[int]:
    """The slots llama.cpp makes of the option's moe_cache_mib (what the check derives)."""
    engine, model = d["engine"], d["model"]
    host = [layer in option["host_layers"] for layer in model["moe_layers"]]
    groups = cache_groups([dev if h else -1 for dev, h in zip(engine["devices"], host,
                                                               strict=True)],
                          [(k, tuple(nb2)) for k, nb2 in engine["layouts"]],
                          int(model["experts_per_layer"]))
    split = engine["tensor_split"]
    return group_slots(option["moe_cache_mib"] << 20, groups, int(model["top_k"]),
                       tensor_split=split if split and len(split) > 1 else None,
                       alignment=int(engine["alignment"])).tolist()


def refused(d: dict, traces: Path, tmp_path: Path, *needles: str,
            export: tuple[str, ...] = ()) -> None:
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(d))
    runner = CliRunner()
    for args in (["export", "llamacpp", str(path), *export],
                 ["evaluate", str(path), "--traces", str(traces)]):
        done = runner.invoke(app, args)
        lines = done.output.strip().splitlines()
        assert done.exit_code == 1 and len(lines) == 1, (args[0], done.output)
        assert lines[0].startswith(f"error: {path}: "), lines[0]
        for needle in needles:
            assert needle in lines[0], (args[0], lines[0])


def test_an_options_cache_of_2_40_mib_on_2_mib_cards_is_refused(valid, tmp_path) -> None:
    """The cache the option exports (`--moe-cache-mib 1099511627776`) with the slots that
    many MiB give (derived, so the slot check passes): its budget is checked as the
    choice's is."""
    d, traces = valid
    d = json.loads(json.dumps(d))
    i, option = next((i, o) for i, o in enumerate(d["engine"]["options"])
                     if o["moe_cache_mib"] > 0 and o["name"] != "chosen")
    option["moe_cache_mib"] = 2**40
    option["slots"] = derived_slots(d, option)
    refused(d, traces, tmp_path, f"engine.options[{i}].moe_cache_mib",
            "1099511627776 MiB of cache", "budget", export=("--option", option["name"]))


@pytest.mark.parametrize("split", [[1e308, 1e308], [3e38, 3e38], [1e-300, 1e-300],
                                   [1e300, 0.0]],
                         ids=["1e308", "float32-sum-overflow", "float32-underflow", "1e300"])
def test_tensor_splits_llamacpp_cannot_sum_are_refused_before_arithmetic(valid, tmp_path,
                                                                         split) -> None:
    d, traces = valid
    d = json.loads(json.dumps(d))
    d["engine"]["tensor_split"] = split
    refused(d, traces, tmp_path, "engine.tensor_split", "float32")


def test_a_garbage_build_is_named_by_its_field_not_an_option(valid, tmp_path) -> None:
    d, traces = valid
    d = json.loads(json.dumps(d))
    d["engine"]["llamacpp_build"]["given"] = "garbage!!"
    path = tmp_path / "plan.json"
    refused(d, traces, tmp_path, "engine.llamacpp_build.given", "'garbage!!'")
    done = CliRunner().invoke(app, ["export", "llamacpp", str(path)])
    assert "--llamacpp-version" not in done.output and str(path) in done.output


@pytest.mark.parametrize(("key", "value"), [("number", 99999), ("policy", "lru"),
                                            ("flags", []), ("assumed", False)])
def test_a_recorded_build_field_that_its_given_text_contradicts_is_named(valid, tmp_path, key,
                                                                        value) -> None:
    d, traces = valid
    d = json.loads(json.dumps(d))
    d["engine"]["llamacpp_build"]["given"] = "b12191"
    d["engine"]["llamacpp_build"]["assumed"] = False
    d["engine"]["llamacpp_build"][key] = value
    if key == "assumed":
        d["engine"]["llamacpp_build"]["given"] = ""
    refused(d, traces, tmp_path, f"engine.llamacpp_build.{key}")


def test_the_options_of_a_solved_plan_all_pass(valid, tmp_path) -> None:
    d, traces = valid
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(d))
    runner = CliRunner()
    for option in d["engine"]["options"]:
        done = runner.invoke(app, ["export", "llamacpp", str(path), "--option",
                                   option["name"]])
        assert done.exit_code == 0, (option["name"], done.output)


@pytest.mark.parametrize(("field", "value", "says"), [
    ("expert_flops", 1e308, "model.expert_flops"),
    ("counts", 1e308, "calibration[0].counts"),
    ("counts", 2.0**60, "calibration[0].counts"),
])
def test_numbers_whose_arithmetic_overflows_are_refused(valid, tmp_path, field, value,
                                                       says) -> None:
    """An expert's FLOPs or a calibration count of 1e308 passed as finite, then overflowed
    the replay's and the drift's sums (numpy's warnings, inf in the table)."""
    d, traces = valid
    d = json.loads(json.dumps(d))
    if field == "expert_flops":
        d["model"]["expert_flops"][0][0] = value
    else:
        d["calibration"][0]["counts"][0][0] = value
    refused(d, traces, tmp_path, says)


@pytest.mark.parametrize(("given", "says"), [
    ("b1", "llama.cpp b1 (no expert cache) has no --moe-cache-mib, but engine"),
    ("b11669", "has no --moe-cache-cpu-share, but engine"),
])
def test_a_build_without_the_flags_the_plan_uses_is_named(valid, tmp_path, given,
                                                          says) -> None:
    """The recorded build must have what the choice and the options use: a cache, a CPU
    share (evaluate --llamacpp-version still replays any build on purpose)."""
    d, traces = valid
    d = json.loads(json.dumps(d))
    d["engine"]["llamacpp_build"] = {"given": given}
    refused(d, traces, tmp_path, "engine.llamacpp_build", says)


@pytest.mark.parametrize("version", ["b1", "b11669"])
def test_plans_solved_for_older_builds_pass_their_own_check(tmp_path, version) -> None:
    plan, _, traces = two_card_plan(tmp_path, "--llamacpp-version", version)
    runner = CliRunner()
    for option in load(plan)["engine"]["options"]:
        done = runner.invoke(app, ["export", "llamacpp", str(plan), "--option", option["name"]])
        assert done.exit_code == 0, (option["name"], done.output)
    done = runner.invoke(app, ["evaluate", str(plan), "--traces", str(traces)])
    assert done.exit_code == 0, done.output
