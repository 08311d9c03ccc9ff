"""Replaying prefetch: a cache fed ahead of time by the speculative routing of a trace.

The trace's `spec_experts` (traces.storing.schema) say, for each token and MoE layer m, which
experts m's router picks on the hidden state at the previous MoE layer's MoE-block input:
what a prefetcher issuing copies there would fetch for m. This module replays one card's
cache over decode steps (batch 1, one token a step), MoE layer by layer, with and without
those prefetches. Pure functions over arrays, plain Python loops: a figure for a trace of a
few thousand steps, not the compiled replay of solvers/cache/replay.py (whose policies admit
on demand only).

The timeline of MoE layer m, times relative to the point the prefetch is issued (the
previous MoE layer's experts start):

- the copy stream first finishes what is still in flight (`carry`), then copies m's
  predicted experts that are neither resident nor pinned, best first, at most
  `max_per_layer` of them and only while prefetched-but-unused experts hold fewer than
  `slot_share` of the slots; each enters the cache when issued (it takes a slot and may
  evict: the policy sees it as admitted) and is ready `copy_s` after the one before;
- m's experts want to start at `window_s` (the previous layer's expert compute and m's
  attention: what a copy can hide behind);
- a selected expert that is resident is a hit; one prefetched for m and ready by then is
  useful; one still in flight is late and m waits for it; one neither is a miss, copied
  after every copy already queued (a useless prefetch costs its link time), and admitted;
- m's stall is how long after `window_s` its last needed copy lands; copies still in flight
  then carry into the next layer's window (and a later layer needing one waits for it).

Without prefetch this is the staging cost model's stall (one copy per miss). Eviction is
`lru` (least recently used, never an expert the current layer needs or predicts) or `min`
(Belady: the resident whose next demand lies furthest ahead, or none - bypass - when that is
nearer than the newcomer's; a prefetch MIN would bypass is not issued). `min` without
prefetch is exactly solvers.cache.belady's bound on the misses; with prefetch it is the best
eviction for this predictor, a reference line rather than a proof of a bound.

`Timeline` is that walk for one card, a layer at a time (`issue`, then `serve`): `replay`
drives it over a trace, and the runtime's prefetch (placer/runtime/prefetch.py) over its own
forwards, so the runtime's counters are this replay's by construction.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

NONE = -1  # no expert (spec_experts of the first MoE layer; padding of a short selection)
EVICTIONS = ("lru", "min")
NEVER = math.inf


@dataclass(frozen=True)
class Prefetch:
    """What a prefetcher may do: `depth` MoE layers ahead (1: what traces record),
    `max_per_layer` predicted experts copied per layer (None: all that are predicted),
    `slot_share` of the slots that prefetched experts not yet used may hold."""

    depth: int = 1
    max_per_layer: int | None = None
    slot_share: float = 0.5

    def __post_init__(self) -> None:
        if self.depth != 1:
            raise ValueError(f"prefetch depth {self.depth}: traces record one MoE layer ahead")
        if self.max_per_layer is not None and self.max_per_layer < 0:
            raise ValueError(f"max_per_layer {self.max_per_layer} is negative")
        if not 0.0 <= self.slot_share <= 1.0:
            raise ValueError(f"slot_share {self.slot_share} is outside [0, 1]")


@dataclass(frozen=True)
class Link:
    """The copy stream: `copy_s` seconds per expert copy (its bytes over the link),
    `window_s` seconds a copy issued at the prefetch point has before the layer's experts
    start (one for all MoE layers, or [L]), `expert_bytes` bytes per copy."""

    copy_s: float
    window_s: float | np.ndarray
    expert_bytes: int = 0


@dataclass
class Counts:
    """What a replay counted: demand `hits` and `misses` (copies on demand), prefetches
    issued (`prefetched`) of which `useful` (needed, ready in time), `late` (needed, still
    in flight) and `wasted` (not needed by the layer they were issued for);
    `evicted_unused`: prefetched experts evicted before any use; `stall_s` summed over
    layers and steps; `staged_bytes`: every copy's bytes."""

    hits: int = 0
    misses: int = 0
    prefetched: int = 0
    useful: int = 0
    late: int = 0
    wasted: int = 0
    evicted_unused: int = 0
    stall_s: float = 0.0
    staged_bytes: int = 0


