"""The reference runtime on emitted files: same logits as the original model, and exactly
the staging `placer evaluate` predicts for the same routed tokens."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.dataset as ds
import pytest
import torch
from test_runtime import PROMPTS, original_model, padded_batch

from placer.hardware import parse_spec
from placer.inventory import read_inventory
from placer.plan import build_plan, read_plan, write_json_atomic
from placer.runtime.loader import load_placed
from placer.runtime.lru import expected_staging
from placer.runtime.patch import SelectionRecorder, load_staged_model

pytest_plugins = ["fixtures_models"]

SPEC = parse_spec({"name": "two-links", "host_ram": "1GiB", "cards": 2,
                   "card": {"model": "toy", "vram": "64MiB", "h2d_bandwidth": "1GB/s",
                            "latency_us": 5.0},
                   "link": [{"name": "a", "cards": [0], "bandwidth": "1GB/s"},
                            {"name": "b", "cards": [1], "bandwidth": "1GB/s"}],
                   "decode": {"base_step_ms": {"1": 1.0}}})


def placed_model(model: Path, out: Path, cli) -> Path:
    """Emit a plan with whole, partly resident (paged) and cold experts; its directory."""
    inv = read_inventory(model)
    sizes = inv.expert_bytes()
    page = int(sizes.max()) // 3 + 1
    pages = -(-sizes // page)
    layers, experts = sizes.shape
    resident = np.array([[[pages[i, e], 1, 0][(i + e) % 3] for e in range(experts)]
                         for i in range(layers)])
    home = np.tile(np.arange(experts) * 2 // experts, (layers, 1))
    staging = np.full(2, int(sizes.max()) * experts)
    plan = build_plan(inv, SPEC, home=home, resident_pages=resident, page_size=page,
                      budget_bytes=staging + (1 << 24), staging_bytes=staging,
                      budget={"mode": "budget", "value": None, "concurrency": [4]},
                      ep="contiguous", solver={"name": "test"})
    write_json_atomic(plan.to_json(), out / "plan.json")
    cli("emit", "--plan", out / "plan.json", "--model", model, "--out", out / "placed")
    return out / "placed"


@pytest.mark.parametrize("arch", ["qwen3_moe", "gpt_oss"])
@pytest.mark.parametrize("cache_slots", [0, 3])
def test_logits_and_staging_match(arch, cache_slots, trace_models, tmp_path, cli):
    checkpoint = trace_models[arch]
    placed = placed_model(checkpoint, tmp_path, cli)
    runtime = load_placed(placed, device="cpu", cache_slots=cache_slots)
    staged = load_staged_model(checkpoint, runtime)
    batch = padded_batch(checkpoint)
    with torch.no_grad(), SelectionRecorder(staged) as recorder:
        runtime.counters.reset()
        got = staged(**batch).logits
        got_right = staged(**padded_batch(checkpoint, side="right")).logits
    with torch.no_grad():
        model = original_model(checkpoint)
        assert torch.equal(got, model(**batch).logits)
        assert torch.equal(got_right, model(**padded_batch(checkpoint, side="right")).logits)
    plan = read_plan(placed)
    selected = recorder.selected(plan.moe_layers, plan.experts_per_layer)
    predicted = expected_staging(plan, selected, cache_slots)
    assert runtime.counters.bytes.tolist() == predicted.bytes.sum(axis=0).tolist()
    assert runtime.counters.copies.tolist() == predicted.copies.sum(axis=0).tolist()
    assert runtime.counters.hits.tolist() == predicted.hits.sum(axis=0).tolist()
    assert predicted.bytes.sum() > 0  # the batch really staged something


def test_collect_records_the_selections_the_runtime_staged(trace_models, tmp_path, cli):
    """`placer collect` on the same prompts, in one batch, sees the experts the runtime
    fetched: the per-forward union of its rows equals the recorder's, layer by layer."""
    checkpoint = trace_models["qwen3_moe"]
    placed = placed_model(checkpoint, tmp_path, cli)
    corpus = tmp_path / "prompts.txt"
    corpus.write_text("\n\n".join(PROMPTS) + "\n")
    cli("collect", "--model", checkpoint, "--corpus", corpus, "--out", tmp_path / "traces",
        "--batch-size", str(len(PROMPTS)))
    runtime = load_placed(placed, device="cpu")
    staged = load_staged_model(checkpoint, runtime)
    plan = read_plan(placed)
    with torch.no_grad(), SelectionRecorder(staged) as recorder:
        staged(**padded_batch(checkpoint, side="right"))
    recorded = recorder.selected(plan.moe_layers, plan.experts_per_layer)[0]
    table = ds.dataset(tmp_path / "traces", format="parquet").to_table(
        columns=["layer", "experts"]).to_pydict()
    collected = np.zeros_like(recorded)
    for layer, experts in zip(table["layer"], table["experts"], strict=True):
        collected[plan.moe_layers.index(layer), experts] = True
    assert np.array_equal(collected, recorded)
    predicted = expected_staging(plan, collected[None], 0)
    assert runtime.counters.bytes.sum() == predicted.bytes.sum()


def test_placer_run_prints_text_and_counters(trace_models, tmp_path, cli):
    checkpoint = trace_models["qwen3_moe"]
    placed = placed_model(checkpoint, tmp_path, cli)
    out = json.loads(cli("run", placed, "--model", checkpoint, "--prompt", PROMPTS[0],
                         "--max-new-tokens", "4", "--device", "cpu", "--json").output)
    assert out["new_tokens"] == 4 and out["staging"]["total"]["copies"] > 0
    other = trace_models["olmoe"]
    result = cli("run", placed, "--model", other, "--prompt", "x", ok=False)
    assert result.exit_code == 1 and "placed for model" in result.output
