"""Prefetching in the runtime: each MoE layer's experts copied ahead from the previous MoE
layer's hidden state, under the very cache and clock the prefetch replay counts with.

Where: at MoE layer m-1's experts forward (`StagedExperts.ahead`), after m-1's own cold
experts were staged, m's router is applied to m-1's MoE-block input - the hidden state the
experts module receives, the router's own input - and its top-k, best first
(traces.collecting.capture.speculative_selection: what `placer collect` records as
`spec_experts`), names what m will need. The prefetch for m is issued there, so its copies
overlap m-1's experts and m's attention; m's lookup then finds them in the cache.

What: `PrefetchCache` stands where a runtime's `solvers.cache` policy stands (the stagers'
`lookup`, the tables' `partition` and `holds`), and holds one `solvers.cache.prefetch.Timeline`
per card: the replay's own cache (LRU as solvers/cache/prefetch.py defines it, per MoE layer
or pooled as the plan runs its slots) and clock, walked by the runtime's forwards instead of
a trace's steps. `issue` takes m's predicted cold experts of a card (best first, at most
`Prefetch.max_per_layer`, while unused prefetches hold under `slot_share` of the slots; each
admitted, possibly evicting), `lookup` serves m's demand, `close` lets a card that m did not
need anything from pass the layer (its copy stream's clock moves on as the replay's does).
Slot ids follow the replay's holdings: an evicted key's slot goes to the next key admitted.
So the runtime's counters equal the replay's Counts for the same routing, by construction;
the runtime's part is to predict the same experts from the same hidden state, and to copy
them. Prefetching uses this LRU whatever policy the plan's cards run on demand.

When: forwards of one token (decode at batch 1, what the replay and the traces model)
prefetch; a forward of several tokens (prefill, a batch) is served on demand through the same
cache and clock. `useful`, `late` and the stall are the replay's clock model on every device
(a `Link`: copy_s per copy, window_s per layer), so a CPU run and the replay agree exactly; on
CUDA the copies go on the card's copy stream and each prefetched expert's event orders it
before its layer reads it, and `late_measured` counts those whose copy had not landed by then.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch
from torch import nn

from placer.plan.placement import Plan
from placer.plan.prefetch import plan_prefetch
from placer.runtime.counters import AHEAD, StagingCounters
from solvers.cache import Lookup
from solvers.cache.prefetch import Link, Prefetch, Timeline
from traces.collecting.capture import speculative_selection


class PrefetchCache:
    """Every card's cache and copy stream as the prefetch replay runs them (see module
    docstring), with the face of a `solvers.cache.CachePolicy` the runtime asks: quotas[c, l]
    slots for MoE layer row l of card c (pooled: one pool per card)."""

    name = "lru"

    def __init__(self, quotas: np.ndarray, num_keys: int, *, pooled: bool, link: Link,
                 prefetch: Prefetch, counters: StagingCounters) -> None:
        self.quotas = np.array(quotas, dtype=np.int64, ndmin=2)
        self.width = num_keys // self.quotas.shape[1]
        self.pooled, self.link, self.prefetch, self.counters = pooled, link, prefetch, counters
        parts = self.quotas.sum(axis=1, keepdims=True) if pooled else self.quotas
        self._start = np.concatenate([np.zeros_like(parts[:, :1]), np.cumsum(parts, axis=1)],
                                     axis=1)
        self.reset()

    @property
    def slots(self) -> np.ndarray:
        """[C] slots of each card."""
        return self.quotas.sum(axis=1)

    def reset(self) -> None:
        """Empty every card's cache and copy stream."""
        layers = self.quotas.shape[1]
        self.timelines = [Timeline(int(q.sum()) if self.pooled else q, self.link, self.prefetch,
                                   layers=layers) for q in self.quotas]
        self.slot_of: list[dict[int, int]] = [{} for _ in self.quotas]
        self._served: set[int] = set()

    def partition(self, card: int, row: int) -> range:
        """The slot ids of MoE layer row `row`'s partition on `card` (pooled: all)."""
        part = 0 if self.pooled else row
        return range(int(self._start[card, part]), int(self._start[card, part + 1]))

    def holds(self, card: int, key: int) -> bool:
        return key in self.slot_of[card]

    def lookup(self, card: int, keys: Sequence[int], now: int | None = None) -> list[Lookup]:
        """Serve one layer's distinct cold keys on `card` (the token clock `now` is not
        read): found in the cache (cached or prefetched) is a hit; a miss is copied, and
        keeps a slot when the replay's cache admits it."""
        row = int(keys[0]) // self.width
        before = set(self.timelines[card].held(row))
        self._step(card, row, lambda t: t.serve(row, sorted(int(k) for k in keys)))
        self._served.add(card)
        return [Lookup(k in before, self.slot_of[card].get(k)) for k in keys]

    def issue(self, card: int, row: int, experts: Sequence[int]) -> list[tuple[int, int]]:
        """Prefetch for MoE layer row `row` its predicted cold `experts` of `card` (best
        first, distinct); (key, slot) of each copy to make, in copy order."""
        keys = [row * self.width + int(e) for e in experts]
        issued = self._step(card, row, lambda t: t.issue(row, keys))
        return [(k, self.slot_of[card][k]) for k in issued]

    def close(self, row: int) -> None:
        """MoE layer row `row` is done: every card that served nothing in it passes it."""
        for card in set(range(len(self.quotas))) - self._served:
            self._step(card, row, lambda t: t.serve(row, []))
        self._served.clear()

    def _step(self, card: int, row: int, step: Callable[[Timeline], list | None]):
        """Run `step` on `card`'s timeline, count what it changed at `row`, settle slots."""
        timeline = self.timelines[card]
        before = vars(timeline.counts).copy()
        out = step(timeline)
        after = vars(timeline.counts)
        self.counters.record_ahead(row, card, {n: after[n] - before[n] for n in AHEAD})
        self._settle(card, row)
        return out

    def _settle(self, card: int, row: int) -> None:
        """Give the keys the partition of `row` now holds their slots: a key that left frees
        its slot, a key that came takes the lowest free one."""
        held = self.timelines[card].held(row)
        slots = self.partition(card, row)
        slot_of = self.slot_of[card]
        mine = [k for k in slot_of if slot_of[k] in slots]
        for key in mine:
            if key not in held:
                del slot_of[key]
        used = {slot_of[k] for k in slot_of if slot_of[k] in slots}
        free = (s for s in slots if s not in used)
        for key in held:
            if key not in slot_of:
                slot_of[key] = next(free)