@dataclass
class _Cache:
    """One partition of a card's slots (all of them, or one MoE layer's): key (layer * E +
    expert) -> LRU order (OrderedDict) or next use. `in_flight` (key -> when its copy lands)
    is shared by the partitions: one copy stream."""

    slots: int
    eviction: str
    uses: dict[int, list[int]]
    in_flight: dict[int, float]
    slot_share: float
    held: OrderedDict = field(default_factory=OrderedDict)
    unused: set = field(default_factory=set)  # prefetched, not yet used

    @property
    def cap(self) -> int:
        """How many prefetched-but-unused experts this partition may hold."""
        return math.floor(self.slot_share * self.slots)

    def next_use(self, key: int, after: int) -> float:
        """The first demand position >= `after` of `key` (NEVER if none)."""
        uses = self.uses.get(key, [])
        i = bisect_left(uses, after)
        return uses[i] if i < len(uses) else NEVER

    def touch(self, key: int, after: int) -> None:
        self.held[key] = self.next_use(key, after)
        self.held.move_to_end(key)

    def admit(self, key: int, after: int, keep: set[int], counts: Counts) -> bool:
        """Take a slot for `key` (evicting if full, never a key of `keep`); False if it
        stays out (no slot, or MIN's bypass)."""
        if self.slots == 0:
            return False
        if len(self.held) >= self.slots:
            victim = self._victim(keep, self.next_use(key, after))
            if victim is None:
                return False
            del self.held[victim]
            self.in_flight.pop(victim, None)
            if victim in self.unused:
                self.unused.discard(victim)
                counts.evicted_unused += 1
        self.touch(key, after)
        return True

    def _victim(self, keep: set[int], incoming: float) -> int | None:
        if self.eviction == "lru":
            return next((k for k in self.held if k not in keep), None)
        victim = max((k for k in self.held if k not in keep), key=self.held.get, default=None)
        return None if victim is None or self.held[victim] <= incoming else victim


def _demand(actual: np.ndarray, pinned: np.ndarray) -> tuple[list[list[list[int]]], dict]:
    """Per (step, layer) the needed cold keys, ascending, and {key: its demand positions}:
    requests numbered in serving order (step, layer, ascending expert)."""
    steps, layers, _ = actual.shape
    experts = pinned.shape[1]
    needs: list[list[list[int]]] = []
    uses: dict[int, list[int]] = {}
    position = 0
    for s in range(steps):
        row = []
        for m in range(layers):
            keys = sorted({m * experts + int(e) for e in actual[s, m]
                           if e != NONE and not pinned[m, e]})
            for key in keys:
                uses.setdefault(key, []).append(position)
                position += 1
            row.append(keys)
        needs.append(row)
    return needs, uses


