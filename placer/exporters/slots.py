"""Static expert-parallel slots, as SGLang and TensorRT-LLM both lay them out."""

from __future__ import annotations

import numpy as np

from placer.errors import PlacerError
from placer.plan.placement import Plan


def home_slots(plan: Plan, engine: str) -> tuple[int, np.ndarray]:
    """(slots per card, [MoE layers, cards x slots] expert ids): each card's slots list the
    experts homed on it (ascending), then replicas of them cyclically up to the largest
    per-card count of any layer. Both engines give every EP rank the same number of slots
    per layer, so a card that homes no expert of a layer is refused."""
    home = plan.matrix("card")
    num_cards = len(plan.cards)
    per_card = np.stack([np.bincount(row, minlength=num_cards) for row in home])
    if per_card.min() == 0:
        layer, card = np.argwhere(per_card == 0)[0]
        raise PlacerError(f"card {card} homes no expert of MoE layer {plan.moe_layers[layer]}: "
                          f"{engine} gives every EP rank the same number of expert slots per "
                          "layer, and a slot there would move some expert off its home")
    slots = int(per_card.max())
    rows = np.zeros((len(home), num_cards * slots), dtype=np.int64)
    for ordinal, layer_home in enumerate(home):
        for card in range(num_cards):
            mine = np.flatnonzero(layer_home == card)
            rows[ordinal, card * slots:(card + 1) * slots] = mine[np.arange(slots) % len(mine)]
    return slots, rows
