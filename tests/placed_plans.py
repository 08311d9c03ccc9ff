"""Plans with every kind of residency, for the emit, verify and runtime tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from placer.checkpoint.inventory import read_inventory
from placer.files import write_json_atomic
from placer.hardware.spec import parse_spec
from placer.plan.placement import build_plan

# Two cards on two host links, so both host files are written.
SPEC = parse_spec({"name": "two-links", "host_ram": "1GiB", "cards": 2,
                   "card": {"model": "toy", "vram": "64MiB", "h2d_bandwidth": "1GB/s",
                            "latency_us": 5.0},
                   "link": [{"name": "a", "cards": [0], "bandwidth": "1GB/s"},
                            {"name": "b", "cards": [1], "bandwidth": "1GB/s"}],
                   "decode": {"base_step_ms": {"1": 1.0}}})


def write_plan(inv, out: Path, resident_pages: np.ndarray, budget_bytes: np.ndarray,
               staging_bytes: np.ndarray, solver: str = "test", **kwargs) -> Path:
    """out/plan.json: `inv`'s experts with `resident_pages` [L, E] resident, homes contiguous
    over the two cards of SPEC; `kwargs` go to build_plan (page_size, quotas, ...)."""
    layers, experts = resident_pages.shape
    home = np.tile(np.arange(experts) * 2 // experts, (layers, 1))
    plan = build_plan(inv, SPEC, home=home, resident_pages=resident_pages,
                      budget_bytes=budget_bytes, staging_bytes=staging_bytes,
                      budget={"mode": "budget", "value": None, "concurrency": [1]},
                      ep="contiguous", solver={"name": solver}, **kwargs)
    path = out / "plan.json"
    write_json_atomic(plan.to_json(), path)
    return path


def mixed_plan(model: Path, out: Path, staging_bytes: int = 0) -> Path:
    """out/plan.json: fully resident, partly resident (pages of a third of the largest
    expert) and fully cold experts in turn, homes contiguous over the two cards."""
    inv = read_inventory(model)
    sizes = inv.expert_bytes()
    page = int(sizes.max()) // 3 + 1
    pages = -(-sizes // page)
    layers, experts = sizes.shape
    resident = np.array([[[pages[i, e], 1, 0][(i + e) % 3] for e in range(experts)]
                         for i in range(layers)])
    staging = np.full(2, staging_bytes)
    return write_plan(inv, out, resident, staging + (1 << 26), staging, page_size=page)


# some weights of the learned policy (age, decayed_4, decayed_16, decayed_64, calibration,
# bias): not fitted, just not an LRU
LEARNED_WEIGHTS = [-0.05, 2.0, 1.0, -0.5, 3.0, 1.5, 0.0]
LEARNED_ODD = [-1.0, 0.0, 0.5, 0.0, 1.0, 2.0, 0.0]  # odd layers' where each layer has its own


def cached_plan(model: Path, out: Path, policy: str, staging_bytes: int,
                pooled: bool = False) -> Path:
    """out/plan.json: every third expert pinned, the rest cold, and 1-3 cache slots per
    MoE layer on each card under `policy` (whole experts: what a cache split plans); pooled:
    one pool of each card's slots; learned: LEARNED_WEIGHTS (pooled: one set per layer,
    LEARNED_ODD in odd layers), some calibration frequencies and transition probabilities."""
    inv = read_inventory(model)
    sizes = inv.expert_bytes()
    layers, experts = sizes.shape
    pinned = (np.arange(layers)[:, None] + np.arange(experts)[None, :]) % 3 == 0
    quotas = np.array([[1 + (c + layer) % 3 for layer in range(layers)] for c in range(2)])
    staging = np.full(2, staging_bytes)
    slots = quotas.sum(axis=1) * int(sizes.max())
    params = {"pooled": pooled, "weights": None, "calibration": None}
    if policy == "learned":
        params |= {"weights": LEARNED_WEIGHTS if not pooled else [
                       LEARNED_ODD if layer % 2 else LEARNED_WEIGHTS for layer in range(layers)],
                   "calibration": ((np.arange(layers * experts).reshape(layers, experts) * 7
                                    % 11) / 11).tolist(),
                   "transition": (np.arange(layers * experts * experts).reshape(
                       layers, experts, experts) * 5 % 13 / 13).tolist()}
    return write_plan(inv, out, pinned.astype(np.int64), staging + slots + (1 << 26), staging,
                      page_size=None, quotas=quotas, cache_policy=policy, cache_params=params)


def resident_plan(model: Path, out: Path) -> Path:
    """out/plan.json: every expert whole and resident, homes contiguous over the two cards."""
    inv = read_inventory(model)
    return write_plan(inv, out, np.ones(inv.expert_bytes().shape, int), np.full(2, 1 << 26),
                      np.zeros(2, int), page_size=None)


def layer_plan(model: Path, out: Path, staging_bytes: int) -> Path:
    """out/plan.json: the first MoE layer's experts all cold (layer offload), the rest
    whole and resident, homes contiguous over the two cards."""
    inv = read_inventory(model)
    resident = np.ones(inv.expert_bytes().shape, dtype=int)
    resident[0] = 0
    staging = np.full(2, staging_bytes)
    return write_plan(inv, out, resident, staging + (1 << 26), staging, solver="layer",
                      page_size=None)
