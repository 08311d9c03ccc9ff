"""Property (issue 44 deliverable 8, class 2): random mutations of a valid llama.cpp plan's
`engine` section are refused by the public `check_plan` in one PlacerError line, or pass it
and are then exported by `placer export llamacpp` without a traceback: exit 0 or one line
(run in a child under an address-space limit, tests/hostile_worker.py): whatever export
trusts, the check covers.
Skipped where ../shared/data/routing is absent (the plan is solved from gpt-oss routing)."""

from __future__ import annotations

import copy
import json
import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from real_routing import GPTOSS, routing_trace
from test_hostile_properties import SETTINGS, Worker, clean
from typer.testing import CliRunner

from placer.cli import app
from placer.errors import PlacerError
from placer.plan.check import check_plan

pytestmark = [
    pytest.mark.skipif(not GPTOSS.is_dir(), reason="no ../shared/data/routing"),
]
CASES = int(os.environ.get("PLACER_HOSTILE_CASES", "6"))
JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-2**40, 2**40) | st.sampled_from([2**31, -1, 0])
    | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner,
                                                                max_size=3),
    max_leaves=5)
EDGES = st.sampled_from([0, 0.0, -1, 1, float("nan"), float("inf"), 2**31, 2**62, "x", None])
VALUES = JSON | EDGES | st.lists(EDGES, max_size=3)  # where the engine's numbers break


@pytest.fixture(scope="module")
def worker():
    w = Worker()
    yield w
    w.close()


@pytest.fixture(scope="module")
def llamacpp_plan(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("llplan")
    calib = routing_trace(GPTOSS, "mmlu_dev", root / "calib", 600)
    out = root / "plan.json"
    result = CliRunner().invoke(app, [
        "solve", "--engine", "llamacpp", "--config", str(GPTOSS / "config.json"),
        "--expert-dtype", "mxfp4", "--hardware", "1x-8gb-pcie3x4", "--traces", str(calib),
        "--concurrency", "1,2", "--out", str(out)])
    assert result.exit_code == 0, result.output
    return json.loads(out.read_text())


def paths(value: object, at: tuple = ()) -> list[tuple]:
    """Every path (keys and indices) inside `value`, itself included."""
    found = [at]
    if isinstance(value, dict):
        for k, v in value.items():
            found += paths(v, (*at, k))
    elif isinstance(value, list):
        for i, v in enumerate(value[:4]):
            found += paths(v, (*at, i))
    return found


@settings(SETTINGS, max_examples=CASES)
@given(data=st.data(), new=VALUES, drop=st.booleans())
def test_mutated_engine_sections(worker, llamacpp_plan: dict, data, new: object,
                                 drop: bool) -> None:
    d = copy.deepcopy(llamacpp_plan)
    where = data.draw(st.sampled_from(paths(d["engine"], ("engine",))))
    parent = d
    for key in where[:-1]:
        parent = parent[key]
    if drop and isinstance(parent, dict):
        del parent[where[-1]]
    else:
        parent[where[-1]] = new
    try:
        check_plan(d, "plan.json")
    except PlacerError as exc:
        assert "\n" not in str(exc) and str(exc).startswith("plan.json: ")
        return
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "plan.json"
        path.write_text(json.dumps(d))
        result = worker.run("export", "llamacpp", path)
        clean(result, [where, new])  # exit 0, or one line (not about a field it trusted)
