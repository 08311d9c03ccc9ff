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
    summed weight. Rows are compared as words of 64 bits (a lexsort, not a byte-wise unique)."""
    width = -(-packed.shape[1] // 8) * 8
    words = np.zeros((packed.shape[0], width), dtype=np.uint8)
    words[:, :packed.shape[1]] = packed
    words = words.view(np.uint64)  # [N, W]
    order = np.lexsort(words.T[::-1])
    ordered = words[order]
    first = np.concatenate([[True], (ordered[1:] != ordered[:-1]).any(axis=1)]) \
        if len(order) else np.zeros(0, bool)
    group = np.cumsum(first) - 1
    merged = np.bincount(group, weights=np.asarray(weights)[order], minlength=int(first.sum()))
    rows = np.unpackbits(packed[order[first]], axis=1, count=num_experts).astype(bool)
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


def fold_single_card(problem: Problem, layer: int, patterns: LayerPatterns) -> LayerPatterns:
    """The same objective with every single-card pattern replaced by one-expert patterns.

    A staging pattern whose selected experts are all homed on one card c, whose host link is
    at least as fast as c (so the link never binds), stalls the sum of its experts' staging
    times: summed over such patterns that is, per expert, its summed weight times its own
    staging time, i.e. one pattern {x} per expert. On one card every pattern folds, so a
    layer keeps at most E patterns however many steps were sampled."""
    home = np.asarray(problem.home)[layer]
    cards = problem.cards
    free = (np.asarray(cards.link_bandwidth)[np.asarray(cards.link_of)]
            >= np.asarray(cards.bandwidth))  # [C] the card's link never binds alone
    sel = patterns.selected
    lo = np.where(sel, home, problem.num_cards).min(axis=1)
    hi = np.where(sel, home, -1).max(axis=1)
    single = (lo == hi) & free[np.minimum(lo, problem.num_cards - 1)]
    weight = patterns.weight[single] @ sel[single]  # [E] summed weight per expert
    ones = np.flatnonzero(weight > 0)
    rows = np.concatenate([sel[~single], np.eye(problem.num_experts, dtype=bool)[ones]])
    return LayerPatterns(rows, np.concatenate([patterns.weight[~single], weight[ones]]))


def problem_patterns(problem: Problem) -> list[LayerPatterns]:
    """The patterns of the problem's own steps, for its execution model (staging: single-card
    patterns folded, see fold_single_card)."""
    if problem.execution == "cpu":
        return cpu_patterns(problem, problem.steps)
    return [fold_single_card(problem, layer, p)
            for layer, p in enumerate(layer_patterns(problem.steps, problem.num_layers))]


def selection_counts(patterns: list[LayerPatterns]) -> np.ndarray:
    """[L, E] float weighted selection frequency of each expert in the patterns."""
    return np.stack([p.weight @ p.selected for p in patterns])
