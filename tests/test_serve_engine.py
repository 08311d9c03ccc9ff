"""The engines `placer serve` and `placer bench` generate with: continuous batching and the
serial fallback both generate greedily what `model.generate` (`placer run`) does; the decode
steps a bench measures are recorded with their requests and routed experts."""

from __future__ import annotations

import asyncio

import pytest
import torch
from placed_plans import cached_plan
from test_runtime import PROMPTS, original_model
from test_runtime_placed import placed_model

from placer.checkpoint.inventory import read_inventory
from placer.errors import PlacerError
from placer.runtime.placed_model import load_placed_model
from placer.serve import engine as engines
from placer.serve.openai_api import encode_text
from placer.serve.steps import StepRecorder, is_decode

pytest_plugins = ["fixtures_models"]

NEW = 5


@pytest.fixture(scope="module")
def loaded(trace_models, tmp_path_factory, cli):
    checkpoint = trace_models["qwen3_moe"]
    placed = placed_model(checkpoint, tmp_path_factory.mktemp("engine"), cli)
    return load_placed_model(placed, checkpoint, device="cpu")


async def generate_all(engine, prompts: list[list[int]], tokens: int) -> list[list[int]]:
    async def one(i: int, ids: list[int]) -> list[int]:
        updates = [u async for u in engine.generate(ids, tokens, f"t0-p{i}")]
        last = updates[-1]
        assert last.finished and last.error is None
        return last.tokens
    return list(await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts))))


@pytest.mark.parametrize("batching", ["auto", "serial"])
def test_engines_generate_what_model_generate_does(loaded, batching):
    prompts = [encode_text(loaded.tokenizer, p) for p in PROMPTS[:3]]
    expected = [engines.greedy_tokens(loaded.model, p, NEW) for p in prompts]
    engine, reason = engines.start_engine(loaded.model, prompts[0], batching)
    try:
        assert engine.mode == ("continuous" if batching == "auto" else "serial")
        assert (reason is None) == (batching == "auto")
        got = [asyncio.run(generate_all(engine, [p], NEW))[0] for p in prompts]
    finally:
        engine.stop(timeout=30)
    assert got == expected


@pytest.mark.parametrize(("policy", "pooled"), [("classlru", False), ("learned", True)])
def test_the_engine_serves_the_policies_that_remember(policy, pooled, trace_models, tmp_path,
                                                      cli):
    """`placer serve`'s engine on a plan whose caches remember evicted experts (classlru per
    layer, learned pooled with its weights from the manifest): plain transformers' greedy
    tokens, the caches hit, and their token clock counts every forward's tokens."""
    checkpoint = trace_models["qwen3_moe"]
    largest_layer = int(read_inventory(checkpoint).expert_bytes().sum(axis=1).max())
    cli("emit", "--plan", cached_plan(checkpoint, tmp_path, policy, largest_layer, pooled),
        "--model", checkpoint, "--out", tmp_path / "placed")
    loaded = load_placed_model(tmp_path / "placed", checkpoint, device="cpu")
    assert loaded.runtime.cache.name == policy and loaded.runtime.cache.pooled == pooled
    prompts = [encode_text(loaded.tokenizer, p) for p in PROMPTS[:2]]
    plain = original_model(checkpoint)
    expected = [engines.greedy_tokens(plain, p, NEW) for p in prompts]
    engine, _ = engines.start_engine(loaded.model, prompts[0], "auto")
    try:
        got = [asyncio.run(generate_all(engine, [p], NEW))[0] for p in prompts]
    finally:
        engine.stop(timeout=30)
    assert got == expected
    assert loaded.runtime.counters.hits.sum() > 0
    assert loaded.runtime.now >= sum(len(p) + NEW - 1 for p in prompts)


def test_auto_falls_back_to_serial_when_the_probe_disagrees(loaded, monkeypatch):
    monkeypatch.setattr(engines, "probe", lambda *a, **k: "generated [1] where ...")
    prompt = encode_text(loaded.tokenizer, PROMPTS[0])
    engine, reason = engines.start_engine(loaded.model, prompt, "auto")
    engine.stop(timeout=30)
    assert engine.mode == "serial" and "generated [1]" in reason
    with pytest.raises(PlacerError, match="continuous batching cannot serve"):
        engines.start_engine(loaded.model, prompt, "continuous")
    with pytest.raises(PlacerError, match="--batching"):
        engines.start_engine(loaded.model, prompt, "sometimes")


def test_recorder_keeps_the_decode_steps_of_a_batch(loaded):
    prompts = [encode_text(loaded.tokenizer, p) for p in PROMPTS[:3]]
    engine, _ = engines.start_engine(loaded.model, prompts[0], "auto")
    recorder = StepRecorder(loaded.model, engine.batch_request_ids)
    try:
        recorder.recording = True
        outputs = asyncio.run(generate_all(engine, prompts, NEW))
        recorder.recording = False
        asyncio.run(generate_all(engine, prompts[:1], 2))  # not recorded
    finally:
        recorder.close()
        engine.stop(timeout=30)
    full = [s for s in recorder.steps if len(s.experts) == 3]
    assert full and all(s.seconds > 0 for s in recorder.steps)
    layers = len(loaded.runtime.plan.moe_layers)
    assert all(s.experts.shape == (3, layers, 2) for s in full)
    assert all(sorted(s.requests) == ["t0-p0", "t0-p1", "t0-p2"] for s in full)
    # every sequence decodes NEW - 1 tokens after its prefill's: at most that many steps
    assert len(recorder.steps) <= sum(len(o) - 1 for o in outputs)


def test_a_decode_step_is_one_query_token_per_sequence():
    ids = torch.zeros((1, 3), dtype=torch.long)
    assert is_decode((), {"input_ids": ids, "cu_seq_lens_q": torch.tensor([0, 1, 2, 3])})
    assert not is_decode((), {"input_ids": ids, "cu_seq_lens_q": torch.tensor([0, 3])})
    assert is_decode((torch.zeros((4, 1), dtype=torch.long),), {})
    assert not is_decode((ids,), {})