def replay(actual: np.ndarray, predicted: np.ndarray | None, slots: int | np.ndarray,
           link: Link, prefetch: Prefetch = Prefetch(), *, pinned: np.ndarray | None = None,
           num_experts: int | None = None, eviction: str = "lru") -> Counts:
    """Replay decode steps through one card's cache: `slots` experts shared by every MoE
    layer (an int), or [L] slots per MoE layer (the plans' per-layer quotas), each layer's
    its own cache.

    actual: [S, L, k] int, the experts each step selects at each MoE layer (NONE: none);
    predicted: [S, L, k] int, the speculative selection for that step and layer, best first
    (NONE: no prediction), or None for no prefetch; pinned: [L, E] bool, resident experts
    outside the cache (default none); num_experts: E when `pinned` is not given (default:
    the largest id + 1)."""
    if eviction not in EVICTIONS:
        raise ValueError(f"eviction {eviction!r}: one of {', '.join(EVICTIONS)}")
    actual = np.asarray(actual)
    steps, layers, _ = actual.shape
    if pinned is None:
        top = max(int(actual.max(initial=0)), 0 if predicted is None
                  else int(np.asarray(predicted).max(initial=0)))
        pinned = np.zeros((layers, num_experts or top + 1), dtype=bool)
    needs, uses = _demand(actual, pinned)
    experts = pinned.shape[1]
    timeline = Timeline(slots, link, prefetch, layers=layers, eviction=eviction, uses=uses)
    for s in range(steps):
        for m in range(layers):
            guesses = [] if predicted is None else _guesses(predicted[s, m], pinned[m])
            timeline.issue(m, [m * experts + e for e in guesses])
            timeline.serve(m, needs[s][m])
    counts = timeline.counts
    counts.staged_bytes = (counts.prefetched + counts.misses) * link.expert_bytes
    return counts


class Timeline:
    """One card's cache and copy stream walked MoE layer by layer (the module docstring's
    timeline): `issue(m, keys)` at the prefetch point of MoE layer m, then `serve(m, need)`
    when m's experts run. `replay` walks recorded steps through it; a runtime that prefetches
    (placer/runtime/prefetch.py) walks its forwards through the very same object, so the two
    count alike by construction. Keys are `m * E + expert`; `uses` ({key: demand positions},
    `_demand`) only MIN reads (LRU runs without it)."""

    def __init__(self, slots: int | np.ndarray, link: Link, prefetch: Prefetch, *,
                 layers: int, eviction: str = "lru", uses: dict | None = None) -> None:
        uses = {} if uses is None else uses
        self.link, self.prefetch, self.counts = link, prefetch, Counts()
        self.windows = np.broadcast_to(np.asarray(link.window_s, dtype=float), (layers,))
        self.in_flight: dict[int, float] = {}
        if np.ndim(slots) == 0:
            self.caches = [_Cache(int(slots), eviction, uses, self.in_flight,
                                  prefetch.slot_share)] * layers
        else:
            self.caches = [_Cache(int(n), eviction, uses, self.in_flight, prefetch.slot_share)
                           for n in np.broadcast_to(slots, (layers,))]
        self.carry, self.position = 0.0, 0
        self._issued: dict[int, int] = {}

    def held(self, m: int) -> OrderedDict:
        """The keys MoE layer m's cache (its own, or the pool) holds now."""
        return self.caches[m].held

    def issue(self, m: int, keys: list[int]) -> list[int]:
        """Prefetch for MoE layer m its predicted `keys` (best first, no repeats, none
        pinned), at most `max_per_layer` of them; the keys issued, in copy order."""
        self._issued = _issue(self.caches[m], keys[:self.prefetch.max_per_layer],
                              self.position, self.counts)
        return list(self._issued)

    def serve(self, m: int, need: list[int]) -> None:
        """Serve MoE layer m's needed cold keys (ascending), with what `issue` copied for it
        (nothing if it was not called since the last `serve`)."""
        landed, self.carry = _serve(self.caches[m], need, self._issued, self.position,
                                    self.windows[m], self.carry, self.link.copy_s,
                                    self.counts)
        self.counts.stall_s += landed - self.windows[m]
        self.position += len(need)
        self._issued = {}


def _guesses(row: np.ndarray, pinned: np.ndarray) -> list[int]:
    """The predicted experts of one (step, layer), best first, without NONE, repeats or
    pinned experts."""
    return list(dict.fromkeys(int(e) for e in row if e != NONE and not pinned[e]))


