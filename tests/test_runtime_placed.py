"""The reference runtime on emitted files: same logits as the original model, and exactly
the staging `placer evaluate` predicts for the same routed tokens."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.dataset as ds
import pytest
import torch
from placed_plans import cached_plan, mixed_plan
from test_runtime import PROMPTS, original_model, padded_batch

from placer.checkpoint.inventory import read_inventory
from placer.plan.placement import read_plan
from placer.predict.staging import expected_staging
from placer.runtime.loader import load_placed
from placer.runtime.patch import SelectionRecorder, load_staged_model

pytest_plugins = ["fixtures_models"]

def placed_model(model: Path, out: Path, cli) -> Path:
    """Emit a mixed plan whose staging buffers hold a whole layer; its placed directory."""
    largest_layer = int(read_inventory(model).expert_bytes().sum(axis=1).max())
    plan = mixed_plan(model, out, staging_bytes=largest_layer)
    cli("emit", "--plan", plan, "--model", model, "--out", out / "placed")
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


@pytest.mark.parametrize(("arch", "policy", "pooled"), [
    ("qwen3_moe", "lfru", False), ("gpt_oss", "lru", False), ("qwen3_moe", "lfuda", False),
    ("gpt_oss", "classlru", False), ("qwen3_moe", "learned", False),
    ("gpt_oss", "learned", True), ("qwen3_moe", "classlru", True)])
def test_a_cached_plan_stages_what_its_replay_predicts(arch, policy, pooled, trace_models,
                                                       tmp_path, cli):
    """The runtime takes each card's slots per layer (or pooled), policy and its parameters
    from the manifest; over a batch and then three greedy decode steps its counters equal the
    replay of the same selections, each forward's tokens on the clock, through the same cache
    class, and its logits the original model's."""
    checkpoint = trace_models[arch]
    largest_layer = int(read_inventory(checkpoint).expert_bytes().sum(axis=1).max())
    plan_path = cached_plan(checkpoint, tmp_path, policy, largest_layer, pooled)
    cli("emit", "--plan", plan_path, "--model", checkpoint, "--out", tmp_path / "placed")
    runtime = load_placed(tmp_path / "placed", device="cpu")
    plan = read_plan(tmp_path / "placed")
    assert runtime.cache.name == policy and runtime.cache.pooled == pooled
    assert runtime.cache.quotas.tolist() == [list(c.layer_slots) for c in plan.cards]
    staged = load_staged_model(checkpoint, runtime)
    batch = padded_batch(checkpoint)
    with torch.no_grad(), SelectionRecorder(staged) as recorder:
        got = staged(**batch).logits
        ids = batch["input_ids"][:1]
        for _ in range(3):
            nxt = staged(input_ids=ids).logits[:, -1:].argmax(-1)
            ids = torch.cat([ids, nxt], dim=1)
    with torch.no_grad():
        assert torch.equal(got, original_model(checkpoint)(**batch).logits)
    selected = recorder.selected(plan.moe_layers, plan.experts_per_layer)
    assert recorder.tokens().tolist() == [batch["input_ids"].numel(), *range(
        batch["input_ids"].shape[1], batch["input_ids"].shape[1] + 3)]
    assert runtime.now == recorder.tokens().sum()
    predicted = expected_staging(plan, selected, tokens=recorder.tokens())
    assert runtime.counters.bytes.tolist() == predicted.bytes.sum(axis=0).tolist()
    assert runtime.counters.copies.tolist() == predicted.copies.sum(axis=0).tolist()
    assert runtime.counters.hits.tolist() == predicted.hits.sum(axis=0).tolist()
    assert predicted.hits.sum() > 0 and predicted.copies.sum() > 0


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


def test_fetched_without_tables_a_cached_expert_lives_in_its_stagers_slot(trace_models,
                                                                          tmp_path, cli):
    """Fetched directly (no tables bound), a kept miss goes into its card stager's slots,
    allocated by the first fetch that caches, and a hit comes from there with no copy; both
    give the expert's own bytes."""
    checkpoint = trace_models["qwen3_moe"]
    placed = placed_model(checkpoint, tmp_path, cli)
    runtime = load_placed(placed, device="cpu", cache_slots=8)
    assert [s.slots.numel() for s in runtime.stagers] == [0] * len(runtime.stagers)
    layer, expert = next(key for key, eb in runtime.experts.items() if eb.cold is not None)
    truth = load_placed(placed, device="cpu").fetch(layer, [expert])[0]
    for hits in (0, 1):
        (got,) = runtime.fetch(layer, [expert])
        assert got.keys() == truth.keys() and all(torch.equal(got[n], truth[n]) for n in truth)
        assert (runtime.counters.copies.sum(), runtime.counters.hits.sum()) == (1, hits)
    assert runtime.stagers[runtime.experts[(layer, expert)].card].slots.numel() > 0
