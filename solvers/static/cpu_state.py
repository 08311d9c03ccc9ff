"""Exact incremental evaluation of one-expert moves under cpu execution, for the greedy.

The cpu objective is a sum over "any cold" patterns (patterns.cpu_patterns): row r costs its
weight (seconds) when at least one of its experts is cold. So a state only needs each row's
number of cold experts: evicting expert x raises the objective by the weights of its rows
that had none, restoring it lowers it by the weights of its rows where it was the only one.
The interface is StallState's, so greedy.evict_to_fit and local_search run unchanged; cpu
execution keeps experts whole, so an expert is one page.
"""

from __future__ import annotations

import numpy as np

from solvers.patterns import LayerPatterns
from solvers.problem import Problem
from solvers.static.stall_state import PatternIndex


class CpuState(PatternIndex):
    """Cold experts per row of a placement. resident_pages: [L, E] int in {0, 1}, copied."""

    def __init__(self, problem: Problem, patterns: list[LayerPatterns],
                 resident_pages: np.ndarray) -> None:
        super().__init__(patterns, problem.expert_bytes.shape)
        self.num_cards = problem.num_cards
        self.expert_bytes = np.asarray(problem.expert_bytes, dtype=np.int64).ravel()
        self.card = np.asarray(problem.home).ravel().astype(np.int64)
        self.pages = np.array(resident_pages, dtype=np.int64).ravel()
        cold = (self.pages == 0).astype(np.int64)
        self.cold_count = np.bincount(self.entry_row, weights=cold[self.entry_expert],
                                      minlength=self.num_rows).astype(np.int64)
        self.evict_bytes = np.where(self.pages > 0, self.expert_bytes, 0).astype(np.float64)
        self.restore_bytes = np.where(self.pages > 0, 0, self.expert_bytes).astype(np.float64)

    def resident_pages(self) -> np.ndarray:
        """[L, E] int64 current resident pages (1 resident, 0 cold)."""
        return self.pages.reshape(self.shape).copy()

    def card_resident_bytes(self) -> np.ndarray:
        """[C] float resident bytes of each card."""
        return np.bincount(self.card, weights=(self.expert_bytes * self.pages).astype(float),
                           minlength=self.num_cards)

    def row_cost(self) -> np.ndarray:
        return (self.cold_count > 0).astype(np.float64)

    def evict_rise(self, entries: np.ndarray | slice) -> np.ndarray:
        """Objective increase of each entry's row if its expert is evicted (0 if cold)."""
        rows, x = self.entry_row[entries], self.entry_expert[entries]
        return np.where((self.pages[x] > 0) & (self.cold_count[rows] == 0),
                        self.row_weight[rows], 0.0)

    def restore_drop(self, entries: np.ndarray | slice) -> np.ndarray:
        """Objective change (<= 0) of each entry's row if its expert is restored."""
        rows, x = self.entry_row[entries], self.entry_expert[entries]
        return np.where((self.pages[x] == 0) & (self.cold_count[rows] == 1),
                        -self.row_weight[rows], 0.0)

    def move(self, x: np.ndarray, step: int) -> np.ndarray:
        """Evict (step=-1) or restore (step=+1) each expert x (flat indices of experts that
        never share a row, e.g. one per layer). Returns the rows touched."""
        x = np.asarray(x, dtype=np.int64)
        self.pages[x] += step
        self.evict_bytes[x] = np.where(self.pages[x] > 0, self.expert_bytes[x], 0)
        self.restore_bytes[x] = np.where(self.pages[x] > 0, 0, self.expert_bytes[x])
        rows = self.rows_of(x)
        np.subtract.at(self.cold_count, rows, step)
        return rows
