"""The runtime's per-layer expert tables: resident experts are never copied, layers without a
cold expert run the original forward itself, and logits and staging stay exact on every path
(table rows, spare rows, the compact fallback) and experts implementation."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from placed_plans import cached_plan, resident_plan
from test_runtime import PROMPTS, original_model, padded_batch
from test_runtime_placed import placed_model

from placer.checkpoint.inventory import read_inventory
from placer.plan.placement import read_plan
from placer.predict.staging import expected_staging
from placer.runtime.experts import StagedExperts
from placer.runtime.layouts import ExpertLayout
from placer.runtime.loader import load_placed
from placer.runtime.patch import SelectionRecorder, experts_modules, load_staged_model
from placer.runtime.tables import LayerTable

pytest_plugins = ["fixtures_models"]

NEW_TOKENS = 5


def generate_logits(model, checkpoint: Path, new_tokens: int = NEW_TOKENS
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy tokens and every step's logits for the first prompt (one sequence: decode
    steps select at most top-k experts per layer), `new_tokens` of them."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(checkpoint, local_files_only=True)
    inputs = tokenizer(PROMPTS[0], return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=new_tokens, do_sample=False,
                             pad_token_id=tokenizer.pad_token_id, output_logits=True,
                             return_dict_in_generate=True)
    return out.sequences, torch.stack(out.logits)


def compact_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The number of tokens of every forward of an experts module that took the compact
    path."""
    calls: list[int] = []
    compact = StagedExperts._compact

    def counted(self, hidden_states, *args):
        calls.append(hidden_states.shape[0])
        return compact(self, hidden_states, *args)

    monkeypatch.setattr(StagedExperts, "_compact", counted)
    return calls


def run_and_predict(staged, runtime, checkpoint: Path, placed: Path, slots: int):
    """A padded batch, then one sequence's greedy decode, through `staged` and the original
    model: both must give the same logits; returns the runtime's counters' arrays and the
    prediction for the routed tokens the runtime served."""
    plain = original_model(checkpoint, experts_implementation=staged.config._experts_implementation)
    batch = padded_batch(checkpoint)
    with SelectionRecorder(staged) as recorder:
        runtime.counters.reset()
        with torch.no_grad():
            assert torch.equal(staged(**batch).logits, plain(**batch).logits)
        tokens, logits = generate_logits(staged, checkpoint)
    expected_tokens, expected_logits = generate_logits(plain, checkpoint)
    assert torch.equal(tokens, expected_tokens) and torch.equal(logits, expected_logits)
    plan = read_plan(placed)
    assert runtime.now == recorder.tokens().sum()
    predicted = expected_staging(plan, recorder.selected(plan.moe_layers,
                                                         plan.experts_per_layer), slots,
                                 recorder.tokens())
    counters = runtime.counters
    assert counters.bytes.tolist() == predicted.bytes.sum(axis=0).tolist()
    assert counters.copies.tolist() == predicted.copies.sum(axis=0).tolist()
    assert counters.hits.tolist() == predicted.hits.sum(axis=0).tolist()
    assert (predicted.bytes.sum(axis=(0, 1)) > 0).all()  # both cards staged something


@pytest.mark.parametrize("arch", ["qwen3_moe", "gpt_oss", "mixtral", "deepseek_v3"])
@pytest.mark.parametrize("spare", [0, None])
def test_tables_are_exact_and_stage_what_is_predicted(arch, spare, trace_models, tmp_path,
                                                      cli, monkeypatch):
    """Logits equal the original model's and the per-card counters the prediction, whether a
    decode step's cold experts go to spare rows (top-k of them: one sequence's decode steps
    never take the compact path) or, with no spare row, to the compact path."""
    checkpoint = trace_models[arch]
    placed = placed_model(checkpoint, tmp_path, cli)
    runtime = load_placed(placed, device="cpu", cache_slots=2)
    staged = load_staged_model(checkpoint, runtime, spare_rows=spare)
    calls = compact_calls(monkeypatch)
    run_and_predict(staged, runtime, checkpoint, placed, 2)
    assert (1 in calls) == (spare == 0)  # a one-token forward that took the compact path


@pytest.mark.parametrize(("arch", "policy", "pooled"), [
    ("qwen3_moe", "lfuda", False), ("gpt_oss", "classlru", False), ("qwen3_moe", "learned", True)])
def test_tables_run_every_policy_as_predicted(arch, policy, pooled, trace_models, tmp_path,
                                              cli):
    """The tables (what `placer serve` computes on) under the policies that remember evicted
    experts, per layer and pooled: the original's logits and the replay's counters, prefill
    and decode forwards on the token clock."""
    checkpoint = trace_models[arch]
    largest_layer = int(read_inventory(checkpoint).expert_bytes().sum(axis=1).max())
    cli("emit", "--plan", cached_plan(checkpoint, tmp_path, policy, largest_layer, pooled),
        "--model", checkpoint, "--out", tmp_path / "placed")
    runtime = load_placed(tmp_path / "placed", device="cpu")
    assert runtime.cache.name == policy and runtime.cache.pooled == pooled
    staged = load_staged_model(checkpoint, runtime)
    run_and_predict(staged, runtime, checkpoint, tmp_path / "placed", None)
    assert runtime.counters.hits.sum() > 0


