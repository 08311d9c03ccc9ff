"""FLOPs of one token through each routed expert (the cpu execution model's compute side)."""

from __future__ import annotations

import numpy as np

from placer.checkpoint.inventory import Inventory


def weight_elements(name: str, shape: tuple[int, ...]) -> int:
    """Weights a tensor of an expert holds: quantization scales and biases hold none; an
    MXFP4 `*_blocks` byte packs two 4-bit weights."""
    leaf = name.rsplit(".", 1)[-1]
    if "scale" in leaf or "bias" in leaf:
        return 0
    n = int(np.prod(shape))
    return 2 * n if leaf.endswith("_blocks") else n


def expert_flops(inv: Inventory) -> np.ndarray:
    """[L, E] float FLOPs of one token through each expert: 2 x its weight elements (a
    multiply and an add per weight)."""
    flops = [2.0 * sum(weight_elements(t.name, t.shape) for t in e.tensors)
             for e in inv.experts]
    return np.array(flops).reshape(len(inv.moe_layers), inv.experts_per_layer)
