"""What each card reserves for cold experts in flight: cache slots and the staging buffer.

A fetch (one layer's selected cold experts homed on a card) needs all its experts on the
device at once: at most n = min(B * k, the most experts the card homes in one layer). Misses
go into cache slots (`solvers.cache`), and only what the slots cannot take (every slot holds
an expert of the same fetch) into the staging buffer. A layer's fetch uses only its own
layer's q_l slots, so the buffer holds max(0, n - min_l q_l) experts at most. Every slot and
every part of the buffer is as large as the card's largest expert, so a card's VRAM for
experts splits as

    pinned pages + S * unit + max(0, n - min_l q_l) * unit <= budget,
    S = sum_l q_l,   unit = largest expert on c.

With no slots that is the plain staging buffer of n experts.
"""

from __future__ import annotations

import numpy as np


def fetch_limit(home: np.ndarray, num_cards: int, max_batch: int, top_k: int) -> np.ndarray:
    """[C] int64: the most cold experts one layer's fetch can need on each card."""
    home = np.asarray(home)
    per_layer = np.stack([(home == c).sum(axis=1) for c in range(num_cards)], axis=1)  # [L, C]
    return np.minimum(max_batch * top_k, per_layer.max(axis=0)).astype(np.int64)


def slot_unit(expert_bytes: np.ndarray, home: np.ndarray, num_cards: int) -> np.ndarray:
    """[C] int64: the largest expert homed on each card (0 for a card that homes none)."""
    expert_bytes, home = np.asarray(expert_bytes, dtype=np.int64), np.asarray(home)
    return np.array([int(expert_bytes[home == c].max(initial=0)) for c in range(num_cards)],
                    dtype=np.int64)


def staging_bytes(expert_bytes: np.ndarray, home: np.ndarray, num_cards: int, max_batch: int,
                  top_k: int) -> np.ndarray:
    """[C] int64 staging buffer per card with no cache slots (a cache split sizes its own:
    solvers/cache/split.py).

    expert_bytes, home: [L, E]. A card that homes no expert needs none."""
    limit = fetch_limit(home, num_cards, max_batch, top_k)
    return limit * slot_unit(expert_bytes, home, num_cards)


def cache_only_slots(units: np.ndarray, limit: np.ndarray, layers: int) -> np.ndarray:
    """[C] the most cache slots each card's budget of `units` experts holds with nothing
    pinned, spread evenly over its `layers` layers: S slots leave the smallest layer
    floor(S / L), so the staging buffer holds max(0, limit - floor(S / L)) experts beside."""
    out = np.zeros(len(units), dtype=np.int64)
    for c, (room, n) in enumerate(zip(units, limit, strict=True)):
        slots = int(room)
        while slots > 0 and slots + max(0, int(n) - slots // layers) > room:
            slots -= 1
        out[c] = slots
    return out