def gathered(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The number of tokens of every table forward whose rows were gathered into expert
    order (computed on a copy rather than on the table itself)."""
    calls: list[int] = []
    route = LayerTable.route

    def counted(self, top_k_index, implementation):
        routed = route(self, top_k_index, implementation)
        if routed is not None and routed[0] is not self.view:
            calls.append(top_k_index.shape[0])
        return routed

    monkeypatch.setattr(LayerTable, "route", counted)
    return calls


@pytest.mark.parametrize("implementation", ["eager", "batched_mm", "grouped_mm"])
def test_every_experts_implementation_is_exact_on_tables(implementation, trace_models,
                                                         tmp_path, cli, monkeypatch):
    """With a spare row for every cold expert nothing takes the compact path; batched_mm
    computes on the table's rows as they lie, grouped_mm gathers them into expert order only
    where an expert is selected twice (never in one sequence's decode), eager wherever rows
    are out of expert order; the logits stay exact."""
    checkpoint = trace_models["gpt_oss"]
    placed = placed_model(checkpoint, tmp_path, cli)
    runtime = load_placed(placed, device="cpu")
    staged = load_staged_model(checkpoint, runtime, spare_rows=8,
                               experts_implementation=implementation)
    calls, gathers = compact_calls(monkeypatch), gathered(monkeypatch)
    run_and_predict(staged, runtime, checkpoint, placed, 0)
    assert calls == []
    assert (gathers == []) == (implementation == "batched_mm")
    assert (1 in gathers) == (implementation == "eager")


def test_all_resident_layers_run_the_original_forward(trace_models, tmp_path, cli,
                                                      monkeypatch):
    """Every expert resident: each layer's forward is the original module's on its table,
    nothing fetched, routed nor copied; the runtime holds the resident bytes once (its
    tensors are views of the table rows)."""
    checkpoint = trace_models["qwen3_moe"]
    cli("emit", "--plan", resident_plan(checkpoint, tmp_path), "--model", checkpoint,
        "--out", tmp_path / "placed")
    runtime = load_placed(tmp_path / "placed", device="cpu")
    staged = load_staged_model(checkpoint, runtime)
    modules = [m for _, m in experts_modules(staged).values()]
    assert all(m.table.identity for m in modules)
    for m in modules:
        storage = m.table.params["gate_up_proj"].untyped_storage().data_ptr()
        for e in range(m.num_experts):
            whole = runtime.experts[(m.layer, e)].whole
            assert whole["gate_proj.weight"].untyped_storage().data_ptr() == storage

    def refuse(*args, **kwargs):
        raise AssertionError("an all-resident layer fetched, routed or rebuilt experts")

    monkeypatch.setattr(runtime, "fetch", refuse)
    monkeypatch.setattr(StagedExperts, "_compact", refuse)
    for m in modules:
        monkeypatch.setattr(m.table, "route", refuse)
    plain = original_model(checkpoint)
    with torch.no_grad():
        assert torch.equal(staged(**padded_batch(checkpoint)).logits,
                           plain(**padded_batch(checkpoint)).logits)
    assert torch.equal(generate_logits(staged, checkpoint)[1],
                       generate_logits(plain, checkpoint)[1])
    assert runtime.counters.fetches.sum() == 0


def test_a_cache_hit_copies_nothing(trace_models, tmp_path, cli, monkeypatch):
    """The tables hold the cache slots as rows (the stagers keep none): a miss the cache
    keeps is staged once and written into its slot's row, even on the compact path, and a
    hit is computed on that row with no copy at all, even with no spare row."""
    checkpoint = trace_models["qwen3_moe"]
    placed = placed_model(checkpoint, tmp_path, cli)
    runtime = load_placed(placed, device="cpu", cache_slots=8)
    staged = load_staged_model(checkpoint, runtime, spare_rows=0)
    assert [s.slots.numel() for s in runtime.stagers] == [0] * len(runtime.stagers)
    table = next(m.table for _, m in experts_modules(staged).values() if m.table.cached)
    expert = int(np.flatnonzero(table.cold_np)[0])
    fills: list[int] = []
    fill = ExpertLayout.fill

    def counted(self, params, row, weights):
        fills.append(row)
        return fill(self, params, row, weights)

    monkeypatch.setattr(ExpertLayout, "fill", counted)
    runtime.counters.reset()
    index = torch.tensor([[expert]])
    assert table.route(index, "eager") is None  # a miss and no spare row: the compact path
    runtime.fetch(table.layer, [expert])  # which stages it, and the cache keeps it
    cached = range(table.resident, table.resident + table.cached)
    assert len(fills) == 1 and fills[0] in cached
    for hits in (1, 2):
        view, rows = table.route(index, "eager")
        assert view is table.view and rows.tolist() == [[fills[0]]] and len(fills) == 1
        assert (runtime.counters.copies.sum(), runtime.counters.hits.sum()) == (1, hits)
    truth = load_placed(placed, device="cpu").fetch(table.layer, [expert])[0]
    row = table.layout.split(table.params, fills[0], table.shapes)
    assert row.keys() == truth.keys() and all(torch.equal(row[n], truth[n]) for n in truth)
