"""Baselines at the same budget: layer offload (what llama.cpp can express) and uniform
(a placement that knows nothing of the traffic)."""

from __future__ import annotations

import time

import numpy as np

from solvers import cost
from solvers.problem import Placement, Problem, SolveResult, validate


def layer_offload_pages(problem: Problem) -> np.ndarray:
    """[L, E] resident pages when each card sends whole layers of its experts to the host,
    last layers first (as llama.cpp's `--n-cpu-moe` does), until it fits its capacity."""
    pages = problem.num_pages().copy()
    eb = np.asarray(problem.expert_bytes, dtype=np.int64)
    home = np.asarray(problem.home)
    for c in range(problem.num_cards):
        mine = home == c
        resident = int(eb[mine].sum())
        for layer in reversed(range(problem.num_layers)):
            if resident <= problem.capacity[c]:
                break
            row = mine[layer]
            resident -= int(eb[layer, row].sum())
            pages[layer, row] = 0
    return pages


def layer_offload(problem: Problem) -> SolveResult:
    """The layer-offload baseline (see layer_offload_pages)."""
    return _result(problem, "layer", layer_offload_pages)


def uniform(problem: Problem, top_k: int, seed: int = 0) -> SolveResult:
    """Profile-free placement: each card evicts experts in a seeded random order that takes
    the same share from every layer, whole experts at a time, until it fits.
    `top_k` is accepted for symmetry with the CLI; a uniform router needs no more."""
    del top_k

    def pages_of(problem: Problem) -> np.ndarray:
        rng = np.random.default_rng(seed)
        pages = problem.num_pages().copy()
        eb = np.asarray(problem.expert_bytes, dtype=np.int64)
        home = np.asarray(problem.home)
        for c in range(problem.num_cards):
            layers, experts = np.nonzero(home == c)
            # round-robin over layers in a random expert order within each layer
            rank = np.empty(layers.size)
            for layer in np.unique(layers):
                idx = np.flatnonzero(layers == layer)
                rank[idx] = rng.permutation(idx.size)
            order = np.lexsort((layers, rank))
            resident = int(eb[layers, experts].sum())
            for i in order:
                if resident <= problem.capacity[c]:
                    break
                resident -= int(eb[layers[i], experts[i]])
                pages[layers[i], experts[i]] = 0
        return pages

    return _result(problem, "uniform", pages_of)


def _result(problem: Problem, name: str, pages_of) -> SolveResult:
    validate(problem, need_steps=False)
    start = time.perf_counter()
    placement = Placement(pages_of(problem))
    value = cost.objective(problem, placement) if problem.steps else float("nan")
    return SolveResult(placement, name, value, float("nan"), float("nan"),
                       time.perf_counter() - start, "heuristic")
