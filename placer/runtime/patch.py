"""Load a Hugging Face MoE model whose routed experts come from a staging runtime.

`load_staged_model` loads the checkpoint with a subclass of its causal-LM class whose
`__init__` swaps every routed experts module (`model.layers.L.mlp.experts`; Mixtral's
`block_sparse_moe` is renamed `mlp` on load) for a `StagedExperts` before any weight is read.
The model then has no routed-expert parameters, so `from_pretrained` never reads, converts nor
allocates those bytes (they are unexpected keys, ignored); everything else loads as usual.

A placed runtime that prefetches gives each experts module its `ahead` (the next MoE layer's
router, placer/runtime/prefetch.py).

`SelectionRecorder` records what the routers selected, per forward, from a forward pre-hook
on each experts module (original or staged): the input of the cost-model prediction.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from placer.errors import PlacerError
from placer.runtime.experts import ExpertSource, StagedExperts
from placer.runtime.loader import PlacedRuntime
from placer.runtime.prefetch import bind_ahead
from placer.runtime.tables import bind_tables
from traces.collecting.capture import find_routers
from traces.errors import TraceError

EXPERTS_MODULE = re.compile(r"(?:^|\.)layers\.(\d+)\.(?:mlp|block_sparse_moe|feed_forward)"
                            r"\.experts$")
ROUTED_EXPERT_KEYS = r"\.experts\."  # renamed checkpoint keys of routed experts only


def experts_modules(model: nn.Module) -> dict[int, tuple[str, nn.Module]]:
    """{decoder layer: (qualified name, module)} of the model's routed experts modules."""
    out = {}
    for name, module in model.named_modules():
        m = EXPERTS_MODULE.search(name)
        if m and (isinstance(module, StagedExperts) or hasattr(module, "num_experts")):
            out[int(m.group(1))] = (name, module)
    return out


def replace_experts(model: nn.Module) -> dict[int, StagedExperts]:
    """Swap every routed experts module of `model` for a `StagedExperts` (weights dropped)."""
    staged = {}
    for layer, (name, module) in experts_modules(model).items():
        parent_name, _, attr = name.rpartition(".")
        replacement = StagedExperts(module, layer)
        setattr(model.get_submodule(parent_name), attr, replacement)
        staged[layer] = replacement
    return staged


def staged_class(cls: type) -> type:
    """A subclass of transformers model class `cls` built with staged experts (see module doc).

    It keeps `cls.__module__`: transformers inspects the model's source module to decide which
    experts implementations it may dispatch to, and must decide as for `cls`.
    """

    def __init__(self: Any, config: Any, *args: Any, **kwargs: Any) -> None:
        cls.__init__(self, config, *args, **kwargs)
        replace_experts(self)

    ignore = [*(cls._keys_to_ignore_on_load_unexpected or ()), ROUTED_EXPERT_KEYS]
    return type(f"Staged{cls.__name__}", (cls,), {
        "__init__": __init__, "__module__": cls.__module__,
        "_keys_to_ignore_on_load_unexpected": ignore})


def load_staged_model(checkpoint: Path, source: ExpertSource, *, device: str = "cpu",
                      spare_rows: int | None = None, **kwargs: Any) -> nn.Module:
    """The causal LM of `checkpoint` (local files only) on `device`, routed experts from
    `source`; `kwargs` go to `from_pretrained` (e.g. `dtype`, `experts_implementation`).
    A placed runtime's experts are bound to per-layer tables with `spare_rows` spare rows
    per layer (None: the model's top-k; see placer.runtime.tables)."""
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    config = AutoConfig.from_pretrained(checkpoint, local_files_only=True)
    try:
        cls = MODEL_FOR_CAUSAL_LM_MAPPING[type(config)]
    except KeyError:
        raise PlacerError(f"{checkpoint}: model_type {config.model_type!r} has no causal-LM "
                          "class in transformers") from None
    model = staged_class(cls).from_pretrained(checkpoint, config=config, local_files_only=True,
                                              **kwargs)
    modules = [m for m in model.modules() if isinstance(m, StagedExperts)]
    if not modules:
        raise PlacerError(f"{checkpoint}: no routed experts module found in {cls.__name__}")
    for module in modules:
        module.attach(source)
    model = model.to(device).eval()
    if isinstance(source, PlacedRuntime):
        bind_tables(modules, source, spare_rows)
        if source.prefetching:
            staged = {m.layer: m for m in modules}
            try:
                routers = find_routers(model, staged)
            except TraceError as exc:
                raise PlacerError(f"{checkpoint}: cannot prefetch: {exc}") from None
            bind_ahead(staged, routers, source)
    return model


def routed_index(args: tuple, kwargs: dict) -> torch.Tensor:
    """The [tokens, k] expert ids an experts module is called with."""
    return args[1] if len(args) > 1 else kwargs.get("top_k_index", kwargs.get("router_indices"))


class SelectionRecorder:
    """Records each forward's routed selections: `steps[s][layer]` is that forward's
    top_k_index ([tokens, k] int64 numpy) at decoder layer `layer`. Use as a context manager."""

    def __init__(self, model: nn.Module) -> None:
        self.steps: list[dict[int, np.ndarray]] = []
        self._handles = [model.register_forward_pre_hook(self._new_step)]
        for layer, (_, module) in experts_modules(model).items():
            self._handles.append(module.register_forward_pre_hook(
                self._hook(layer), with_kwargs=True))

    def _new_step(self, _module: nn.Module, _args: tuple) -> None:
        self.steps.append({})

    def _hook(self, layer: int) -> Callable[[nn.Module, tuple, dict], None]:
        def hook(_module: nn.Module, args: tuple, kwargs: dict) -> None:
            self.steps[-1][layer] = routed_index(args, kwargs).detach().cpu().numpy()
        return hook

    def selected(self, moe_layers: Sequence[int], num_experts: int) -> np.ndarray:
        """[S, L, E] bool: which experts each forward selected at each MoE layer."""
        out = np.zeros((len(self.steps), len(moe_layers), num_experts), dtype=bool)
        for s, step in enumerate(self.steps):
            for i, layer in enumerate(moe_layers):
                if layer in step:
                    out[s, i, np.unique(step[layer])] = True
        return out

    def tokens(self) -> np.ndarray:
        """[S] the tokens each forward computed (what the caches' token clock advances by)."""
        return np.array([len(next(iter(step.values()))) if step else 0
                         for step in self.steps], dtype=np.int64)

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def __enter__(self) -> SelectionRecorder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

