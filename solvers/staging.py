"""What each card reserves for cold experts in flight: cache slots and the staging buffer.

A fetch (one layer's selected cold experts homed on a card) needs all its experts on the
device at once: at most n = min(B * k, the most experts the card homes in one layer), B the
largest concurrency solved for. Misses go into cache slots (`solvers.cache`), and what the
slots cannot take (every slot holds an expert of the same fetch) into the staging buffer.

The staging buffer is a reserve of n experts whatever the slots: slots are counted as expert
VRAM, like pinned pages, and never as staging. Every slot and every part of the buffer is as
large as the card's largest expert, so a card's VRAM for experts splits as

    pinned pages + S * unit <= budget - n * unit   (the card's capacity),
    S = sum_l q_l,   unit = largest expert on c.

The capacity is what every line judged at the budget holds in VRAM (the plan's pins and
slots, layer offload's resident layers, a plain cache's slots, a static placement's pins),
so `solve --offload X` keeps at most 1 - X of a card's homed expert bytes in VRAM and the
baselines get the same expert VRAM as the placement. Slots could double as staging (a fetch
whose layer has q_l >= n slots needs no buffer at run time), but counting them so would hand
the placement n experts of cache the layer-offload baseline cannot use beside its own buffer.
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


def cache_only_slots(units: np.ndarray, limit: np.ndarray) -> np.ndarray:
    """[C] the most cache slots each card's budget of `units` experts holds with nothing
    pinned: all of it but the staging reserve of `limit` experts (none below 0)."""
    return np.maximum(0, np.asarray(units, dtype=np.int64) - np.asarray(limit, dtype=np.int64))
