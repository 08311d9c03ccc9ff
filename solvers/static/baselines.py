"""Baselines at the same budget: layer offload (what llama.cpp can express) and uniform
(a placement that knows nothing of the traffic)."""

from __future__ import annotations

import time

import numpy as np

from solvers import cost
from solvers.problem import Placement, Problem, SolveResult, validate


def layer_offload_pages(problem: Problem) -> np.ndarray:
    """[L, E] resident pages of the layer-offload baseline: the first N MoE layers' experts
    all cold on every card, N = cold_layer_count. This is what llama.cpp can express
    (`--n-cpu-moe N`, `-ot` per layer: whole expert tensors of whole layers), so `placer
    export llamacpp` runs it."""
    pages = problem.num_pages().copy()
    pages[:cold_layer_count(problem.expert_bytes, problem.home, problem.capacity)] = 0
    return pages


def cold_layer_count(expert_bytes: np.ndarray, home: np.ndarray, capacity: np.ndarray) -> int:
    """N: the fewest leading MoE layers to leave cold so that every card's experts in the
    remaining layers fit its `capacity` ([C] bytes); expert_bytes, home: [L, E]."""
    eb = np.asarray(expert_bytes, dtype=np.int64)
    num_cards = len(capacity)
    onehot = np.eye(num_cards, dtype=np.int64)[np.asarray(home)]
    per_layer = np.einsum("le,lec->lc", eb, onehot)  # [L, C] bytes each layer homes per card
    suffix = np.vstack([np.cumsum(per_layer[::-1], axis=0)[::-1],
                        np.zeros((1, num_cards), dtype=np.int64)])
    fits = np.all(suffix <= np.asarray(capacity), axis=1)
    return int(np.flatnonzero(fits)[0])  # the last row (all cold) always fits


def layer_offload(problem: Problem) -> SolveResult:
    """The layer-offload baseline (see layer_offload_pages)."""
    return _result(problem, "layer", layer_offload_pages)


def uniform_pages(problem: Problem, seed: int = 0) -> np.ndarray:
    """[L, E] resident pages of the profile-free placement (see `uniform`)."""
    rng = np.random.default_rng(seed)
    pages = problem.num_pages().copy()
    eb = np.asarray(problem.expert_bytes, dtype=np.int64)
    home = np.asarray(problem.home)
    page = eb if problem.page_bytes is None else np.full_like(eb, int(problem.page_bytes))
    for c in range(problem.num_cards):
        layers, experts = np.nonzero(home == c)
        # Round-robin over layers (in layer order), a seeded random expert order in each.
        rank = np.empty(layers.size)
        for layer in np.unique(layers):
            idx = np.flatnonzero(layers == layer)
            rank[idx] = rng.permutation(idx.size)
        order = np.lexsort((layers, rank))
        excess = int(eb[layers, experts].sum()) - int(problem.capacity[c])
        for i in order:
            if excess <= 0:
                break
            lay, e = layers[i], experts[i]
            if eb[lay, e] <= excess:  # the whole expert goes
                excess -= int(eb[lay, e])
                pages[lay, e] = 0
                continue
            # The last expert: only the tail pages that bring the card within capacity.
            keep = (int(eb[lay, e]) - excess) // int(page[lay, e])
            excess -= int(eb[lay, e]) - min(keep * int(page[lay, e]), int(eb[lay, e]))
            pages[lay, e] = keep
    return pages


def uniform(problem: Problem, top_k: int, seed: int = 0) -> SolveResult:
    """Profile-free placement: each card evicts experts in a seeded random order that takes
    the same share from every layer (round-robin over layers, a random expert of each in
    turn), whole experts until the last one, of which only the tail pages needed to fit go
    (with one page per expert: the whole expert). Deterministic given `seed`.
    `top_k` is accepted for symmetry with the CLI; a uniform router needs no more."""
    del top_k
    return _result(problem, "uniform", lambda p: uniform_pages(p, seed))


def _result(problem: Problem, name: str, pages_of) -> SolveResult:
    validate(problem, need_steps=False)
    start = time.perf_counter()
    placement = Placement(pages_of(problem))
    value = cost.objective(problem, placement) if problem.steps else float("nan")
    return SolveResult(placement, name, value, float("nan"), float("nan"),
                       time.perf_counter() - start, "heuristic")
