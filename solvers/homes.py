"""Expert-parallel homes: which card computes (and stages) each routed expert."""

from __future__ import annotations

import numpy as np


def contiguous_homes(num_layers: int, num_experts: int, num_cards: int) -> np.ndarray:
    """[L, E] int: expert e of every layer on card e * C // E (the default EP split)."""
    row = np.arange(num_experts) * num_cards // num_experts
    return np.tile(row, (num_layers, 1)).astype(np.int64)


def balanced_homes(load: np.ndarray, expert_bytes: np.ndarray, num_cards: int) -> np.ndarray:
    """[L, E] int homes balancing selection load per layer, as EPLB's balanced packing does.

    load: [L, E] selection frequency; expert_bytes: [L, E] (ties: larger experts first).
    Per layer, experts in decreasing load go to the least-loaded card that still has room;
    every card gets ceil or floor of E / C experts, so homed bytes stay even too.
    """
    load = np.asarray(load, dtype=np.float64)
    num_layers, num_experts = load.shape
    room_of = np.full(num_cards, num_experts // num_cards)
    room_of[: num_experts % num_cards] += 1
    home = np.empty((num_layers, num_experts), dtype=np.int64)
    for layer in range(num_layers):
        order = np.lexsort((-np.asarray(expert_bytes)[layer], -load[layer]))
        card_load = np.zeros(num_cards)
        room = room_of.copy()
        for e in order:
            open_cards = np.flatnonzero(room > 0)
            c = open_cards[np.argmin(card_load[open_cards])]
            home[layer, e] = c
            card_load[c] += load[layer, e]
            room[c] -= 1
    return home
