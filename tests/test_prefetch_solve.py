"""`placer solve` weighs prefetch (issue #54 item 3): with calibration traces that record
speculative routing it replays the split's candidates with and without prefetch, and the plan's
`prefetch` says whether it pays, with what parameters and why (hand-made routing on the toy
model of test_evaluate, not a model's)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from test_evaluate import CONFIG, EXPERTS, LAYERS, TOP_K  # the same toy model
from test_prefetch_evaluate import BOX, write_trace

from placer.plan.placement import plan_quotas, read_plan
from placer.plan.prefetch import prefetch_link
from placer.report.solve_summary import solve_summary
from solvers.cache.prefetch import Link, Prefetch, replay
from solvers.cache.prefetch_choice import (
    MIN_GAIN,
    MIN_STEPS,
    SHARES,
    Candidate,
    Serving,
    choose_prefetch,
)
from traces.storing.speculative import speculative_steps


def routing(kind: str, seed: int, n: int = 30) -> tuple[np.ndarray, np.ndarray]:
    """[n, L, k] distinct selections, uniform over the experts (a cache misses often), and
    their speculative routing: the selections themselves ("right", recall 1) or drawn apart
    ("random", recall about k / E); -1 on the first MoE layer."""
    rng = np.random.default_rng(seed)

    def draw() -> np.ndarray:
        return np.array([[rng.choice(EXPERTS, TOP_K, replace=False) for _ in LAYERS]
                         for _ in range(n)])

    actual = draw()
    guess = actual.copy() if kind == "right" else draw()
    guess[:, 0] = -1
    return actual, guess


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory, cli) -> dict:
    root = tmp_path_factory.mktemp("prefetch-solve")
    (root / "config.json").write_text(json.dumps(CONFIG))
    (root / "box.toml").write_text(BOX)
    out = {"root": root}
    for run_id, kind in enumerate(("right", "random"), start=1):
        traces = write_trace(root / kind, [routing(kind, 10 * run_id + s) for s in range(8)],
                             run_id, True)
        plan = root / f"{kind}.json"
        result = cli("solve", "--config", root / "config.json", "--hardware",
                     root / "box.toml", "--traces", traces, "--offload", "0.5", "--solver",
                     "greedy", "--out", plan, "--json")
        out[kind] = {"traces": traces, "plan": plan, "json": json.loads(result.output)}
    return out


def test_prefetch_is_on_where_the_prediction_is_the_routing(setup):
    right = setup["right"]
    section = right["json"]["prefetch"]
    assert section["on"] is True, section["reason"]
    p = section["predicted"]
    assert p["recall"] == 1.0
    assert p["with_ms_per_token"] < (1 - MIN_GAIN) * p["best_without_ms_per_token"]
    assert p["best_without_ms_per_token"] <= p["without_ms_per_token"]
    assert section["reason"].startswith("prefetch pays")
    plan = read_plan(right["plan"])
    assert plan.prefetch == section
    assert {c.cache_policy for c in plan.cards} == {"lru"}  # what the replay models
    assert plan.cache_params is None
    # the prediction is the replay of the plan as written: its pins, slots and parameters
    actual, predicted = speculative_steps(right["traces"])
    assert p["tokens"] == p["of_tokens"] == len(actual)
    card = plan.hardware.cards[0]
    expert_bytes = int(plan.matrix("bytes").max())
    link = Link(card.latency_s + expert_bytes / card.h2d_bandwidth,
                plan.hardware.base_step_s(1) / len(LAYERS), expert_bytes)
    counts = replay(actual, predicted, plan_quotas(plan)[0], link,
                    Prefetch(1, None, section["slot_share"]),
                    pinned=plan.matrix("resident_pages") > 0)
    assert counts.stall_s * 1e3 / len(actual) == pytest.approx(p["with_ms_per_token"],
                                                               rel=1e-12)
    assert counts.prefetched > 0
    for text in ("\n".join(solve_summary(plan, right["plan"], None)),
                 right["plan"].with_suffix(".txt").read_text()):  # the summary, the tables
        flat = " ".join(text.split())
        assert f"prefetch: on ({section['reason']})" in flat
        assert (f"stall {p['without_ms_per_token']:.4f} ms/token as the split serves without "
                f"prefetch, {p['best_without_ms_per_token']:.4f} at best without (any "
                f"candidate under LRU); with prefetch {p['with_ms_per_token']:.4f} (slot "
                f"share {section['slot_share']:g})") in flat


def test_prefetch_is_off_with_a_reason_where_the_prediction_is_random(setup):
    section = setup["random"]["json"]["prefetch"]
    assert section["on"] is False
    assert section["reason"].startswith("prefetch does not pay (low recall)")
    p = section["predicted"]
    assert p["recall"] < 0.5
    assert p["with_ms_per_token"] >= (1 - MIN_GAIN) * p["best_without_ms_per_token"]
    plan = read_plan(setup["random"]["plan"])
    cache = setup["random"]["json"]["cache"]
    assert {c.cache_policy for c in plan.cards if c.cache_slots} == {cache["policy"]}
    assert not [n for n in cache["notes"] if n.startswith("prefetch is on")]


def test_one_link_model_for_solve_and_evaluate(setup, cli):
    """evaluate's prefetch section runs with the plan's parameters and the Link solve decided
    with; a plan written before the field reads as prefetch off and evaluates with the
    replay's defaults."""
    right = setup["right"]
    plan = read_plan(right["plan"])
    report = json.loads(cli("evaluate", right["plan"], "--traces", right["traces"],
                            "--json").output)
    [section] = report["prefetch"]
    assert section["params"] == {"depth": 1, "max_per_layer": None,
                                 "slot_share": plan.prefetch["slot_share"]}
    assert section["plan_prefetch"]["on"] is True
    link = prefetch_link(plan.hardware, int(plan.matrix("bytes").max()), len(LAYERS))
    assert section["copy_ms"] == link.copy_s * 1e3 == plan.prefetch["predicted"]["copy_ms"]
    assert section["window_ms"] == plan.prefetch["predicted"]["window_ms"]
    assert section["lines"]["lru+prefetch"]["stall_ms_per_token"] == pytest.approx(
        plan.prefetch["predicted"]["with_ms_per_token"], rel=1e-12)
    text = " ".join(cli("evaluate", right["plan"], "--traces", right["traces"],
                        "--verbose").output.split())
    assert (f"+prefetch lines: slot share {plan.prefetch['slot_share']:g}, every predicted "
            "per layer, depth 1: the plan's (its prefetch is on)") in text

    old = json.loads(right["plan"].read_text())
    del old["prefetch"]
    before = setup["root"] / "before.json"
    before.write_text(json.dumps(old))
    assert read_plan(before).prefetch is None
    report = json.loads(cli("evaluate", before, "--traces", right["traces"], "--json").output)
    [section] = report["prefetch"]
    assert section["plan_prefetch"] is None
    assert section["params"] == {"depth": 1, "max_per_layer": None,
                                 "slot_share": Prefetch().slot_share}
    text = " ".join(cli("evaluate", before, "--traces", right["traces"], "--verbose"
                        ).output.split())
    assert "depth 1: the replay's defaults (the plan records no prefetch)" in text


