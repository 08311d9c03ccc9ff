"""Whether a split's cache should be fed ahead of time, and how: prefetch in the objective.

Each candidate layout of the split (pins and per-layer slots of one card,
solvers/cache/split.py) with cache slots is replayed through solvers/cache/prefetch.py at slot
share 0 (no prefetch) and at each share of SHARES (the share of the slots prefetched-but-unused
experts may hold; a share that leaves no layer a slot for a prefetch is share 0, and a replay
identical to one done is not run again) with prefetching from the traffic's speculative
routing, under LRU eviction (what that replay models with prefetched experts admitted); the
chosen layout is also replayed under its own policy without prefetch (the compiled replay, one
copy per miss: the staging cost model's stall, which the prefetch replay without prefetch
equals under LRU). Prefetch is on only where its best row stalls at least MIN_GAIN less than
the best way to serve without it (the chosen layout under its own policy, or any layout under
LRU): what it gains is then prefetch's, not a change of layout or policy's. Otherwise it is
off, and the reason gives both figures, the predictor's recall and the copy against the
window (a copy that does not fit a layer's window: a slow link; recall under LOW_RECALL: a
poor predictor).

The figures are in sample (the calibration traffic the split was chosen on) and at batch 1
(one token a step, as the prefetch replay models decode), per token. The replays are plain
Python (about 20 us a selection): they walk each trace set's first steps, in sequence order,
as many as WORK selections over all the replays allow (`first_steps`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from solvers.cache import make_policy
from solvers.cache.prefetch import Counts, Link, Prefetch, quality, replay
from solvers.cache.replay import Requests

SHARES = (0.25, 0.5, 1.0)  # slot shares tried with prefetch (share 0: none)
MIN_GAIN = 0.02       # prefetch is on where it cuts the stall without it by at least this
LOW_RECALL = 0.5      # below: the reason calls the predictor's recall low
WORK = 1.0e6          # selections all of a choice's replays walk at most (~20 s on one core)
MIN_STEPS = 256       # steps of each trace set replayed at least (where it has them)


@dataclass(frozen=True)
class Candidate:
    """One candidate on one card: `name`, pinned [L, E] bool, quotas [L] slots per layer."""

    name: str
    pinned: np.ndarray
    quotas: np.ndarray


@dataclass(frozen=True)
class Serving:
    """What the plan serves without prefetch: the policy `name` and make_policy's `options`
    (pooled; a fitted policy's parameters)."""

    name: str
    options: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Row:
    """One replay: `candidate` (its index), `slot_share` (0: without prefetch), its stall
    per token and counts summed over the traffic."""

    candidate: int
    slot_share: float
    stall_s: float
    counts: Counts


@dataclass(frozen=True)
class PrefetchChoice:
    """The decision: `on`, its `reason`, the `candidate` (index) it serves and the `prefetch`
    parameters of the best row (what it would run with where off); per token the stall
    `without_s` (the chosen layout under its own policy, no prefetch), `best_without_s` (the
    least of that and every layout under LRU without prefetch) and `with_s` (the best row
    with prefetch, also where it does not pay; None: no layout has slots); the predictor's
    mean `recall` over layers with predictions; every row replayed; the `tokens` replayed."""

    on: bool
    reason: str
    candidate: int
    prefetch: Prefetch
    without_s: float
    best_without_s: float
    with_s: float | None
    recall: float | None
    rows: list[Row]
    tokens: int


def choose_prefetch(traffic: list[tuple[np.ndarray, np.ndarray]], candidates: list[Candidate],
                    chosen: int, link: Link, serving: Serving,
                    shares: tuple[float, ...] = SHARES, max_per_layer: int | None = None,
                    work: float = WORK) -> PrefetchChoice:
    """The best (candidate, slot share) with prefetch against the best way without it.

    traffic: (actual, predicted) [S, L, k] expert ids per trace set (solvers/cache/prefetch);
    candidates: the split's, `chosen` the one it serves; link: the copy stream; work: the
    selections all the replays walk at most (`first_steps`)."""
    jobs: dict[tuple, list[tuple[int, float]]] = {}
    for i, candidate in enumerate(candidates):
        for share in (0.0, *shares) if candidate.quotas.any() else ():
            caps = np.floor(share * candidate.quotas).astype(np.int64)
            if share == 0 or caps.any():  # else no slot for a prefetch: share 0's replay
                key = (candidate.pinned.tobytes(), candidate.quotas.tobytes(), caps.tobytes())
                jobs.setdefault(key, []).append((i, share))
    traffic = first_steps(traffic, work / max(1, len(jobs)))
    tokens = sum(len(actual) for actual, _ in traffic)
    rows = []
    for same in jobs.values():
        i, share = same[0]
        row = _row(traffic, candidates[i], i, share, link, max_per_layer, tokens)
        rows += [replace(row, candidate=j, slot_share=s) for j, s in same]
    without = sum(_own_stall(a, candidates[chosen], serving) for a, _ in traffic) \
        * link.copy_s / tokens
    best_without = min([without, *(r.stall_s for r in rows if r.slot_share == 0)])
    best = min((r for r in rows if r.slot_share > 0),
               key=lambda r: (r.stall_s, r.candidate != chosen, r.slot_share), default=None)
    recall = _recall(traffic)
    on = bool(best is not None and best.stall_s < best_without * (1 - MIN_GAIN))
    prefetch = Prefetch(1, max_per_layer, 0.0 if best is None else best.slot_share)
    return PrefetchChoice(on, _reason(on, best, best_without, recall, link, candidates),
                          best.candidate if on else chosen, prefetch, without, best_without,
                          None if best is None else best.stall_s, recall, rows, tokens)


def first_steps(traffic: list[tuple[np.ndarray, np.ndarray]], selections: float
                ) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each trace set's first steps (at least MIN_STEPS, where it has them), the sets
    together holding about `selections` selections (a replay's cost grows with them)."""
    per_step = sum(int(np.count_nonzero(a[0] >= 0)) if len(a) else 0 for a, _ in traffic)
    most = max(MIN_STEPS, int(selections / max(1, per_step)))
    return [(a[:most], p[:most]) for a, p in traffic]


def _row(traffic: list[tuple[np.ndarray, np.ndarray]], candidate: Candidate, index: int,
         share: float, link: Link, max_per_layer: int | None, tokens: int) -> Row:
    total = Counts()
    for actual, predicted in traffic:
        counts = replay(actual, predicted if share > 0 else None, candidate.quotas, link,
                        Prefetch(1, max_per_layer, share), pinned=candidate.pinned)
        for key, value in vars(counts).items():
            setattr(total, key, getattr(total, key) + value)
    return Row(index, share, float(total.stall_s) / tokens, total)


def _own_stall(actual: np.ndarray, candidate: Candidate, serving: Serving) -> int:
    """Misses of the candidate's cache under the serving policy over `actual` (one token a
    step): the copies it stalls for without prefetch."""
    layers, experts = candidate.pinned.shape
    cache = make_policy(serving.name, candidate.quotas[None, :], layers * experts,
                        **serving.options)
    home = np.zeros((layers, experts), dtype=np.int64)
    steps = Requests.of_tokens(actual[:, None], experts)
    return int(steps.misses(cache, ~candidate.pinned, home).sum())


def _recall(traffic: list[tuple[np.ndarray, np.ndarray]]) -> float | None:
    """The share of selections the speculative routing predicted, over the layers it
    predicts."""
    right = selected = 0
    for actual, predicted in traffic:
        q = quality(actual, predicted)
        right, selected = right + int(q.right.sum()), selected + int(q.selected.sum())
    return right / selected if selected else None


def _reason(on: bool, best: Row | None, without: float, recall: float | None, link: Link,
            candidates: list[Candidate]) -> str:
    """Why prefetch is on or off, with the figures that decided it (ms per token)."""
    said = "no prediction" if recall is None else f"recall {recall:.2f} one layer ahead"
    window = float(np.max(link.window_s))
    copy = f"a copy {link.copy_s * 1e3:.3g} ms against a layer's window {window * 1e3:.3g} ms"
    if best is None:
        return "no candidate has cache slots for prefetched experts"
    figures = (f"{candidates[best.candidate].name}, with prefetch at slot share "
               f"{best.slot_share:g}, replays {best.stall_s * 1e3:.4g} ms/token against "
               f"{without * 1e3:.4g} at best without")
    if on:
        return f"prefetch pays: {figures} ({said}; {copy})"
    if without == 0:
        return f"no copy stalls this traffic without prefetch: nothing to hide ({said})"
    why = [w for w, bad in (("low recall", recall is None or recall < LOW_RECALL),
                            ("slow link", link.copy_s > window)) if bad]
    return (f"prefetch does not pay{' (' + ', '.join(why) + ')' if why else ''}: {figures}, "
            f"not {MIN_GAIN:.0%} less ({said}; {copy})")
