"""The stall cost model, vectorized over sampled decode steps.

Per decode step s, MoE layer l, card c and shared host link g:

    card_time(l, c) = n_transfers(l, c) * latency_c + cold_bytes(l, c) / bandwidth_c
    link_time(l, g) = sum_{c behind g} cold_bytes(l, c) / link_bandwidth_g
    layer_stall(s, l) = max(max_c card_time(l, c), max_g link_time(l, g))
    stall(s) = sum_l layer_stall(s, l)

where the sums run over the experts homed on c that step s selects at layer l and that are not
fully resident: each costs one transfer plus its cold bytes (a partly resident expert stages
its cold suffix of pages in one transfer; a fully resident one costs nothing).
Only `expert_bytes`, `home`, `cards` and `page_bytes` of the problem are used by the functions
that take `selected` explicitly, so a problem with any `steps` (even none) can replay traffic.

That is the `stage` execution model. Under `cpu` execution (problem.execution, solvers/cpu.py)
the host computes the selected cold experts instead; `replay` and `objective` follow the
problem's model.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from solvers.cpu import CHUNK_CELLS, cpu_loads
from solvers.problem import Placement, Problem, Steps, check_placement


def link_matrix(problem: Problem) -> np.ndarray:
    """[C, G] float one-hot of each card's shared host link."""
    return np.eye(problem.cards.num_links)[np.asarray(problem.cards.link_of)]


