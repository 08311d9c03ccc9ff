"""The decode step with every expert resident (a spec's `[decode] base_step_ms`), measured
on a stand-in of the model, or estimated from memory bandwidth where it cannot run.

Measured (`measure_steps`): the model is built from its config.json with random weights and
each MoE layer holding only as many experts as a token selects (top-k; for DeepSeek's
grouped routing, enough for its groups), each of the real expert's shape. Every selection
then hits a resident expert, so a decode step computes what the real model computes when
everything is resident (attention, dense layers, the top-k experts of every token), without
the memory of the experts no token of this step selects: a model that does not fit the card
can be timed. At batch B > 1 the stand-in reads at most top-k experts per layer where the
real model reads up to B x top-k distinct ones: at large B on a memory-bound card it
under-states the step (the estimate below counts them). Weights are in the config's
torch_dtype (a quantized config, fp8 or mxfp4, runs in bfloat16: torch's kernels, not the
engine's). Each batch: a prompt of `context` tokens prefilled, then `steps` decode steps
timed after `warmup`, median, device synchronised.

Estimated (`estimate_steps`): decode is bound by reading the weights, so a step at batch B
takes (dense bytes + per MoE layer the expected distinct experts selected, E x (1 - (1 -
k/E)^B) under independent routing, x an expert's bytes) / memory bandwidth. It ignores
compute, attention's KV reads and launch overheads: a floor, marked estimated.
"""

from __future__ import annotations

import math
import os
import statistics
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from placer.checkpoint.config import EXPERT_COUNT_KEYS
from placer.errors import PlacerError

if TYPE_CHECKING:
    from placer.checkpoint.inventory import Inventory

DEFAULT_CONTEXT = 64
DEFAULT_STEPS = 8
WARMUP = 2
MEMORY_MARGIN = 0.7  # of the device's free memory the stand-in may take
QUANTIZED_AS = "bfloat16"


@dataclass(frozen=True)
class StepTimes:
    """Decode step ms by batch, and how they were obtained."""

    base_step_ms: tuple[tuple[int, float], ...]  # (batch, ms) ascending
    estimated: bool
    how: str  # one line: what was timed on which device, or the estimate's inputs


def standin_experts(config: dict, top_k: int) -> int:
    """Experts per MoE layer of the stand-in: top-k, or for grouped routing (n_group groups,
    topk_group chosen, each scored by its best two) enough per group for both."""
    groups = config.get("n_group") or 1
    if groups <= 1:
        return top_k
    per_group = max(2, math.ceil(top_k / (config.get("topk_group") or 1)))
    return groups * per_group


def standin_bytes(inv: Inventory) -> int:
    """Bytes of the stand-in's weights: the dense tensors and its experts."""
    sizes = inv.expert_bytes()
    experts = standin_experts(inv.config, inv.top_k)
    return int(inv.dense_bytes + sizes.max(axis=1).sum() * experts)


def estimate_steps(inv: Inventory, memory_bandwidth: float, batches: tuple[int, ...],
                   source: str) -> StepTimes:
    """The bandwidth floor of the step at each batch (see module docstring)."""
    sizes = inv.expert_bytes().astype(float)
    experts, k = inv.experts_per_layer, inv.top_k
    points = []
    for b in batches:
        distinct = experts * (1.0 - (1.0 - k / experts) ** b)
        active = inv.dense_bytes + float((sizes.mean(axis=1) * distinct).sum())
        points.append((b, significant(1e3 * active / memory_bandwidth)))
    per_token = inv.dense_bytes + float(sizes.mean(axis=1).sum() * k)
    return StepTimes(tuple(points), True,
                     f"estimated ({source}): {per_token / 1e9:.3g} GB of weights read "
                     f"per token at {memory_bandwidth / 1e9:.0f} GB/s (a floor: no compute, "
                     "no KV cache)")


def free_memory(device: str) -> int:
    """Bytes free on the torch `device` (host RAM available for cpu)."""
    import torch

    if device.startswith("cuda"):
        free, _ = torch.cuda.mem_get_info(torch.device(device))
        return int(free)
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def fits(inv: Inventory, device: str) -> bool:
    """Whether the stand-in fits `device`'s free memory with a margin."""
    return standin_bytes(inv) <= MEMORY_MARGIN * free_memory(device)


def measure_steps(inv: Inventory, device: str, batches: tuple[int, ...],
                  context: int = DEFAULT_CONTEXT, steps: int = DEFAULT_STEPS,
                  seed: int = 0) -> StepTimes:
    """Time the stand-in's decode step at each batch on `device` (see module docstring)."""
    import torch

    model, dtype = standin_model(inv.config, inv.top_k, device, seed)
    vocab = int(inv.config.get("vocab_size") or 32000)
    generator = torch.Generator().manual_seed(seed)
    points = []
    with torch.inference_mode():
        for b in batches:
            prompt = torch.randint(vocab, (b, context), generator=generator).to(device)
            out = model(input_ids=prompt, use_cache=True)
            cache, token = out.cache, out.logits[:, -1:].argmax(-1)
            times = []
            for i in range(WARMUP + steps):
                sync(device)
                start = time.perf_counter()
                out = model(input_ids=token, cache=cache, use_cache=True)
                sync(device)
                if i >= WARMUP:
                    times.append(time.perf_counter() - start)
                cache, token = out.cache, out.logits[:, -1:].argmax(-1)
            points.append((b, 1e3 * statistics.median(times)))
    experts = standin_experts(inv.config, inv.top_k)
    ms = tuple((b, significant(max(t, 1e-6))) for b, t in sorted(points))
    return StepTimes(monotone(ms), False,
                     f"measured on {device}: the model with {experts} resident expert"
                     f"{'s' if experts > 1 else ''} of its shape per MoE layer ({dtype}), a "
                     f"{context}-token prompt, median of {steps} decode steps")


def significant(ms: float) -> float:
    """`ms` to 4 significant digits: what a spec is worth writing (timings vary more)."""
    return float(f"{ms:.4g}")


def monotone(points: Iterable[tuple[int, float]]) -> tuple[tuple[int, float], ...]:
    """Step times never falling with the batch (a spec requires it; a fall is noise)."""
    out, top = [], 0.0
    for b, ms in points:
        top = max(top, ms)
        out.append((b, top))
    return tuple(out)


def standin_model(config: dict, top_k: int, device: str, seed: int):
    """The stand-in (random weights, eval mode) on `device`, and its dtype's name."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    data = {k: v for k, v in config.items() if k not in ("quantization_config", "model_type")}
    dtype = data.get("torch_dtype") or data.get("dtype") or QUANTIZED_AS
    if "quantization_config" in config or dtype not in ("bfloat16", "float16", "float32"):
        dtype = QUANTIZED_AS
    experts = standin_experts(config, top_k)
    for key in EXPERT_COUNT_KEYS:
        if data.get(key):
            data[key] = experts
    try:
        hf = AutoConfig.for_model(config.get("model_type"), **data)
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(hf, dtype=getattr(torch, dtype))
    except (ValueError, KeyError, TypeError) as exc:
        raise PlacerError(f"config.json: transformers cannot build model_type "
                          f"{config.get('model_type')!r} to time it ({exc}); give "
                          "--memory-bandwidth to estimate the step instead") from None
    return model.to(device).eval(), dtype


def sync(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize(torch.device(device))
