"""Merging sampled steps into distinct per-layer selection patterns.

The objective sum_k weight_k * mean_s sum_l layer_stall(s, l) only depends, at layer l, on
which experts step s selects there. Steps with the same selected set at a layer are merged
into one pattern whose weight sums weight_k / S_k over them; empty sets cost nothing and are
dropped. This is exact: objective = sum_l sum_n weight[l][n] * layer_stall(pattern[l][n]).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

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
    out = []
    for layer in range(num_layers):
        rows = np.concatenate([np.asarray(st.selected[:, layer, :]) for st in steps])
        weights = np.concatenate(
            [np.full(st.selected.shape[0], st.weight / st.selected.shape[0]) for st in steps]
        )
        keep = rows.any(axis=1) & (weights > 0)
        rows, weights = rows[keep], weights[keep]
        packed = np.packbits(rows, axis=1)
        _, first, inverse = np.unique(packed, axis=0, return_index=True, return_inverse=True)
        merged = np.bincount(inverse.ravel(), weights=weights, minlength=first.size)
        out.append(LayerPatterns(selected=rows[first], weight=merged))
    return out


def problem_patterns(problem: Problem) -> list[LayerPatterns]:
    """layer_patterns of the problem's own steps."""
    return layer_patterns(problem.steps, problem.num_layers)


def selection_counts(patterns: list[LayerPatterns]) -> np.ndarray:
    """[L, E] float weighted selection frequency of each expert in the patterns."""
    return np.stack([p.weight @ p.selected for p in patterns])
