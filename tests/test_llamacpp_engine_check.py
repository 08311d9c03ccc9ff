"""The llama.cpp plan's engine section is checked before export and evaluate use it
(placer/plan/engine_check.py, issue #44 class 2): each hostile edit of a valid two-card plan
is one line naming the field and exit 1 from both commands, never a traceback."""

from __future__ import annotations

import json
import math

import pytest
from llamacpp_tiny import load, two_card_plan
from typer.testing import CliRunner

from placer.cli import app


@pytest.fixture(scope="module")
def valid(tmp_path_factory):
    """(plan JSON, its GGUF, traces) of a two-card plan with host layers and a cached option."""
    plan, model, traces = two_card_plan(tmp_path_factory.mktemp("engine"))
    return load(plan), model, traces


def cached_option(engine: dict) -> int:
    return next(i for i, o in enumerate(engine["options"]) if o["moe_cache_mib"] > 0)


def set_(path: str, value):
    """An edit: set engine field `path` ("a.b" or "options.<cached>.slots") to `value`."""
    def edit(d):
        engine = d["engine"]
        if path.startswith("options."):
            engine["options"][cached_option(engine)][path.split(".")[1]] = value
        else:
            engine[path] = value
    return edit


def drop(key: str):
    def edit(d):
        del d["engine"][key]
    return edit


def drop_option_key(key: str):
    def edit(d):
        del d["engine"]["options"][0][key]
    return edit


def contradict_ncmoe(d):
    host = d["engine"]["host_layers"]
    d["engine"]["n_cpu_moe"] = (max(host) + 2) if host else 3


def wrong_devices(d):
    d["engine"]["devices"] = [1 - x for x in d["engine"]["devices"]]


def wrong_slots(d):
    option = d["engine"]["options"][cached_option(d["engine"])]
    option["slots"] = [n + 1 for n in option["slots"]]


def garbage_calibration(d):
    d["calibration"] = [{"garbage": 1}]


def hidden(value):
    def edit(d):
        d["model"]["hidden_size"] = value
    return edit


CASES = {
    "choice missing": (drop("choice"), "engine: 'choice' is a required property"),
    "n_cpu_moe missing": (drop("n_cpu_moe"), "engine: 'n_cpu_moe' is a required"),
    "option n_cpu_moe missing": (drop_option_key("n_cpu_moe"), "engine.options[0]"),
    "tensor_split zeros": (set_("tensor_split", [0, 0]), "engine.tensor_split"),
    "tensor_split 0,1": (set_("tensor_split", [0, 1]), "engine.devices"),
    "tensor_split nan": (set_("tensor_split", [math.nan, 1.0]), "tensor_split"),
    "tensor_split inf": (set_("tensor_split", [math.inf, 1.0]), "tensor_split"),
    "tensor_split one value": (set_("tensor_split", [1.0]), "engine.tensor_split"),
    "tensor_split string": (set_("tensor_split", ["1", "1"]), "engine.tensor_split"),
    "slots 2**31": (set_("options.slots", [2**31]), "engine.options["),
    "slots 2**40": (set_("slots", [2**40]), "engine.slots"),
    "slots not derived": (wrong_slots, ".slots: expected the slots llama.cpp makes"),
    "devices not derived": (wrong_devices, "engine.devices"),
    "garbage calibration": (garbage_calibration, "calibration[0].counts"),
    "hidden_size words": (hidden("sixty-four"), "model.hidden_size"),
    "hidden_size huge": (hidden(2**40), "model.hidden_size"),
    "n_cpu_moe contradicts host": (contradict_ncmoe, "engine.n_cpu_moe"),
    "n_cpu_moe string": (set_("n_cpu_moe", "4"), "engine.n_cpu_moe"),
    "n_cpu_moe float": (set_("n_cpu_moe", 4.0), "engine.n_cpu_moe"),
    "n_cpu_moe list": (set_("n_cpu_moe", [4]), "engine.n_cpu_moe"),
    "n_cpu_moe negative": (set_("n_cpu_moe", -1), "engine.n_cpu_moe"),
    "n_cpu_moe bool": (set_("n_cpu_moe", True), "engine.n_cpu_moe"),
    "moe_cache_mib string": (set_("moe_cache_mib", "8"), "engine.moe_cache_mib"),
    "moe_cache_mib huge": (set_("moe_cache_mib", 2**50), "engine.moe_cache_mib"),
    "cpu_share above 1": (set_("options.cpu_share", 1.5), "cpu_share"),
    "cpu_share nan": (set_("options.cpu_share", math.nan), "cpu_share"),
    "host layer not MoE": (set_("host_layers", [99]), "engine.host_layers"),
    "host layers twice": (set_("host_layers", [0, 0]), "engine.host_layers"),
    "layouts short": (set_("layouts", []), "engine.layouts"),
    "alignment zero": (set_("alignment", 0), "engine.alignment"),
    "context huge": (set_("context", 2**40), "engine.context"),
    "build not text": (set_("llamacpp_build", {"given": 5}), "engine.llamacpp_build"),
    "options empty": (set_("options", []), "engine.options"),
    "tuner pick unknown": (set_("tuner_pick", "nope"), "engine.tuner_pick"),
}


def test_the_valid_plan_exports_and_evaluates(valid, tmp_path):
    d, model, traces = valid
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(d))
    runner = CliRunner()
    assert runner.invoke(app, ["export", "llamacpp", str(path)]).exit_code == 0
    done = runner.invoke(app, ["evaluate", str(path), "--traces", str(traces), "--json"])
    assert done.exit_code == 0, done.output
    assert d["engine"]["tensor_split"] == [1.0, 1.0] and d["engine"]["host_layers"]
    assert any(o["moe_cache_mib"] for o in d["engine"]["options"])


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_hostile_engine_section_is_one_line_and_exit_1(valid, tmp_path, case):
    d, _, traces = valid
    edit, field = CASES[case]
    bad = json.loads(json.dumps(d))
    edit(bad)
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(bad))
    runner = CliRunner()
    for args in (["export", "llamacpp", str(path)],
                 ["evaluate", str(path), "--traces", str(traces)]):
        done = runner.invoke(app, args)
        assert done.exit_code == 1, (case, args[0], done.output)
        assert not isinstance(done.exception, Exception) or isinstance(done.exception,
                                                                       SystemExit), case
        lines = done.output.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"error: {path}: "), (case, lines)
        assert field in lines[0], (case, lines[0])
