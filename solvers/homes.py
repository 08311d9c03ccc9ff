"""Expert-parallel homes: which card computes (and stages) each routed expert."""

from __future__ import annotations

import numpy as np

from solvers.errors import SolverError

MAX_SWAP_ROUNDS = 10_000  # per layer; a count, not a clock, to stay deterministic


def contiguous_homes(num_layers: int, num_experts: int, num_cards: int) -> np.ndarray:
    """[L, E] int: expert e of every layer on card e * C // E (the default EP split)."""
    if num_layers < 1 or num_experts < 1 or num_cards < 1:
        raise SolverError(f"need L, E, C >= 1, got {num_layers}, {num_experts}, {num_cards}")
    row = np.arange(num_experts) * num_cards // num_experts
    return np.tile(row, (num_layers, 1)).astype(np.int64)


def _lpt(load: np.ndarray, size: np.ndarray, room_of: np.ndarray) -> np.ndarray:
    """[E] card of each expert of one layer: decreasing load (ties: larger first, then lower
    index) into the least-loaded card (ties: lower index) that still has room."""
    num_cards = room_of.size
    order = np.lexsort((np.arange(load.size), -size, -load))
    card_load = np.zeros(num_cards)
    room = room_of.copy()
    home = np.empty(load.size, dtype=np.int64)
    for e in order:
        open_cards = np.flatnonzero(room > 0)
        c = open_cards[np.argmin(card_load[open_cards])]
        home[e] = c
        card_load[c] += load[e]
        room[c] -= 1
    return home


def _refine(load: np.ndarray, home: np.ndarray, num_cards: int) -> None:
    """Swap pairs of experts between the most loaded card and another while that lowers the
    pair's larger load (so the maximum never rises and counts per card never change)."""
    card_load = np.bincount(home, weights=load, minlength=num_cards)
    for _ in range(MAX_SWAP_ROUNDS):
        h = int(np.argmax(card_load))
        mine = np.flatnonzero(home == h)
        best, best_peak = None, card_load[h]
        for o in range(num_cards):
            if o == h:
                continue
            theirs = np.flatnonzero(home == o)
            if theirs.size == 0 or mine.size == 0:
                continue
            d = load[mine][:, None] - load[theirs][None, :]  # load moved from h to o
            peak = np.maximum(card_load[h] - d, card_load[o] + d)
            i, j = np.unravel_index(np.argmin(peak), peak.shape)
            if d[i, j] > 0 and peak[i, j] < best_peak - 1e-12 * max(best_peak, 1e-300):
                best, best_peak = (int(mine[i]), int(theirs[j]), o), peak[i, j]
        if best is None:
            return
        a, b, o = best
        moved = load[a] - load[b]
        home[a], home[b] = o, h
        card_load[h] -= moved
        card_load[o] += moved


def balanced_homes(load: np.ndarray, expert_bytes: np.ndarray, num_cards: int) -> np.ndarray:
    """[L, E] int homes balancing selection load per layer.

    load: [L, E] non-negative selection frequency; expert_bytes: [L, E] (load ties: larger
    experts first). Per layer: the sorted greedy of deepseek-ai/EPLB's `balanced_packing`
    (experts in decreasing load into the least-loaded card that still has room; every card
    gets floor or ceil of E / C experts, exactly E / C when C divides E, so homed bytes stay
    even too), then pairwise swaps out of the most loaded card while they lower it. The
    heaviest card's load is therefore never above the sorted greedy's.
    """
    load = np.asarray(load, dtype=np.float64)
    expert_bytes = np.asarray(expert_bytes)
    if load.ndim != 2 or load.size == 0 or expert_bytes.shape != load.shape:
        raise SolverError(f"load and expert_bytes must be [L, E] arrays of one shape, got "
                          f"{load.shape} and {expert_bytes.shape}")
    if not np.all(np.isfinite(load)) or np.any(load < 0):
        raise SolverError("load must be finite and non-negative")
    if num_cards < 1:
        raise SolverError(f"need at least one card, got {num_cards}")
    num_layers, num_experts = load.shape
    room_of = np.full(num_cards, num_experts // num_cards)
    room_of[: num_experts % num_cards] += 1
    home = np.empty((num_layers, num_experts), dtype=np.int64)
    for layer in range(num_layers):
        home[layer] = _lpt(load[layer], expert_bytes[layer], room_of)
        _refine(load[layer], home[layer], num_cards)
    return home
