"""`placer solve --cache auto|N|0` end to end on a tiny model: the plan and manifest carry the
split, every card stays within its budget, emit and verify take it, and where no cache can
be predicted auto says why and N is refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest_plugins = ["fixtures_models"]
REPO = Path(__file__).resolve().parent.parent
BOX = REPO / "examples" / "tiny-box.toml"


@pytest.fixture(scope="module")
def solved(tmp_path_factory: pytest.TempPathFactory, trace_models, collected, placer_run):
    root = tmp_path_factory.mktemp("cache-solve")
    model, traces = trace_models["qwen3_moe"], collected[("qwen3_moe", "score")]
    common = ["--model", model, "--hardware", BOX, "--traces", traces, "--offload", "0.5",
              "--concurrency", "1,2", "--solver", "greedy"]
    out = {"model": model, "traces": traces, "root": root, "common": common}
    for name, cache in (("auto", "auto"), ("three", "3"), ("none", "0")):
        out[name] = root / f"{name}.json"
        placer_run("solve", *common, "--cache", cache, "--out", out[name])
    return out


def cards(path: Path) -> list[dict]:
    return json.loads(path.read_text())["cards"]


@pytest.mark.parametrize("name", ["auto", "three", "none"])
def test_every_card_fits_pins_slots_and_staging_in_its_budget(solved, name):
    for c in cards(solved[name]):
        cached = c["cache_slots"] * c["slot_bytes"]
        assert c["resident_bytes"] + cached + c["staging_bytes"] <= c["budget_bytes"]
        assert c["capacity_bytes"] == c["budget_bytes"] - c["staging_bytes"] - cached
        assert sum(c["layer_slots"]) == c["cache_slots"]


def test_auto_splits_and_records_how(solved):
    plan = json.loads(solved["auto"].read_text())
    assert plan["cache"]["mode"] == "auto" and plan["cache"]["policy"] == "lfru"
    assert all(c["cache_slots"] > 0 and c["cache_policy"] == "lfru" for c in plan["cards"])
    assert plan["solver"]["name"] == "split" and plan["solver"]["bound"] is None
    shares = [p["slots_share"] for p in plan["cache"]["curve"]]
    assert shares == sorted(shares) and shares[0] == 0.0
    assert plan["cache"]["slots"] == [c["cache_slots"] for c in plan["cards"]]


def test_a_fixed_count_gives_every_card_that_many_and_zero_none(solved):
    assert [c["cache_slots"] for c in cards(solved["three"])] == [3, 3]
    none = json.loads(solved["none"].read_text())
    assert none["cache"] == {"mode": "off", "reason": "--cache 0"}
    assert all(c["cache_slots"] == 0 and c["cache_policy"] is None for c in none["cards"])


def test_emit_verify_and_the_manifest_carry_the_split(solved, placer_run):
    out = solved["root"] / "placed"
    placer_run("emit", "--plan", solved["auto"], "--model", solved["model"], "--out", out)
    placer_run("verify", out, "--model", solved["model"])
    manifest = json.loads((out / "manifest.json").read_text())
    assert [c["layer_slots"] for c in manifest["cards"]] == [
        c["layer_slots"] for c in cards(solved["auto"])]


def test_where_no_cache_is_predicted_auto_says_why_and_n_is_refused(solved, placer_run):
    plan = solved["root"] / "cpu.json"
    placer_run("solve", *solved["common"], "--execution", "cpu", "--out", plan)
    cache = json.loads(plan.read_text())["cache"]
    assert cache["mode"] == "off" and "--execution cpu" in cache["reason"]
    for extra, said in ((["--execution", "cpu"], "under --execution cpu"),
                        (["--steps", "64"], "in the order served"),
                        (["--page-size", "1KiB"], "--page-size")):
        result = placer_run("solve", *solved["common"], *extra, "--cache", "2", "--out",
                            solved["root"] / "refused.json", ok=False)
        assert result.exit_code == 1, result.output
        assert result.output.startswith("error: --cache 2: ") and said in result.output
        assert len(result.output.strip().splitlines()) == 1
    assert not (solved["root"] / "refused.json").exists()


@pytest.mark.parametrize(("value", "said"), [("abc", "expected auto or a number"),
                                              ("-1", "--cache must be auto or a slot count"),
                                              ("99999999999", "--cache must be auto")])
def test_bad_cache_values_are_one_line(solved, placer_run, value, said):
    result = placer_run("solve", *solved["common"], "--cache", value, "--out",
                        solved["root"] / "bad.json", ok=False)
    assert result.exit_code == 1 and said in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_the_plan_check_refuses_a_cache_that_does_not_fit(solved, placer_run, tmp_path):
    base = json.loads(solved["auto"].read_text())
    card = base["cards"][0]
    cases = [({"layer_slots": [*card["layer_slots"][:-1], card["layer_slots"][-1] + 1]},
              "layer_slots: they sum to"),
             ({"slot_bytes": 1}, "slot_bytes: 1, but card 0 homes an expert"),
             ({"cache_policy": "fifo"}, "cache_policy: expected one of"),
             ({"cache_slots": 0, "layer_slots": []}, "expected null without cache slots"),
             ({"budget_bytes": card["resident_bytes"] + card["staging_bytes"]},
              "over its budget")]
    for change, said in cases:
        plan = json.loads(json.dumps(base))
        plan["cards"][0].update(change)
        plan["cards"][0].pop("capacity_bytes")
        path = tmp_path / "mutated.json"
        path.write_text(json.dumps(plan))
        result = placer_run("evaluate", path, "--traces", solved["traces"], ok=False)
        assert result.exit_code == 1 and said in result.output, (change, result.output)
