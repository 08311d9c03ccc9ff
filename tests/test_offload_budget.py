"""`solve --offload X` on a tiny model: pinned experts and cache slots together hold at most
1 - X of each card's homed expert bytes, the staging reserve for the largest --concurrency
stays staging, and every baseline (evaluate's, export llamacpp's layer offload) is judged at
the very expert VRAM the placement gets."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from placer.plan.placement import read_plan
from placer.predict.evaluate import plan_problem
from solvers.problem import Steps
from solvers.staging import staging_bytes
from solvers.static import baselines

pytest_plugins = ["fixtures_models"]
BOX = Path(__file__).resolve().parent.parent / "examples" / "tiny-box.toml"
OFFLOAD = 0.3


@pytest.fixture(scope="module")
def plans(tmp_path_factory: pytest.TempPathFactory, trace_models, collected, placer_run
          ) -> dict[str, Path]:
    """The auto split, and 6 slots per card (2 per layer: slots the old rule let double as
    staging), at --offload 0.3 on the 2-card tiny box (each card homes 4 experts a layer)."""
    root = tmp_path_factory.mktemp("offload-budget")
    out = {}
    for name in ("auto", "6"):
        out[name] = root / f"{name}.json"
        placer_run("solve", "--model", trace_models["qwen3_moe"], "--hardware", BOX, "--traces",
                   collected[("qwen3_moe", "score")], "--offload", OFFLOAD, "--concurrency",
                   "1,8", "--cache", name, "--out", out[name])
    return out


@pytest.fixture(scope="module")
def plan_path(plans: dict[str, Path]) -> Path:
    return plans["6"]


def test_pins_and_slots_hold_at_most_the_share_not_offloaded(plan_path: Path) -> None:
    raw = json.loads(plan_path.read_text())
    plan = read_plan(plan_path)
    assert all(c["cache_slots"] == 6 for c in raw["cards"])
    reserve = staging_bytes(plan.matrix("bytes"), plan.matrix("card"), len(plan.cards), 8,
                            int(plan.model["top_k"]))
    for c, want in zip(raw["cards"], reserve, strict=True):
        held = c["resident_bytes"] + c["cache_slots"] * c["slot_bytes"]
        assert held <= (1 - OFFLOAD) * c["homed_bytes"], c
        assert c["staging_bytes"] == int(want)  # the B=8 reserve, not spent on slots
        assert c["budget_bytes"] == int((1 - OFFLOAD) * c["homed_bytes"]) + int(want)


def test_no_candidate_of_the_auto_split_holds_more_than_the_share(plans: dict[str, Path]
                                                                 ) -> None:
    """Whichever candidate auto chooses, none of those it judged (the plain cache and the
    slot-heavy splits included) holds more experts in VRAM than (1 - X) of the homed."""
    raw = json.loads(plans["auto"].read_text())
    unit = read_plan(plans["auto"]).matrix("bytes").max()
    most = sum(int((1 - OFFLOAD) * c["homed_bytes"]) // unit for c in raw["cards"])
    held = [c["pinned"] + c["slots"] for c in raw["cache"]["candidates"]]
    assert max(held) == most and any(c["slots"] for c in raw["cache"]["candidates"])


def test_the_baselines_get_the_placements_expert_vram(plan_path: Path) -> None:
    plan = read_plan(plan_path)
    placement = [c.budget_bytes - c.staging_bytes for c in plan.cards]  # pins + slots
    assert plan_problem(plan, []).capacity.tolist() == placement


def test_export_offloads_the_layers_evaluate_replays_as_layer_offload(plan_path: Path,
                                                                      cli) -> None:
    plan = read_plan(plan_path)
    text = cli("export", "llamacpp", plan_path).output
    found = re.search(r"layer offload at this plan's budget: (\d+) of (\d+) MoE layers cold",
                      text)
    dummy = np.zeros((1, len(plan.moe_layers), plan.experts_per_layer), dtype=bool)
    pages = baselines.layer_offload(plan_problem(plan, [Steps("x", 1, dummy)])).placement
    cold = sum(1 for row in pages.resident_pages if not row.any())
    assert found is not None, text
    assert (int(found[1]), int(found[2])) == (cold, len(plan.moe_layers))
    assert 0 < cold < len(plan.moe_layers)  # a layer count the budget decides