def test_a_bad_prefetch_field_is_refused_by_name(setup, cli):
    d = json.loads(setup["right"]["plan"].read_text())
    d["prefetch"]["slot_share"] = 1.5
    bad = setup["root"] / "bad.json"
    bad.write_text(json.dumps(d))
    result = cli("evaluate", bad, "--traces", setup["right"]["traces"], ok=False)
    assert result.exit_code != 0
    assert "prefetch.slot_share" in result.output


def test_traces_without_speculative_routing_leave_prefetch_off(tmp_path, cli):
    (tmp_path / "config.json").write_text(json.dumps(CONFIG))
    (tmp_path / "box.toml").write_text(BOX)
    traces = write_trace(tmp_path / "t", [routing("right", s) for s in range(8)], 5, False)
    plan = json.loads(cli("solve", "--config", tmp_path / "config.json", "--hardware",
                          tmp_path / "box.toml", "--traces", traces, "--offload", "0.5",
                          "--solver", "greedy", "--out", tmp_path / "p.json",
                          "--json").output)
    assert plan["prefetch"]["on"] is False
    assert "spec_experts" in plan["prefetch"]["reason"]
    assert plan["prefetch"]["predicted"] is None
    tables = " ".join((tmp_path / "p.txt").read_text().split())
    assert f"prefetch: off ({plan['prefetch']['reason']})" in tables
    summary = solve_summary(read_plan(tmp_path / "p.json"), tmp_path / "p.json", None)
    assert not [line for line in summary if "prefetch" in line]  # nothing was replayed


