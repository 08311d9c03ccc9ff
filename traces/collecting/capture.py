"""Recording the router's choices: forward pre-hooks on the routed-experts modules.

In transformers 5 every MoE block of the supported architectures (qwen3_moe, mixtral, olmoe,
deepseek_v3, gpt_oss) computes its routing in a router module and then calls

    experts(hidden_states, top_k_index, top_k_weights)

with `hidden_states` flattened to [B*T, H] in row-major (batch, position) order, so row
r = b * T + t; gpt_oss names the arguments `router_indices, routing_weights`. A forward
pre-hook on `...layers.N.<block>.experts` therefore sees the true selection, after any
grouped top-k or bias correction (DeepSeek's `e_score_correction_bias`), with the gate
weights the experts will apply. Shared experts (`shared_experts`) are not routed and are
not hooked.

The hook only copies the two small tensors (on their device, asynchronously); converting
them to numpy happens in `take()`, after the forward pass.
"""

from __future__ import annotations

import inspect
import re
from dataclasses import dataclass

import numpy as np
import torch

from traces.errors import TraceError

EXPERTS_MODULE = re.compile(r"(?:^|\.)layers\.(\d+)\.[A-Za-z_]+\.experts$")


@dataclass(frozen=True)
class Routing:
    """The routing of one forward call: `experts` [L, N, k] int16 and `weights` [L, N, k]
    float32 (or None), for the L hooked MoE layers (sorted) and the N = B*T rows of the call."""

    experts: np.ndarray
    weights: np.ndarray | None


def find_experts_modules(model: torch.nn.Module) -> dict[int, torch.nn.Module]:
    """{decoder layer index: routed-experts module} of `model`, or a TraceError if none."""
    found = {}
    for name, module in model.named_modules():
        match = EXPERTS_MODULE.search(name)
        if match:
            found[int(match.group(1))] = module
    if not found:
        raise TraceError(f"{type(model).__name__} has no routed-experts modules "
                         f"(layers.N.<block>.experts): not an MoE model")
    return dict(sorted(found.items()))


class RouterCapture:
    """Context manager that records every routed-experts call of `model`.

    Usage: `with RouterCapture(model) as cap: model(...); routing = cap.take()`.
    """

    def __init__(self, model: torch.nn.Module, *, weights: bool = True) -> None:
        self.modules = find_experts_modules(model)
        self.layers: tuple[int, ...] = tuple(self.modules)
        self.record_weights = weights
        self._calls: dict[int, list[tuple[torch.Tensor, torch.Tensor | None]]] = {
            layer: [] for layer in self.layers}
        self._handles: list = []

    def __enter__(self) -> RouterCapture:
        for layer, module in self.modules.items():
            self._handles.append(module.register_forward_pre_hook(
                self._hook(self._calls[layer], module), with_kwargs=True))
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _hook(self, calls: list, module: torch.nn.Module):
        names = list(inspect.signature(module.forward).parameters)
        index_name, weight_name = names[1], names[2]
        record_weights = self.record_weights

        def hook(_module, args, kwargs):
            index = args[1] if len(args) > 1 else kwargs[index_name]
            weight = args[2] if len(args) > 2 else kwargs[weight_name]
            calls.append((index.to(torch.int16, copy=True),
                          weight.to(torch.float32, copy=True) if record_weights else None))

        return hook

    def take(self) -> list[Routing]:
        """The routing of every forward call since the last `take()`, in call order."""
        counts = {len(calls) for calls in self._calls.values()}
        if len(counts) != 1:
            raise RuntimeError(f"MoE layers were called unequal numbers of times: {counts}")
        out = []
        for call in range(counts.pop()):
            parts = [self._calls[layer][call] for layer in self.layers]
            experts = torch.stack([p[0].reshape(-1, p[0].shape[-1]) for p in parts])
            weights = (torch.stack([p[1].reshape(-1, p[1].shape[-1]) for p in parts])
                       if self.record_weights else None)
            out.append(Routing(experts.cpu().numpy(),
                               None if weights is None else weights.cpu().numpy()))
        for calls in self._calls.values():
            calls.clear()
        return out
