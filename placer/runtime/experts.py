"""An experts module that takes its weights from a staging runtime at every forward.

`StagedExperts` replaces a transformers experts module (`model.layers.L.mlp.experts`). It
keeps everything of the original except its weight parameters, which are deleted (never
loaded). At each call it asks its source for the experts the router selected, builds the
original module's parameters for just those experts (see `layouts`), renumbers the routing
indices to match, and runs the original class's own forward (whichever experts
implementation the config chose: eager, grouped_mm, batched_mm) on a shallow copy holding the
compact parameters. Same kernels, same operands, same order: the output is bit-identical.

A placed runtime gives each module a table instead (`placer.runtime.tables`): its resident
and cached experts held once in the original layout, so a forward copies neither and, where a
layer has no cold expert, is the original forward itself. The compact path above stays for
other sources and for what a table cannot take.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

import torch
from torch import nn

from placer.runtime.layouts import ExpertLayout, layout_for


class ExpertSource(Protocol):
    """Where routed experts' weights come from (a staging runtime, or tensors in memory)."""

    def tensor_names(self, layer: int) -> tuple[str, ...]:
        """The checkpoint tensor names of each expert of decoder layer `layer`, without the
        `...experts.E.` (or fused `...experts.`) prefix."""
        ...

    def fetch(self, layer: int, experts: Sequence[int]) -> list[Mapping[str, torch.Tensor]]:
        """The weights of `experts` (distinct, ascending) of layer `layer`, one mapping per
        expert from tensor name to the expert's tensor (checkpoint dtype and shape)."""
        ...

    # Optionally `advance(layer, tokens)`: told at each experts module's forward, before any
    # fetch, how many tokens it computes (the placed runtime's token clock, PlacedRuntime).


class ExpertTable(Protocol):
    """A layer's experts held in the original module's layout (`placer.runtime.tables`)."""

    identity: bool       # every expert resident, rows in expert order: no remap
    view: nn.Module      # an original-class instance holding the table

    def route(self, top_k_index: torch.Tensor, implementation: str
              ) -> tuple[nn.Module, torch.Tensor] | None:
        """An original-class instance and the indices it computes `top_k_index` with
        (selected cold experts staged), or None for the compact path."""
        ...


class StagedExperts(nn.Module):
    """Drop-in for the experts module `original` of decoder layer `layer` (see module doc)."""

    def __init__(self, original: nn.Module, layer: int) -> None:
        super().__init__()
        self.layer = layer
        self.num_experts = int(original.num_experts)
        self.param_names = tuple(n for n, _ in original.named_parameters(recurse=False))
        self.weight_dtype = next(original.parameters(recurse=False)).dtype
        for name in self.param_names:
            delattr(original, name)
        # The original's state minus its weights, kept out of this module's tree: transformers
        # must not see (nor initialise) it as an experts module of the model.
        self._original_class = type(original)
        self._original_state = dict(original.__dict__)
        self.source: ExpertSource | None = None
        self.layout: ExpertLayout | None = None
        self.table: ExpertTable | None = None
        # a runtime that prefetches (placer/runtime/prefetch.py): called with the hidden
        # states once this layer's experts are staged; what it returns, once they are queued
        self.ahead: Callable[[torch.Tensor], Callable[[], None]] | None = None

    def attach(self, source: ExpertSource) -> None:
        """Take weights from `source` from now on."""
        self.layout = layout_for(self.param_names, source.tensor_names(self.layer))
        self.source = source
        self.table = None

    def use_table(self, table: ExpertTable) -> None:
        """Compute on `table` (built over the attached source) from now on."""
        self.table = table

    def original_view(self, params: Mapping[str, torch.Tensor], num_experts: int) -> nn.Module:
        """An instance of the original class holding `params` for `num_experts` rows (a
        shallow copy: its forward is the original's, whichever implementation the config
        chooses)."""
        view = object.__new__(self._original_class)
        view.__dict__.update(self._original_state, **params, num_experts=num_experts)
        return view

    def implementation(self) -> str:
        """The experts implementation the model's config chooses (eager when none)."""
        config = self._original_state.get("config")
        return getattr(config, "_experts_implementation", None) or "eager"

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                top_k_weights: torch.Tensor) -> torch.Tensor:
        # a source with a token clock (the placed runtime: its caches' clock) counts the
        # tokens of each forward
        advance = getattr(self.source, "advance", None)
        if advance is not None:
            advance(self.layer, hidden_states.numel() // hidden_states.shape[-1])
        view, index = self._route(hidden_states, top_k_index)
        finish = None if self.ahead is None else self.ahead(hidden_states)
        out = self._original_class.forward(view, hidden_states, index, top_k_weights)
        if finish is not None:
            finish()
        return out

    def _route(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor
               ) -> tuple[nn.Module, torch.Tensor]:
        """The module to compute with and its indices, the selected cold experts staged."""
        table = self.table
        if table is not None:
            if table.identity:
                return table.view, top_k_index
            routed = table.route(top_k_index, self.implementation())
            if routed is not None:
                return routed
        return self._compact(hidden_states, top_k_index)

    def _compact(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor
                 ) -> tuple[nn.Module, torch.Tensor]:
        """The selected experts' rows built afresh, the indices renumbered to them."""
        if self.source is None or self.layout is None:
            raise RuntimeError(f"experts of layer {self.layer} have no weight source attached")
        ids = torch.unique(top_k_index)
        weights = self.source.fetch(self.layer, ids.tolist())
        params = self.layout.assemble(weights, self.weight_dtype, hidden_states.device)
        compact = torch.full((self.num_experts,), -1, dtype=top_k_index.dtype,
                             device=top_k_index.device)
        compact[ids] = torch.arange(ids.numel(), dtype=top_k_index.dtype,
                                    device=top_k_index.device)
        return self.original_view(params, ids.numel()), compact[top_k_index]

    def extra_repr(self) -> str:
        return (f"layer={self.layer}, num_experts={self.num_experts}, "
                f"original={self._original_class.__name__}")
