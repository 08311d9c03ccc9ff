"""Merging sampled steps into distinct per-layer selection patterns.

Staging: the objective sum_k weight_k * mean_s sum_l layer_stall(s, l) only depends, at layer
l, on which experts step s selects there. Steps with the same selected set at a layer are
merged into one pattern whose weight sums weight_k / S_k over them; empty sets cost nothing
and are dropped. This is exact: objective = sum_l sum_n weight[l][n] * layer_stall(pattern).

CPU execution (solvers/cpu.py): the objective is a sum of terms, each paid once when any
expert of a set is cold (a step's selected set: sync; a token's set: its round trip; a single
expert: its CPU time summed over the steps selecting it). Patterns are those sets, merged,
with their weights in seconds: objective = sum_l sum_n weight[l][n] * [pattern n has a cold
expert]. Either way the number of patterns is at most the number of distinct sets, so it
grows sublinearly with the calibration traffic once sets repeat (and at most E per layer for
the single-expert terms, which the MILP folds into its objective: milp_model.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from solvers.cpu import cpu_rows
from solvers.problem import Problem, Steps


@dataclass(frozen=True)
class LayerPatterns:
    """Distinct non-empty selection patterns of one layer.

    selected: [N, E] bool; weight: [N] float (> 0).
    """

    selected: np.ndarray
    weight: np.ndarray


def layer_patterns(steps: list[Steps], num_layers: int) -> list[LayerPatterns]:
    """Merge the steps of every profile into distinct weighted patterns, one list entry per
    layer (L entries)."""
    num_experts = steps[0].selected.shape[2] if steps else 0
    weights = np.concatenate(
        [np.full(st.selected.shape[0], st.weight / st.selected.shape[0]) for st in steps])
    return [merge(np.concatenate([np.packbits(st.selected[:, layer, :], axis=1)
                                  for st in steps]), weights, num_experts)
            for layer in range(num_layers)]


def merge(packed: np.ndarray, weights: np.ndarray, num_experts: int) -> LayerPatterns:
    """Distinct non-empty rows of `packed` ([N, ceil(E / 8)] uint8 bit rows) with positive
    summed weight."""
    _, first, inverse = np.unique(packed, axis=0, return_index=True, return_inverse=True)
    merged = np.bincount(inverse.ravel(), weights=weights, minlength=first.size)
    rows = np.unpackbits(packed[first], axis=1, count=num_experts).astype(bool)
    keep = rows.any(axis=1) & (merged > 0)
    return LayerPatterns(selected=rows[keep], weight=merged[keep])


def cpu_patterns(problem: Problem, steps: list[Steps]) -> list[LayerPatterns]:
    """The cpu execution objective of `steps` as merged "any cold" patterns (weights in
    seconds; see module docstring), one list entry per layer."""
    tokens = [st.token_ids() for st in steps]
    out = []
    for layer in range(problem.num_layers):
        packed, weights = [], []
        for st, ids in zip(steps, tokens, strict=True):
            rows, w = cpu_rows(problem.expert_bytes, problem.expert_flops, problem.host,
                               ids, st.weight / st.selected.shape[0], layer)
            packed += rows
            weights += w
        out.append(merge(np.concatenate(packed), np.concatenate(weights), problem.num_experts))
    return out


def problem_patterns(problem: Problem) -> list[LayerPatterns]:
    """The patterns of the problem's own steps, for its execution model."""
    if problem.execution == "cpu":
        return cpu_patterns(problem, problem.steps)
    return layer_patterns(problem.steps, problem.num_layers)


def selection_counts(patterns: list[LayerPatterns]) -> np.ndarray:
    """[L, E] float weighted selection frequency of each expert in the patterns."""
    return np.stack([p.weight @ p.selected for p in patterns])
