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

Speculative routing (`speculative=True`): a forward pre-hook on each MoE layer's router
module (the block's `gate`, gpt_oss's `router`) sees the input of that MoE block, the
residual stream after the layer's attention through its post-attention norm: the hidden state
that exists when the layer's experts start computing, so a copy issued then for the next MoE
layer overlaps them (and the next layer's attention). The hook applies the next MoE layer's
router module to it, through the router's own `forward` (its top-k, softmax or sigmoid,
normalisation, DeepSeek's grouped top-k and correction bias; no hooks fire), and keeps the
selected experts in descending router-score order. This is FATE's cross-layer gate (arXiv
2502.12224: the previous layer's gate input fed to the next layer's gate), with depth 1.

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
from traces.storing.schema import NO_PREDICTION

EXPERTS_MODULE = re.compile(r"(?:^|\.)layers\.(\d+)\.[A-Za-z_]+\.experts$")


@dataclass(frozen=True)
class Routing:
    """The routing of one forward call: `experts` [L, N, k] int16 and `weights` [L, N, k]
    float32 (or None), for the L hooked MoE layers (sorted) and the N = B*T rows of the call;
    `speculative` [L, N, k] int16 (or None): row i holds what MoE layer i's router selects on
    MoE layer i-1's block input, best first (row 0: NO_PREDICTION)."""

    experts: np.ndarray
    weights: np.ndarray | None
    speculative: np.ndarray | None = None


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


def find_routers(model: torch.nn.Module,
                 experts: dict[int, torch.nn.Module]) -> dict[int, torch.nn.Module]:
    """{decoder layer index: the router module beside its experts module} (the block's
    `router` or `gate`), or a TraceError naming the layer whose block has neither."""
    names = {module: name for name, module in model.named_modules()}
    routers = {}
    for layer, module in experts.items():
        block = model.get_submodule(names[module].rpartition(".")[0])
        router = getattr(block, "router", None) or getattr(block, "gate", None)
        if not isinstance(router, torch.nn.Module):
            raise TraceError(f"layer {layer}'s MoE block {type(block).__name__} has no router "
                             "module (router or gate): cannot record speculative routing")
        routers[layer] = router
    return routers


def speculative_selection(router: torch.nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    """The experts `router` selects for the rows of `hidden` [..., H], as [N, k] int16 in
    descending router-score order: the router's own forward (no hooks), so its top-k,
    normalisation and grouping are the model's."""
    rows = hidden.reshape(-1, hidden.shape[-1]).to(next(router.parameters()).device)
    _, scores, indices = router.forward(rows)
    order = torch.argsort(scores, dim=-1, descending=True, stable=True)
    return indices.gather(-1, order).to(torch.int16)


class RouterCapture:
    """Context manager that records every routed-experts call of `model`.

    Usage: `with RouterCapture(model) as cap: model(...); routing = cap.take()`.
    """

    def __init__(self, model: torch.nn.Module, *, weights: bool = True,
                 speculative: bool = False) -> None:
        self.modules = find_experts_modules(model)
        self.layers: tuple[int, ...] = tuple(self.modules)
        self.record_weights = weights
        self.routers = find_routers(model, self.modules) if speculative else None
        self._calls: dict[int, list[tuple[torch.Tensor, torch.Tensor | None]]] = {
            layer: [] for layer in self.layers}
        self._spec: dict[int, list[torch.Tensor]] = {layer: [] for layer in self.layers[1:]}
        self._handles: list = []

    def __enter__(self) -> RouterCapture:
        for layer, module in self.modules.items():
            self._handles.append(module.register_forward_pre_hook(
                self._hook(self._calls[layer], module), with_kwargs=True))
        if self.routers is not None:
            for here, ahead in zip(self.layers, self.layers[1:], strict=False):
                self._handles.append(self.routers[here].register_forward_pre_hook(
                    self._spec_hook(self._spec[ahead], self.routers[ahead])))
        return self

    @staticmethod
    def _spec_hook(calls: list, ahead: torch.nn.Module):
        def hook(_module, args):
            calls.append(speculative_selection(ahead, args[0]))

        return hook

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
        spec = self._spec.values() if self.routers is not None else ()
        counts = {len(calls) for calls in (*self._calls.values(), *spec)}
        if len(counts) != 1:
            raise RuntimeError(f"MoE layers were called unequal numbers of times: {counts}")
        out = []
        for call in range(counts.pop()):
            parts = [self._calls[layer][call] for layer in self.layers]
            experts = torch.stack([p[0].reshape(-1, p[0].shape[-1]) for p in parts])
            weights = (torch.stack([p[1].reshape(-1, p[1].shape[-1]) for p in parts])
                       if self.record_weights else None)
            out.append(Routing(experts.cpu().numpy(),
                               None if weights is None else weights.cpu().numpy(),
                               self._speculative(call, experts.shape)))
        for calls in (*self._calls.values(), *self._spec.values()):
            calls.clear()
        return out

    def _speculative(self, call: int, shape: torch.Size) -> np.ndarray | None:
        """[L, N, k] int16 of forward call `call`: NO_PREDICTION for the first MoE layer."""
        if self.routers is None:
            return None
        out = np.full(tuple(shape), NO_PREDICTION, dtype=np.int16)
        for i, layer in enumerate(self.layers[1:], start=1):
            out[i] = self._spec[layer][call].cpu().numpy()
        return out
