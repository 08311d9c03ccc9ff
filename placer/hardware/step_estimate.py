"""The decode step a spec's box is estimated to take on a model, from the spec alone: the one
path of `hardware new --model` and `probe --step` where it estimates (--estimate, a GGUF, a
model too big to run here), so both write the same step for the same spec and model.

The inputs, all from the spec's first card (placer/checkpoint/step.py estimate_steps does
the rest): the step fit of its model on its backend (placer/hardware/backends.py); the
bandwidth and dense bf16 FLOP/s placer/hardware/cards.py publishes for its model, or on the
cpu backend the host's (`[host] memory_bandwidth` is what a stream reaches, so it is divided
by the fit's share, the streaming share, to stand for the peak the fit scales; `[host]
flops`); and one sequence's KV cache at the spec's `[context]` (none counted without one).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from placer.errors import PlacerError
from placer.hardware.backends import UNKNOWN, fit_for
from placer.hardware.cards import card

if TYPE_CHECKING:
    from placer.checkpoint.experts import Inventory
    from placer.checkpoint.step import StepFit, StepTimes
    from placer.hardware.spec import HardwareSpec


def spec_steps(inv: Inventory, spec: HardwareSpec | None, batches: tuple[int, ...],
               source: str, bandwidth: float | None = None) -> StepTimes:
    """The estimated step of `inv` at `batches` on `spec`'s box (module docstring; `source`
    says what asked for it); `bandwidth` (bytes/s, --memory-bandwidth) in place of the
    card's, its FLOP/s then not counted."""
    from placer.checkpoint.kv import kv_bytes
    from placer.checkpoint.step import estimate_steps

    fit = spec_fit(spec)
    flops = None
    if bandwidth is None:
        bandwidth, flops = spec_inputs(spec, fit)
    context = spec.context if spec is not None else None
    kv = 0 if context is None else kv_bytes(inv.config, context.tokens, context.kv_type,
                                            parallel=1)
    return estimate_steps(inv, bandwidth, batches, source, fit, flops=flops, kv_bytes=kv)


def spec_fit(spec: HardwareSpec | None) -> StepFit:
    """The step fit for the spec's first card on its backend (placer/hardware/backends.py):
    its tier's where the table knows the card, else the backend's over every tier; no spec,
    CUDA's."""
    if spec is None:
        return fit_for(None, UNKNOWN).step_fit()
    return fit_for(card(spec.cards[0].model), spec.cards[0].backend).step_fit()


def spec_inputs(spec: HardwareSpec | None, fit: StepFit) -> tuple[float, float | None]:
    """(bytes/s, FLOP/s or None: compute not counted) the step on `spec`'s first card reads
    and computes at (module docstring); a PlacerError where the spec's card is not one placer
    knows (or there is no spec)."""
    first = spec.cards[0] if spec is not None else None
    if spec is not None and first.backend == "cpu" and spec.host is not None:
        return spec.host.memory_bandwidth / fit.share, spec.host.flops
    known = card(first.model) if first is not None else None
    if known is None:
        named = f"card {first.model!r}" if first is not None else "card (no --hardware)"
        raise PlacerError(f"--step: cannot run the model here and the {named} has no known "
                          "memory bandwidth: give --memory-bandwidth, e.g. 1008GB/s")
    return known.bandwidth, None if known.bf16_tflops is None else known.bf16_tflops * 1e12