class Ahead:
    """What MoE layer `layer`'s experts module does after staging its own experts
    (`StagedExperts.ahead`): predict the next MoE layer's experts with that layer's `router`
    (None: the last MoE layer, or one with no cold expert) and prefetch them; the runtime's
    `prefetch` and `PrefetchCache.close` do the copying and the counting."""

    def __init__(self, runtime, layer: int, next_layer: int | None,
                 router: nn.Module | None) -> None:
        self.runtime, self.layer, self.next_layer, self.router = runtime, layer, next_layer, router

    def __call__(self, hidden_states: torch.Tensor) -> Callable[[], None]:
        """Predict from `hidden_states` (this layer's MoE-block input) now; the returned
        function, called once this layer's experts are queued, closes the layer and issues
        the prefetch (on CUDA the copies wait for the compute queued before the experts
        unless the slots are pooled: a pooled victim may be an expert this layer computes)."""
        runtime, row = self.runtime, self.runtime.row[self.layer]
        one_token = hidden_states.numel() == hidden_states.shape[-1]
        predicted = ready = None
        if self.router is not None and one_token:
            predicted = speculative_selection(self.router, hidden_states)[0]
            if predicted.is_cuda:  # to the host without waiting for this layer's experts
                predicted = predicted.to("cpu", non_blocking=True)
                ready = torch.cuda.Event()
                ready.record()

        def finish() -> None:
            runtime.cache.close(row)
            if predicted is not None:
                if ready is not None:
                    ready.synchronize()
                runtime.prefetch(self.next_layer, predicted.tolist(),
                                 None if runtime.cache.pooled else ready)

        return finish


def bind_ahead(modules: dict[int, nn.Module], routers: dict[int, nn.Module], runtime) -> None:
    """Give every staged experts module of `modules` ({layer: StagedExperts}, the MoE layers
    of a model whose runtime prefetches) its `Ahead`, the next MoE layer's router from
    `routers` where that layer has a cold expert."""
    layers = sorted(modules)
    for here, ahead in zip(layers, [*layers[1:], None], strict=True):
        cold = ahead is not None and any(
            runtime.experts[(ahead, e)].cold is not None
            for e in range(runtime.plan.experts_per_layer))
        modules[here].ahead = Ahead(runtime, here, ahead, routers[ahead] if cold else None)


def run_prefetch(plan: Plan, on: bool | None) -> Prefetch | None:
    """The prefetch parameters a run of `plan` uses, or None for no prefetch. `on` None: as
    the plan decided (its `prefetch` section's `on`, issue #54 item 3; an older plan has
    none: off); True or False: as asked (`--prefetch`, `--no-prefetch`). The parameters are
    the plan's where it has them, else Prefetch()'s defaults. The one place a plan's
    prefetch enters the runtime."""
    section = plan.prefetch or {}
    if not (section.get("on", False) if on is None else on):
        return None
    return plan_prefetch(plan.prefetch) or Prefetch()
