"""Every plan section against the shipped schema (issue 44, deliverable 1;
placer/plan/schema/plan.schema.json): the sections check.py only typed as "a list" or "an
object" (predicted, robust, cache, calibration entries) or bounded loosely (solver.seed up to
2**63, solver.steps unbounded, budget.concurrency up to 2**20) are refused in one line naming
the field, before a command allocates anything from them."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import jsonschema
import pytest
from test_plan_check import _set, valid_plan

from placer.errors import PlacerError
from placer.plan.check import check_plan, plan_schema
from placer.plan.placement import read_plan
from traces.options import RULES

CASES = {
    "steps past any run": (_set("solver.steps", 2**62), "solver.steps: 4611686018427387904 is "
                                                         "greater than the maximum of 16777216"),
    "seed past a C int": (_set("solver.seed", 2**40), "solver.seed: 1099511627776 is greater"),
    "concurrency past the rules": (_set("budget.concurrency", [2**19]),
                                   "budget.concurrency[0]: 524288 is greater than the maximum"),
    "negative weights": (_set("budget.weights", [-1.0]), "budget.weights[0]: -1.0 is less"),
    "predicted row of numbers": (_set("predicted", [3]), "predicted[0]: 3 is not of type "
                                                         "'object'"),
    "predicted without its profile": (_set("predicted", [{"concurrency": 1}]),
                                      "predicted[0]: 'profile' is a required property"),
    "robust ratios of text": (_set("robust", {"ratios": {"a": "x"}}),
                              "robust: {'ratios': {'a': 'x'}} is not valid under any"),
    "cache mode unknown": (_set("cache", {"mode": "sometimes"}), "cache: {'mode': 'sometimes'}"),
    "calibration traces not a path": (_set("calibration", [{"traces": 5, "per_token": True}]),
                                      "calibration[0].traces: 5 is not of type 'string'"),
    "execution unknown": (_set("execution", "gpu"), "execution: 'gpu' is not one of"),
    "ep not a string": (_set("ep", 3), "ep: 3 is not of type 'string'"),
}


@pytest.mark.parametrize("case", sorted(CASES), ids=lambda c: c.replace(" ", "-"))
def test_each_section_is_checked_on_read(cli, tmp_path: Path, case: str) -> None:
    mutate, needle = CASES[case]
    d = valid_plan()
    mutate(d)
    with pytest.raises(PlacerError) as err:
        check_plan(d, "plan.json")
    assert str(err.value).startswith(f"plan.json: {needle}"), str(err.value)
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(d))
    result = cli("export", "llamacpp", path, ok=False)
    assert result.exit_code == 1 and result.stderr.count("\n") == 1
    assert result.stderr.startswith(f"error: {path}: {needle}"), result.stderr


def test_the_schema_ships_and_is_valid_draft_2020_12() -> None:
    schema = plan_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    assert schema["properties"]["engine"] == {
        "type": ["object", "null"], "description": schema["properties"]["engine"]["description"]}
    assert read_plan  # the reader every command uses calls check_plan (test_plan_check.py)


def test_the_schema_bounds_are_the_option_rules() -> None:
    """A plan records the options it was solved with: the schema bounds them as the table of
    option rules bounds the options (traces/options.py), so a plan that solve wrote reads back
    and one that no option could have made does not."""
    defs = plan_schema()["$defs"]
    for field, name in (("seed", "seed"), ("steps", "steps")):
        rule, bound = RULES[name], [t for t in defs["solver"]["properties"][field]["type"]]
        assert bound == ["integer", "null"]
        assert (defs["solver"]["properties"][field]["minimum"],
                defs["solver"]["properties"][field]["maximum"]) == (rule.low, rule.high)
    concurrency = defs["budget"]["properties"]["concurrency"]["items"]
    assert (concurrency["minimum"], concurrency["maximum"]) == (RULES["concurrency"].low,
                                                              RULES["concurrency"].high)


def test_a_valid_plan_meets_the_whole_schema() -> None:
    """The schema describes the experts and cards too (their items are walked by check.py's
    own checks for speed): a valid plan meets all of it."""
    jsonschema.validate(valid_plan(), plan_schema())


@pytest.mark.parametrize(("field", "value"), [
    ("experts.0.card", "0"), ("experts.0.bytes", 0), ("experts.0.pages", []),
    ("experts.0.pages.0.resident", 1), ("experts.1.layer", -1), ("cards.0.budget_bytes", -1),
    ("cards.1.cache_slots", 2**40), ("cards.0.cache_policy", "fifo"), ("cards.0.index", "0"),
])
def test_the_item_checks_refuse_what_the_schema_refuses(field: str, value: object) -> None:
    """Where the schema refuses an expert or card item, check.py's item checks (which stand
    in for it at read time) refuse it too."""
    d = valid_plan()
    _set(field, value)(d)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(copy.deepcopy(d), plan_schema())
    with pytest.raises(PlacerError):
        check_plan(d, "plan.json")