def _issue(cache: _Cache, keys: list[int], position: int, counts: Counts) -> dict[int, int]:
    """Prefetch the non-resident `keys` in order while unused prefetches hold fewer than
    the cache's `cap` slots; {key: its place in the copy queue}."""
    issued: dict[int, int] = {}
    for key in keys:
        if key in cache.held or len(cache.unused) >= cache.cap:
            continue
        if cache.admit(key, position, set(keys), counts):
            issued[key] = len(issued)
            cache.unused.add(key)
    counts.prefetched += len(issued)
    return issued


def _serve(cache: _Cache, need: list[int], issued: dict[int, int], position: int,
           window: float, carry: float, copy_s: float, counts: Counts) -> tuple[float, float]:
    """Serve one layer's needed keys; (when its last needed copy lands, at least `window`;
    the copy stream's backlog past that, carried into the next layer)."""
    landed = window
    queue_end = carry + len(issued) * copy_s
    for key, place in issued.items():
        cache.in_flight[key] = carry + (place + 1) * copy_s
    for offset, key in enumerate(need):
        here = position + offset
        if key in issued:
            if cache.in_flight[key] <= window:
                counts.useful += 1
            else:
                counts.late += 1
            landed = max(landed, cache.in_flight[key])
        elif key in cache.held:
            counts.hits += 1
            landed = max(landed, cache.in_flight.get(key, 0.0))  # an earlier layer's prefetch
        else:
            counts.misses += 1
            queue_end = max(queue_end, window) + copy_s
            landed = max(landed, queue_end)
            cache.admit(key, here + 1, set(need) if cache.eviction == "lru" else set(), counts)
            continue
        cache.unused.discard(key)
        cache.touch(key, here + 1)
    counts.wasted += len(set(issued) - set(need))
    for key, t in list(cache.in_flight.items()):  # times from the next layer's window
        if t > landed:
            cache.in_flight[key] = t - landed
        else:
            del cache.in_flight[key]
    return landed, max(0.0, queue_end - landed)


@dataclass(frozen=True)
class Quality:
    """How well the speculative selection predicts, per MoE layer ([L] int arrays):
    `right` predicted experts that were selected, `selected` selections, `predicted`
    predictions (layers without any: 0)."""

    right: np.ndarray
    selected: np.ndarray
    predicted: np.ndarray

    def recall(self) -> list[tuple[float, float, float] | None]:
        """Per layer (share of selections predicted, 95% Wilson interval) or None."""
        return [_wilson(r, n) for r, n in zip(self.right, self.selected, strict=True)]

    def precision(self) -> list[tuple[float, float, float] | None]:
        """Per layer (share of predictions selected, 95% Wilson interval) or None."""
        return [_wilson(r, n) for r, n in zip(self.right, self.predicted, strict=True)]


def quality(actual: np.ndarray, predicted: np.ndarray) -> Quality:
    """Recall and precision counts of `predicted` against `actual`, both [S, L, k] int
    (NONE: none); a step whose prediction for a layer is all NONE counts neither its
    selections nor its predictions there."""
    actual, predicted = np.asarray(actual), np.asarray(predicted)
    has = (predicted != NONE).any(axis=2)
    match = (actual[..., :, None] == predicted[..., None, :]) & (actual != NONE)[..., None]
    right = np.where(has, match.any(axis=3).sum(axis=2), 0).sum(axis=0)
    selected = np.where(has, (actual != NONE).sum(axis=2), 0).sum(axis=0)
    guessed = np.where(has, (predicted != NONE).sum(axis=2), 0).sum(axis=0)
    return Quality(right, selected, guessed)


def _wilson(successes: int, trials: int, z: float = 1.96) -> tuple[float, float, float] | None:
    """(share, low, high): the Wilson score interval. It treats trials as independent;
    selections of one sequence are not, so the true interval is wider."""
    if trials == 0:
        return None
    p = successes / trials
    centre = (p + z * z / (2 * trials)) / (1 + z * z / trials)
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / (
        1 + z * z / trials)
    return p, max(0.0, centre - half), min(1.0, centre + half)
