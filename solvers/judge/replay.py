"""Replaying decode steps against several placements at once, with paired intervals.

`placer evaluate` (held-out traffic) and `placer solve` (its predicted table, on the
calibration traffic) both replay the same steps against a placement and its baselines with
the cost model the solver optimizes (`solvers.cost.replay`, either execution model), a chunk
of steps at a time, attribute each step's cost to its tokens' sequences and bootstrap over
sequences (`solvers.judge.intervals`).

A line may cache staged experts (`Line.cache`): its steps then go through its caches in
order, the state carried from chunk to chunk (Belady's MIN reads all of them first), and a
step pays only for the selected cold experts its caches miss. The bootstrap keeps each
sequence's attributed cost fixed, as if the cache's state did not depend on which sequences
were drawn.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from solvers.cache import cache_hits, make_policy
from solvers.cache.belady import BeladyReplay
from solvers.cost import replay
from solvers.judge.intervals import (
    FIELDS,
    REPLICATES,
    Estimate,
    Units,
    attribute,
    estimable,
    line_figures,
    replicate_weights,
    token_shares,
    units_of,
    without_intervals,
)
from solvers.problem import Placement, Problem, Steps
from traces.storing.profile import TokenSteps, step_mask

CHUNK_CELLS = 1 << 22  # [steps, L, E] mask cells replayed at a time


BELADY = "belady"


@dataclass(frozen=True)
class Line:
    """How a line serves the traffic: its pinned pages and cache slots per card and layer
    (`quotas` [C, L]) under `cache` (a policy of solvers.cache, or BELADY: MIN over each
    card's slots, the offline limit; None: no cache), with `options` (make_policy's: pooled,
    the learned policy's weights and calibration)."""

    placement: Placement
    cache: str | None = None
    quotas: np.ndarray | None = None
    options: dict | None = None  # the policy's own: pooled, learned's weights and calibration

    @property
    def slots(self) -> list[int]:
        """Cache slots of each card."""
        return [] if self.quotas is None else [int(n) for n in self.quotas.sum(axis=1)]


def as_line(line: Line | Placement) -> Line:
    return line if isinstance(line, Line) else Line(line)


def hits_of(problem: Problem, line: Line, steps: TokenSteps, chunk: int
            ) -> Callable[[int, np.ndarray], np.ndarray]:
    """hits(start, selected): the hits of a cached line's steps start .. start + len(selected)
    - 1, asked chunk by chunk in order."""
    cold, home = line.placement.cold_bytes(problem), np.asarray(problem.home)
    if line.cache == BELADY:
        belady = BeladyReplay(_masks(steps, problem.num_experts, chunk), cold, home,
                              np.asarray(line.slots))
        return lambda start, selected: belady.hits(start, start + len(selected))
    policy = make_policy(line.cache, line.quotas, problem.num_layers * problem.num_experts,
                         **(line.options or {}))
    tokens = np.maximum(1, (steps.seqs >= 0).sum(axis=1))  # the token clock's step sizes
    return lambda start, selected: cache_hits(policy, selected, cold, home,
                                              tokens[start:start + len(selected)])


def _masks(steps: TokenSteps, num_experts: int, chunk: int) -> Iterator[np.ndarray]:
    for start in range(0, len(steps), chunk):
        yield step_mask(steps.tokens[start:start + chunk], num_experts)


def make_steps(name: str, steps: TokenSteps, num_experts: int, weight: float,
               base_step_s: float) -> Steps:
    """Solver steps of decode steps given as their tokens."""
    return Steps(name, steps.batch, step_mask(steps.tokens, num_experts), weight, base_step_s,
                 steps.tokens)


@dataclass(frozen=True)
class Replayed:
    """Each line's figures with their intervals (`figures[line]`, solvers.judge.intervals
    line_figures), its stall estimate (for paired ratios), the resampling units and replicate
    weights, and each line's [L] staged bytes summed over the steps."""

    figures: dict[str, dict]
    stall: dict[str, Estimate]
    units: Units
    weights: np.ndarray
    staged: dict[str, np.ndarray]

    def ratio(self, key: str, other: str) -> dict:
        """{key: placement stall / `other`'s, key_ci95: its paired interval (None from too
        few units: solvers.judge.intervals.estimable)}."""
        ratio = self.stall["placement"].ratio_to(self.stall[other])
        return {key: ratio.point, f"{key}_ci95": ratio.ci95() if estimable(self.units) else None}


def replay_with_intervals(problem: Problem, lines: dict[str, Line | Placement],
                          steps: TokenSteps,
                          base_step_s: float, replicates: int = REPLICATES, seed: int = 0
                          ) -> Replayed:
    """Replay `steps` against every line (a "placement" line among them) with intervals."""
    units = units_of(steps.seqs)
    sums, staged = replay_lines(problem, lines, steps, units)
    weights = replicate_weights(units.count, replicates, seed)
    tokens = units.tokens()
    figures, stall = {}, {}
    for line in lines:
        figures[line], stall[line] = line_figures(sums[line], tokens, weights, steps.batch,
                                                  base_step_s)
        if not estimable(units):
            figures[line] = without_intervals(figures[line])
    return Replayed(figures, stall, units, weights, staged)


def replay_lines(problem: Problem, lines: dict[str, Line | Placement], steps: TokenSteps,
                 units: Units) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Replay `steps` against each line, a chunk of steps at a time, in order.

    Returns per line the [n, 4] sums of FIELDS attributed to the n units, and the [L] staged
    bytes of each layer summed over all steps."""
    num_layers, num_experts = problem.num_layers, problem.num_experts
    chunk = max(1, CHUNK_CELLS // (num_layers * num_experts))
    lines = {name: as_line(line) for name, line in lines.items()}
    cached = {name: hits_of(problem, line, steps, chunk) for name, line in lines.items()
              if line.cache is not None}
    sums = {k: np.zeros((units.count, len(FIELDS))) for k in lines}
    staged = {k: np.zeros(num_layers) for k in lines}
    for start in range(0, len(steps), chunk):
        stop = min(start + chunk, len(steps))
        part = TokenSteps(steps.tokens[start:stop], steps.seqs[start:stop])
        chunk_steps = make_steps("replay", part, num_experts, 1.0, 0.0)
        for name, line in lines.items():
            hits = cached[name](start, chunk_steps.selected) if name in cached else None
            stats = replay(problem, line.placement, chunk_steps, hits)
            per_step = np.stack([stats.step_stall, stats.staged_bytes.sum(axis=1),
                                 stats.transfers.sum(axis=1), stats.selected_bytes.sum(axis=1)],
                                axis=1)
            charged = None if hits is None else chunk_steps.selected & ~hits
            shares = (None if steps.batch == 1 else  # one token: the whole step is its
                      token_shares(part.tokens, share_weights(problem, line.placement), charged))
            sums[name] += attribute(units.unit_of[start:stop], per_step, units.count, shares)
            staged[name] += stats.staged_bytes.sum(axis=0)
    return sums, staged


def share_weights(problem: Problem, placement: Placement) -> np.ndarray:
    """[4, L, E] what each selected expert adds to a step's FIELDS under `placement`, to split
    a step among its tokens (solvers.judge.intervals.token_shares): its staging time (latency plus
    cold bytes over its home card's bandwidth; cpu execution: its CPU time for one token),
    cold bytes, one transfer (cpu: one expert computed) if cold, its bytes."""
    cold = placement.cold_bytes(problem).astype(np.float64)
    is_cold = cold > 0
    if problem.execution == "cpu":
        host = problem.host
        time = host.expert_seconds(cold, problem.expert_flops, 1)
    else:
        home = np.asarray(problem.home)
        latency = np.asarray(problem.cards.latency)[home]
        time = latency + cold / np.asarray(problem.cards.bandwidth)[home]
    return np.stack([np.where(is_cold, time, 0.0), cold,
                     is_cold.astype(np.float64),
                     np.asarray(problem.expert_bytes, dtype=np.float64)])
