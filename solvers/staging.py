"""The staging buffer each card reserves before any expert page is placed."""

from __future__ import annotations

import numpy as np


def staging_bytes(expert_bytes: np.ndarray, home: np.ndarray, num_cards: int, max_batch: int,
                  top_k: int) -> np.ndarray:
    """[C] int64 staging bytes per card.

    expert_bytes, home: [L, E]. One layer's fetch must fit: at most min(B * k, the most
    experts card c homes in one layer) experts, each at most the largest expert homed on c.
    A card that homes no expert needs none.
    """
    expert_bytes = np.asarray(expert_bytes, dtype=np.int64)
    home = np.asarray(home)
    out = np.zeros(num_cards, dtype=np.int64)
    for c in range(num_cards):
        mine = home == c
        if not mine.any():
            continue
        per_layer = int(mine.sum(axis=1).max())
        out[c] = min(max_batch * top_k, per_layer) * int(expert_bytes[mine].max())
    return out
