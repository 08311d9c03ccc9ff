"""Sampling decode steps from per-expert selection frequencies (count-only profiles, uniform)."""

from __future__ import annotations

import numpy as np

from solvers.errors import SolverError


def gumbel_top_k(logits: np.ndarray, top_k: int, rng: np.random.Generator) -> np.ndarray:
    """logits: [N, E] float (-inf = never) -> [N, top_k] int distinct experts per row, drawn
    without replacement with probability proportional to exp(logits) (Gumbel top-k)."""
    keys = logits + rng.gumbel(size=logits.shape)
    return np.argpartition(-keys, top_k - 1, axis=1)[:, :top_k]


def steps_from_frequency(
    freq: np.ndarray, top_k: int, batch: int, num_steps: int, seed: int
) -> np.ndarray:
    """Sample decode steps in which each of `batch` tokens picks `top_k` distinct experts per
    layer with probability proportional to `freq` (independently across tokens and layers).

    freq: [L, E] non-negative float (any scale). Returns selected [S, L, E] bool, S = num_steps.
    """
    freq = np.asarray(freq, dtype=np.float64)
    if freq.ndim != 2 or not np.all(np.isfinite(freq)) or np.any(freq < 0):
        raise SolverError("freq must be a finite non-negative [L, E] array")
    num_layers, num_experts = freq.shape
    if not 1 <= top_k <= num_experts:
        raise SolverError(f"top_k must be in [1, {num_experts}], got {top_k}")
    if batch < 1 or num_steps < 1:
        raise SolverError(f"batch and num_steps must be >= 1, got {batch} and {num_steps}")
    short = np.flatnonzero((freq > 0).sum(axis=1) < top_k)
    if short.size:
        raise SolverError(
            f"layer {int(short[0])} has fewer than top_k={top_k} experts with freq > 0")
    rng = np.random.default_rng(seed)
    with np.errstate(divide="ignore"):
        logits = np.log(freq)
    selected = np.zeros((num_steps, num_layers, num_experts), dtype=bool)
    rows = np.repeat(np.arange(num_steps), batch * top_k)
    for layer in range(num_layers):
        tiled = np.broadcast_to(logits[layer], (num_steps * batch, num_experts))
        picks = gumbel_top_k(tiled, top_k, rng)
        selected[rows, layer, picks.ravel()] = True
    return selected
