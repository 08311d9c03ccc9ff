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


def step_weights(steps: list[Steps]) -> np.ndarray:
    """[sum_k S_k] weight of each step of every profile: weight_k / S_k."""
    return np.concatenate(
        [np.full(st.selected.shape[0], st.weight / st.selected.shape[0]) for st in steps])


def layer_patterns(steps: list[Steps], layer: int, weights: np.ndarray) -> LayerPatterns:
    """The steps of every profile at `layer` merged into distinct weighted patterns
    (`weights`: step_weights(steps))."""
    num_experts = steps[0].selected.shape[2] if steps else 0
    return merge(np.concatenate([np.packbits(st.selected[:, layer, :], axis=1)
                                 for st in steps]), weights, num_experts)


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


def single_card_layers(problem: Problem) -> np.ndarray:
    """[L] bool: every expert of the layer is homed on one card whose host link never binds
    alone, so every staging pattern of the layer is single-card (see fold_single_card)."""
    home = np.asarray(problem.home)
    cards = problem.cards
    free = (np.asarray(cards.link_bandwidth)[np.asarray(cards.link_of)]
            >= np.asarray(cards.bandwidth))
    return (home.min(axis=1) == home.max(axis=1)) & free[home[:, 0]]


def expert_patterns(frequency: np.ndarray) -> LayerPatterns:
    """One one-expert pattern per expert of positive weighted frequency ([E] float)."""
    ones = np.flatnonzero(frequency > 0)
    return LayerPatterns(np.eye(frequency.size, dtype=bool)[ones], frequency[ones])


def problem_patterns(problem: Problem) -> list[LayerPatterns]:
    """The patterns of the problem's own steps, for its execution model (staging: single-card
    patterns folded, see fold_single_card).

    Staging cost: O(S L E) to read the steps; a layer that lives on one card (every layer of
    a one-card box) is then its E weighted selection frequencies, with no merging; any other
    layer merges its S rows (a lexsort, O(S log S) word comparisons) and keeps at most the
    distinct patterns with more than one card, plus E one-expert patterns."""
    if problem.execution == "cpu":
        return cpu_patterns(problem, problem.steps)
    steps = problem.steps
    weights = step_weights(steps)
    single = single_card_layers(problem)
    frequency = sum((st.weight / st.selected.shape[0] * st.selected.sum(axis=0, dtype=np.int64)
                     for st in steps), np.zeros(problem.expert_bytes.shape))  # [L, E]
    return [expert_patterns(frequency[layer]) if single[layer]
            else fold_single_card(problem, layer, layer_patterns(steps, layer, weights))
            for layer in range(problem.num_layers)]


def selection_counts(patterns: list[LayerPatterns]) -> np.ndarray:
    """[L, E] float weighted selection frequency of each expert in the patterns."""
    return np.stack([p.weight @ p.selected for p in patterns])
