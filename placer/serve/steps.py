"""Forwards of a served model, seen from hooks: a lock held while one runs (so the runtime's
counters are read between forwards), and a record of the decode steps (`placer bench`).

A decode step is a forward in which every sequence adds one token: under continuous
batching, as many query tokens as requests in the batch; under `model.generate`, one token
per row. Its time runs from the forward's start to its end (the device synchronised, so the
staging copies and the kernels are in it); the routed experts of its tokens are copied to
the host after that, out of the timed span.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from placer.runtime.patch import experts_modules, routed_index


class ForwardGate:
    """`with gate:` waits until no forward of `model` runs, and holds the next one off."""

    def __init__(self, model: nn.Module) -> None:
        self.lock = threading.Lock()
        self._handles = [model.register_forward_pre_hook(self._hold),
                         model.register_forward_hook(self._free, always_call=True)]

    def _hold(self, *_: Any) -> None:  # a hook that returned a value would replace the inputs
        self.lock.acquire()

    def _free(self, *_: Any) -> None:
        self.lock.release()

    def __enter__(self) -> ForwardGate:
        self.lock.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.lock.release()

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()


@dataclass
class DecodeStep:
    """One decode step: seconds, the request of each token, and [tokens, L, k] experts."""

    seconds: float
    requests: list[str] | None
    experts: np.ndarray


@dataclass
class StepRecorder:
    """Records every decode step of `model` while `recording` (see module docstring).
    `requests_of_step` names the requests of the forward being computed, in token order
    (None where unknown)."""

    model: nn.Module
    requests_of_step: Callable[[], list[str] | None]
    recording: bool = False
    steps: list[DecodeStep] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._layers = sorted(experts_modules(self.model))
        self._current: dict[int, torch.Tensor] | None = None
        self._start = 0.0
        self._requests: list[str] | None = None
        self._handles = [
            self.model.register_forward_pre_hook(self._begin, with_kwargs=True),
            self.model.register_forward_hook(self._end, always_call=True)]
        for layer, (_, module) in experts_modules(self.model).items():
            self._handles.append(module.register_forward_pre_hook(self._routed(layer),
                                                                  with_kwargs=True))

    def _begin(self, _module: nn.Module, args: tuple, kwargs: dict) -> None:
        self._current = None
        if not self.recording or not is_decode(args, kwargs):
            return
        self._current = {}
        self._requests = self.requests_of_step()
        self._start = time.perf_counter()

    def _routed(self, layer: int) -> Callable[[nn.Module, tuple, dict], None]:
        def hook(_module: nn.Module, args: tuple, kwargs: dict) -> None:
            if self._current is not None:
                self._current[layer] = routed_index(args, kwargs)
        return hook

    def _end(self, *_: Any) -> None:
        if self._current is None:
            return
        device = next(self.model.parameters()).device
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        seconds = time.perf_counter() - self._start
        experts = np.stack([self._current[layer].detach().cpu().numpy()
                            for layer in self._layers], axis=1).astype(np.int16)
        self.steps.append(DecodeStep(seconds, self._requests, experts))
        self._current = None

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()


def is_decode(args: tuple, kwargs: dict) -> bool:
    """Whether a forward's inputs make a decode step (see module docstring)."""
    ids = kwargs.get("input_ids", args[0] if args else None)
    if ids is None:
        return False
    lengths = kwargs.get("cu_seq_lens_q")
    if lengths is not None:  # continuous batching: [1, total query tokens]
        return int(ids.shape[-1]) == int(lengths.shape[0]) - 1
    return int(ids.shape[-1]) == 1