def card_loads(
    problem: Problem, placement: Placement, selected: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Cold bytes and transfers each card stages.

    selected: [S, L, E] bool. Returns (cold_bytes [S, L, C] float, transfers [S, L, C] float),
    both exact integers held in float64.
    """
    check_placement(problem, placement)
    cold = placement.cold_bytes(problem).astype(np.float64).ravel()  # [L * E]
    home = np.asarray(problem.home).ravel()
    selected = np.asarray(selected)
    num_steps, num_layers, num_experts = selected.shape
    num_cards = problem.num_cards
    # Selected cold (step, layer, expert) triples, flat; idx // E is step * L + layer.
    idx = np.flatnonzero(selected.reshape(num_steps, num_layers * num_experts) & (cold > 0))
    x = idx % (num_layers * num_experts)
    key = (idx // num_experts) * num_cards + home[x]
    size = num_steps * num_layers * num_cards
    shape = (num_steps, num_layers, num_cards)
    cold_bytes = np.bincount(key, weights=cold[x], minlength=size).reshape(shape)
    transfers = np.bincount(key, minlength=size).reshape(shape).astype(np.float64)
    return cold_bytes, transfers


def stall_from_loads(problem: Problem, cold_bytes: np.ndarray, transfers: np.ndarray) -> np.ndarray:
    """[..., C] cold bytes and transfers per card -> [...] layer stall seconds."""
    cards = problem.cards
    card_time = transfers * np.asarray(cards.latency) + cold_bytes / np.asarray(cards.bandwidth)
    link_time = (cold_bytes @ link_matrix(problem)) / np.asarray(cards.link_bandwidth)
    return np.maximum(_last_max(card_time), _last_max(link_time))


def _last_max(x: np.ndarray) -> np.ndarray:
    """[..., n] -> [...] x.max(axis=-1) as n - 1 elementwise maxima: numpy reduces a short
    last axis element by element, ten times slower (the same values: a max is exact)."""
    out = x[..., 0].copy()
    for i in range(1, x.shape[-1]):
        np.maximum(out, x[..., i], out=out)
    return out


def layer_stall(problem: Problem, placement: Placement, selected: np.ndarray) -> np.ndarray:
    """selected: [S, L, E] bool -> [S, L] float seconds each layer of each step waits."""
    cold_bytes, transfers = card_loads(problem, placement, selected)
    return stall_from_loads(problem, cold_bytes, transfers)


def step_stall(problem: Problem, placement: Placement, selected: np.ndarray) -> np.ndarray:
    """selected: [S, L, E] bool -> [S] float stall seconds of each step."""
    return layer_stall(problem, placement, selected).sum(axis=1)


def objective(problem: Problem, placement: Placement) -> float:
    """sum_k weight_k * mean_s stall(steps_k[s]) over the problem's steps, in seconds, under
    the problem's execution model."""
    return float(
        sum(st.weight * replay(problem, placement, st).step_stall.mean() for st in problem.steps)
    )


@dataclass(frozen=True)
class StepStats:
    """Replay of sampled steps against a placement. All arrays [S, L] float.

    layer_stall:    seconds each layer waits for staging.
    staged_bytes:   cold bytes staged (all cards).
    transfers:      transfers issued (all cards).
    selected_bytes: bytes of the selected experts (resident or not).
    """

    layer_stall: np.ndarray
    staged_bytes: np.ndarray
    transfers: np.ndarray
    selected_bytes: np.ndarray

    @property
    def step_stall(self) -> np.ndarray:
        """[S] stall seconds of each step."""
        return self.layer_stall.sum(axis=1)

    @property
    def hit_rate(self) -> float:
        """1 - staged / selected bytes over all steps (1.0 when nothing was selected)."""
        selected = float(self.selected_bytes.sum())
        return 1.0 - float(self.staged_bytes.sum()) / selected if selected > 0 else 1.0

    def summary(self, batch: int, base_step_s: float) -> dict[str, float]:
        """Figures per step and per token at concurrency `batch`;
        tokens/s = B / (base + mean stall)."""
        stall = self.step_stall
        step_s = base_step_s + float(stall.mean())
        return {
            "hit_rate": self.hit_rate,
            "stall_s_per_step": float(stall.mean()),
            "staged_bytes_per_token": float(self.staged_bytes.sum(axis=1).mean()) / batch,
            "transfers_per_token": float(self.transfers.sum(axis=1).mean()) / batch,
            "tokens_per_s": batch / step_s if step_s > 0 else float("inf"),
        }


def step_stats(problem: Problem, placement: Placement, selected: np.ndarray,
               hits: np.ndarray | None = None) -> StepStats:
    """selected: [S, L, E] bool -> StepStats of the replay (stage execution). hits: [S, L, E]
    bool, the selected experts a cache holds when their step comes (they cost nothing)."""
    charged = selected if hits is None else np.asarray(selected) & ~hits
    cold_bytes, transfers = card_loads(problem, placement, charged)
    return StepStats(
        layer_stall=stall_from_loads(problem, cold_bytes, transfers),
        staged_bytes=cold_bytes.sum(axis=2),
        transfers=transfers.sum(axis=2),
        selected_bytes=selected_bytes(problem, selected),
    )


def selected_bytes(problem: Problem, selected: np.ndarray) -> np.ndarray:
    """selected: [S, L, E] bool -> [S, L] float bytes of the selected experts, summed in
    integers (exact, as a float sum of these integers is; a third of the time of casting
    the mask to float)."""
    return np.einsum("sle,le->sl", np.asarray(selected, dtype=bool),
                     np.asarray(problem.expert_bytes, np.int64)).astype(np.float64)


def replay(problem: Problem, placement: Placement, steps: Steps,
           hits: np.ndarray | None = None) -> StepStats:
    """StepStats of `steps` under the problem's execution model, in chunks of steps; `hits`
    ([S, L, E] bool, stage execution only) the selected experts a cache holds.

    Under cpu execution `staged_bytes` are the cold bytes the host CPU reads and `transfers`
    the cold experts it computes."""
    selected = np.asarray(steps.selected)
    if hits is not None and problem.execution == "cpu":
        raise ValueError("a cache of staged experts needs stage execution")
    num_steps, num_layers, num_experts = selected.shape
    chunk = max(1, CHUNK_CELLS // (num_layers * num_experts))
    parts = []
    if problem.execution == "cpu":
        check_placement(problem, placement)
        cold = placement.cold_bytes(problem) > 0
        tokens = steps.token_ids()
        for start in range(0, num_steps, chunk):
            loads = cpu_loads(problem.expert_bytes, problem.expert_flops, problem.host, cold,
                              tokens[start:start + chunk])
            parts.append(StepStats(loads.layer_stall, loads.cold_bytes, loads.cold_experts,
                                   selected_bytes(problem, selected[start:start + chunk])))
    else:
        parts = [step_stats(problem, placement, selected[start:start + chunk],
                            None if hits is None else hits[start:start + chunk])
                 for start in range(0, num_steps, chunk)]
    if not parts:
        return step_stats(problem, placement, selected, hits)
    return StepStats(*(np.concatenate([getattr(p, f) for p in parts])
                       for f in ("layer_stall", "staged_bytes", "transfers", "selected_bytes")))
