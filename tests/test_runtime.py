"""The reference staging runtime: staged experts compute bit-identical logits, and what the
runtime stages equals what the cost model predicts for the same routed tokens."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from placer.checkpoint.inventory import FUSED, PER_EXPERT
from placer.runtime.experts import StagedExperts
from placer.runtime.patch import SelectionRecorder, experts_modules, load_staged_model

pytest_plugins = ["fixtures_models"]  # trace_models: tiny checkpoints that run (deepseek too)

PROMPTS = ["To be, or not to be, that is the question:",
           "Now is the winter of our discontent",
           "O Romeo, Romeo! wherefore art thou Romeo? Deny thy father and refuse thy name",
           "All the world's a stage"]


class CheckpointSource:
    """Every routed expert's tensors, read from the checkpoint into memory (an ExpertSource)."""

    def __init__(self, checkpoint: Path) -> None:
        self.experts: dict[int, dict[int, dict[str, torch.Tensor]]] = {}
        for name, tensor in load_file(checkpoint / "model.safetensors").items():
            if m := PER_EXPERT.search(name):
                parts = {int(m["expert"]): tensor}
            elif m := FUSED.search(name):
                parts = dict(enumerate(tensor))
            else:
                continue
            for e, t in parts.items():
                self.experts.setdefault(int(m["layer"]), {}).setdefault(e, {})[m["rest"]] = t
        self.fetched: list[tuple[int, list[int]]] = []

    def tensor_names(self, layer: int) -> tuple[str, ...]:
        return tuple(self.experts[layer][0])

    def fetch(self, layer: int, experts: Sequence[int]) -> list[Mapping[str, torch.Tensor]]:
        self.fetched.append((layer, list(experts)))
        return [self.experts[layer][e] for e in experts]


def padded_batch(checkpoint: Path, side: str = "left") -> dict[str, torch.Tensor]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(checkpoint, local_files_only=True)
    tokenizer.padding_side = side
    return dict(tokenizer(PROMPTS, return_tensors="pt", padding=True))


def original_model(checkpoint: Path, **kwargs):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(checkpoint, local_files_only=True,
                                                **kwargs).eval()


@pytest.mark.parametrize("arch", ["qwen3_moe", "deepseek_v3", "mixtral", "gpt_oss"])
def test_staged_experts_logits_equal_original(arch, trace_models):
    checkpoint = trace_models[arch]
    batch = padded_batch(checkpoint)
    assert (batch["attention_mask"] == 0).any()  # the batch is padded
    source = CheckpointSource(checkpoint)
    staged = load_staged_model(checkpoint, source)
    assert experts_modules(staged) and all(
        isinstance(m, StagedExperts) and not list(m.parameters())
        for _, m in experts_modules(staged).values())
    with torch.no_grad():
        expected = original_model(checkpoint)(**batch).logits
        got = staged(**batch).logits
    assert torch.equal(got, expected)
    assert {layer for layer, _ in source.fetched} == set(experts_modules(staged))


@pytest.mark.parametrize("implementation", ["eager", "batched_mm"])
def test_every_experts_implementation_is_exact(implementation, trace_models):
    checkpoint = trace_models["gpt_oss"]
    batch = padded_batch(checkpoint, side="right")
    staged = load_staged_model(checkpoint, CheckpointSource(checkpoint),
                               experts_implementation=implementation)
    with torch.no_grad():
        expected = original_model(checkpoint, experts_implementation=implementation)(**batch)
        assert torch.equal(staged(**batch).logits, expected.logits)


def test_recorder_sees_what_the_runtime_fetches(trace_models):
    checkpoint = trace_models["qwen3_moe"]
    source = CheckpointSource(checkpoint)
    staged = load_staged_model(checkpoint, source)
    with SelectionRecorder(staged) as recorder, torch.no_grad():
        staged(**padded_batch(checkpoint))
        staged(**padded_batch(checkpoint, side="right"))
    layers = sorted(experts_modules(staged))
    selected = recorder.selected(layers, 8)
    assert selected.shape == (2, len(layers), 8)
    fetched = [sorted(e) for _, e in source.fetched]
    assert fetched == [list(selected[s, i].nonzero()[0]) for s in range(2)
                       for i in range(len(layers))]
