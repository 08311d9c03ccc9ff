"""Every plan is checked on read: emit, evaluate and export refuse a bad plan.json with one
line naming the file and the field, write nothing, and never show a traceback."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from placer.errors import PlacerError
from placer.hardware.spec import parse_spec
from placer.plan.format import page_spans
from placer.plan.placement import CardPlan, ExpertPlacement, Page, Plan, plan_from_json

SPEC = parse_spec({"name": "two", "host_ram": "1GiB", "cards": 2,
                   "card": {"model": "toy", "vram": "1MiB", "h2d_bandwidth": "1GB/s",
                            "latency_us": 5.0},
                   "link": [{"name": "a", "cards": [0, 1], "bandwidth": "1GB/s"}],
                   "decode": {"base_step_ms": {"1": 1.0, "8": 2.0}}})
LAYERS, EXPERTS, NBYTES, PAGE = (1, 2), 4, 10_000, 4096


def valid_plan() -> dict:
    """A plan of 2 MoE layers (decoder layers 1, 2) x 4 experts of 3 pages, 2 cards: every
    residency from none to all, homes contiguous."""
    experts = []
    for layer in LAYERS:
        for e in range(EXPERTS):
            resident = (layer + e) % 4
            experts.append(ExpertPlacement(layer, e, e * 2 // EXPERTS, NBYTES, tuple(
                Page(j, o, n, j < resident) for j, (o, n) in enumerate(page_spans(NBYTES, PAGE)))))
    cards = [CardPlan(c, 200_000, 20_000, sum(x.resident_bytes for x in experts if x.card == c),
                      sum(x.bytes for x in experts if x.card == c)) for c in range(2)]
    model = {"fingerprint": "f" * 64, "architecture": "Qwen3MoeForCausalLM",
             "model_type": "qwen3_moe", "num_layers": 3, "moe_layers": list(LAYERS),
             "experts_per_layer": EXPERTS, "top_k": 2, "estimated": False}
    plan = Plan(model, SPEC, {"mode": "offload", "value": 0.5, "concurrency": [1]}, PAGE,
                "contiguous", {"name": "test", "seed": 0, "steps": 16}, cards, experts)
    return json.loads(json.dumps(plan.to_json()))


def _set(path: str, value) -> Callable[[dict], object]:
    def mutate(d: dict) -> dict:
        node = d
        keys = [int(k) if k.lstrip("-").isdigit() else k for k in path.split(".")]
        for k in keys[:-1]:
            node = node[k]
        node[keys[-1]] = value
        return d
    return mutate


def _dup(d: dict) -> dict:
    d["experts"][1] = copy.deepcopy(d["experts"][0])
    return d


def _drop_last(d: dict) -> dict:
    del d["experts"][-1]
    return d


def _swap(d: dict) -> dict:
    d["experts"][0], d["experts"][1] = d["experts"][1], d["experts"][0]
    return d


def _drop_page(d: dict) -> dict:
    del d["experts"][0]["pages"][1]
    return d


def _longer_page(d: dict) -> dict:
    d["experts"][0]["pages"][-1]["length"] += 100
    return d


def _cold_then_resident(d: dict) -> dict:
    d["experts"][2]["pages"][0]["resident"] = False  # experts[2] (layer 1, e 2): all resident
    return d


def _over_vram(d: dict) -> dict:
    d["cards"][0].update(budget_bytes=3 << 20, staging_bytes=2 << 20, capacity_bytes=1 << 20)
    return d


def _over_budget(d: dict) -> dict:
    card = d["cards"][0]
    card["budget_bytes"] = card["staging_bytes"] + card["resident_bytes"] - 1
    card["capacity_bytes"] = card["budget_bytes"] - card["staging_bytes"]
    return d


CASES = {
    "expert listed twice": (_dup, "experts[1]: layer 1 expert 0 is listed twice"),
    "expert missing": (_drop_last, "experts: layer 2 expert 3 is missing"),
    "no experts": (_set("experts", []), "experts: the plan lists no experts"),
    "experts out of order": (_swap, "experts[0]: expected layer 1 expert 0 here"),
    "card out of range": (_set("experts.0.card", 2), "experts[0].card: expected a card index"),
    "expert out of range": (_set("experts.0.expert", 4), "experts[0].expert: expected an expert"),
    "layer out of range": (_set("experts.0.layer", 0), "experts[0].layer: 0 is not a MoE layer"),
    "string for an int": (_set("experts.0.bytes", "10000"), "experts[0].bytes: expected a "
                          "positive byte count, got '10000'"),
    "float for an int": (_set("cards.1.staging_bytes", 20000.0), "cards[1].staging_bytes"),
    "bool for an int": (_set("experts.2.card", True), "experts[2].card"),
    "top-level list": (lambda d: [d], "expected a JSON object (a placer plan), got a list"),
    "null cards": (_set("cards", None), "cards: expected a list, got null"),
    "null model": (_set("model", None), "model: expected an object, got null"),
    "card over its budget": (_over_budget, "cards[0].resident_bytes: card 0 is over its budget"),
    "card over its hardware": (_over_vram, "cards[0].resident_bytes: card 0 is over its VRAM"),
    "card resident bytes": (_set("cards.0.resident_bytes", 1), "cards[0].resident_bytes: 1 but"),
    "card homed bytes": (_set("cards.1.homed_bytes", 7), "cards[1].homed_bytes: 7 but"),
    "expert resident bytes": (_set("experts.0.resident_bytes", 5), "experts[0].resident_bytes"),
    "page longer than the expert": (_longer_page, "experts[0].pages[2].length: page [8192, "
                                    "10100) runs past the end of the expert (10000 bytes)"),
    "pages not tiling": (_drop_page, "experts[0].pages[1].index: expected 1"),
    "page offset": (_set("experts.0.pages.1.offset", 4000), "experts[0].pages[1].offset"),
    "page cut off page_size": (_set("page_size", 8192), "experts[0].pages: pages are not cut by "
                               "page_size 8192"),
    "resident not a prefix": (_cold_then_resident, "experts[2].pages[1].resident: a resident "
                              "page after a cold one"),
    "negative budget": (_set("cards.0.budget_bytes", -1), "cards[0].budget_bytes: expected a "
                        "byte count >= 0, got -1"),
    "negative staging": (_set("cards.0.staging_bytes", -5), "cards[0].staging_bytes"),
    "top_k above experts": (_set("model.top_k", 5), "model.top_k: expected an integer in 1..4"),
    "moe_layers not increasing": (_set("model.moe_layers", [2, 1]), "model.moe_layers"),
    "wrong card count": (_set("cards", []), "cards: 0 cards, but the plan's hardware has 2"),
    "hardware NaN latency": (_set("hardware.cards.0.latency_s", float("nan")),
                             "hardware.cards[0].latency_s: expected a finite number"),
    "hardware no base steps": (_set("hardware.base_step_ms", {}), "hardware.base_step_ms: "
                               "required"),
    "hardware negative RAM": (_set("hardware.host_ram", -1), "hardware.host_ram"),
    "hardware card index": (_set("hardware.cards.1.index", 0), "hardware.cards[1].index"),
    "solver seed": (_set("solver.seed", "x"), "solver.seed: 'x' is not of type 'integer', 'null'"),
    "concurrency": (_set("budget.concurrency", [0]), "budget.concurrency"),
    "calibration counts": (_set("calibration", [{"counts": [[1, 2]]}]),
                           "calibration[0].counts: expected 2 rows of 4 counts"),
    "version": (_set("version", 3), "plan version 3 is not supported"),
}
COMMANDS = ("emit", "evaluate", "export llamacpp")


def test_valid_plan_reads() -> None:
    plan = plan_from_json(valid_plan(), "plan.json")
    assert plan.matrix("resident_pages").tolist() == [[1, 2, 3, 0], [2, 3, 0, 1]]


@pytest.mark.parametrize("case", sorted(CASES), ids=lambda c: c.replace(" ", "-"))
def test_bad_plan_is_one_line(cli, tmp_path: Path, case: str) -> None:
    mutate, needle = CASES[case]
    plan_path = tmp_path / "plan.json"
    plan_path.write_text(json.dumps(mutate(valid_plan())))
    command = COMMANDS[sorted(CASES).index(case) % len(COMMANDS)]
    out = tmp_path / "out"
    args = {"emit": ["emit", "--plan", plan_path, "--model", tmp_path / "model", "--out", out],
            "evaluate": ["evaluate", plan_path, "--traces", tmp_path / "traces",
                         "--plot", out / "e.png"],
            "export llamacpp": ["export", "llamacpp", plan_path, "--out", out]}[command]
    result = cli(*args, ok=False)
    assert result.exit_code == 1, result.output
    assert result.stderr.startswith(f"error: {plan_path}: {needle}"), result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.output
    assert isinstance(result.exception, SystemExit)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.json"]


@pytest.mark.parametrize("content", [b"\xff\xfe\x00garbage", b"{\"format\": ", b"[]", b"null"])
def test_unreadable_plan_is_one_line(cli, tmp_path: Path, content: bytes) -> None:
    plan_path = tmp_path / "plan.json"
    plan_path.write_bytes(content)
    result = cli("export", "llamacpp", plan_path, ok=False)
    assert result.exit_code == 1 and result.stderr.startswith(f"error: {plan_path}: ")
    assert result.stderr.count("\n") == 1 and isinstance(result.exception, SystemExit)


def test_check_plan_names_the_source() -> None:
    d = valid_plan()
    d["experts"][5]["card"] = "1"
    with pytest.raises(PlacerError) as err:
        plan_from_json(d, "placed/manifest.json")
    assert str(err.value) == ("placed/manifest.json: experts[5].card: expected a card index in "
                              "0..1, got '1'")