def _traffic(kind: str) -> list[tuple[np.ndarray, np.ndarray]]:
    return [routing(kind, s, 40) for s in range(3)]


def _candidates() -> list[Candidate]:
    pinned = np.zeros((len(LAYERS), EXPERTS), dtype=bool)
    pinned[:, :4] = True
    return [Candidate("static", np.ones_like(pinned), np.zeros(len(LAYERS), np.int64)),
            Candidate("split", pinned, np.full(len(LAYERS), 4))]


def test_choice_weighs_prefetch_against_the_best_way_without_it():
    link = Link(30e-6, 170e-6, 1)
    on = choose_prefetch(_traffic("right"), _candidates(), 1, link, Serving("lru"))
    assert on.on and on.candidate == 1 and on.prefetch.slot_share > 0
    assert on.without_s == on.best_without_s  # lru both ways: the replays agree
    assert on.with_s < (1 - MIN_GAIN) * on.best_without_s
    # the static candidate has no slots to prefetch into: never replayed with prefetch
    assert {r.candidate for r in on.rows} == {1}
    assert sorted(r.slot_share for r in on.rows) == [0.0, *SHARES]
    random = choose_prefetch(_traffic("random"), _candidates(), 1, link, Serving("lru"))
    assert not random.on and random.prefetch.slot_share > 0  # what it would run with
    assert "low recall" in random.reason and "slow link" not in random.reason


def test_a_slow_link_is_named_where_prefetch_does_not_pay():
    slow = Link(5e-3, 170e-6, 1)
    choice = choose_prefetch(_traffic("random"), _candidates(), 1, slow, Serving("lru"))
    assert not choice.on
    assert "(low recall, slow link)" in choice.reason
    none = choose_prefetch(_traffic("right"), _candidates()[:1], 0, slow, Serving("lru"))
    assert not none.on and none.with_s is None
    assert none.reason == "no candidate has cache slots for prefetched experts"


def test_the_replays_walk_a_bounded_prefix_and_run_each_layout_once():
    """Bounded in time: `work` selections over all replays, at least MIN_STEPS steps of each
    set; a candidate whose layout another has already is not replayed again (same rows)."""
    traffic = [routing("right", s, 300) for s in range(2)]
    twins = [*_candidates(), _candidates()[1]]
    choice = choose_prefetch(traffic, twins, 1, Link(30e-6, 170e-6, 1), Serving("lru"), work=1)
    assert choice.tokens == 2 * MIN_STEPS < 600
    mine = {r.slot_share: r for r in choice.rows if r.candidate == 1}
    twin = {r.slot_share: r for r in choice.rows if r.candidate == 2}
    assert mine.keys() == twin.keys() == {0.0, *SHARES}
    assert all(mine[s].counts is twin[s].counts for s in mine)  # one replay for both
    whole = choose_prefetch(traffic, twins, 1, Link(30e-6, 170e-6, 1), Serving("lru"))
    assert whole.tokens == 600
