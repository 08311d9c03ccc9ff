"""The placement plan: which pages of which expert stay resident on which card.

A plan is what `placer solve` writes and `placer emit` turns into files; the manifest is the
plan plus where every byte landed. Pages are cut over an expert's byte stream (its tensors'
ranges in inventory order): page i covers [i * page_size, min((i + 1) * page_size, bytes)),
one page per expert when `page_size` is None. Residency is always a prefix of pages, so an
expert's cold part is one contiguous suffix: staging it is one copy.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from placer.checkpoint.flops import expert_flops
from placer.checkpoint.inventory import Inventory
from placer.checkpoint.kv import SHAPE_KEY, kv_shape
from placer.errors import PlacerError
from placer.hardware.spec import HardwareSpec, spec_from_json
from placer.plan.check import check_plan
from placer.plan.format import (
    MANIFEST_FORMAT,
    PLACER_VERSION,
    PLAN_FORMAT,
    PLAN_VERSION,
    page_spans,
)
from placer.plan.seal import check_seal
from solvers.cache_table import DEFAULT_POLICY, policy_row
from traces.formats.bounded import read_bounded
from traces.formats.jsontext import loads_json

if TYPE_CHECKING:  # solvers.cache compiles with numba: imported where a cache is built
    from solvers.cache import CachePolicy


@dataclass(frozen=True)
class Page:
    index: int
    offset: int  # within the expert's byte stream
    length: int
    resident: bool


@dataclass(frozen=True)
class ExpertPlacement:
    layer: int
    expert: int
    card: int  # expert-parallel home: the card that computes it and stages its cold pages
    bytes: int
    pages: tuple[Page, ...]

    @property
    def resident_bytes(self) -> int:
        return sum(p.length for p in self.pages if p.resident)

    @property
    def resident_pages(self) -> int:
        return sum(p.resident for p in self.pages)


@dataclass(frozen=True)
class CardPlan:
    """One card's budget, split (solvers/staging.py): pinned (resident) expert pages, cache
    slots of `slot_bytes` each under `cache_policy`, and the staging buffer, the reserve for
    one fetch at the largest concurrency (a plan written before the reserve was kept whole
    may record less: what a fetch needs beyond the slots)."""

    index: int
    budget_bytes: int     # VRAM for expert pages, cache slots and the staging buffer
    staging_bytes: int    # the staging reserve for the largest concurrency
    resident_bytes: int   # pinned expert pages (<= capacity_bytes)
    homed_bytes: int      # all experts homed on this card
    cache_slots: int = 0  # staged experts kept for reuse, each in a slot of slot_bytes
    slot_bytes: int = 0   # the largest expert homed here (0 without slots)
    cache_policy: str | None = None  # a name of solvers/cache_table.py (None without slots)
    layer_slots: tuple[int, ...] = ()  # the slots of each MoE layer (sum: cache_slots)

    @property
    def capacity_bytes(self) -> int:
        """Bytes left for pinned pages."""
        return self.budget_bytes - self.staging_bytes - self.cache_slots * self.slot_bytes


@dataclass
class Plan:
    """A placement plan (see module docstring). `experts` is sorted by (layer, expert)."""

    model: dict                 # fingerprint, architecture, moe_layers, experts_per_layer, top_k,
    #                             the KV shape (placer.checkpoint.kv.kv_shape), ...
    hardware: HardwareSpec
    budget: dict                # how the budget was given: {"mode", "value", "concurrency"}
    page_size: int | None
    ep: str
    solver: dict                # name, objective, bound, gap, seconds, status, seed, ...
    cards: list[CardPlan]
    experts: list[ExpertPlacement]
    calibration: list[dict] = field(default_factory=list)  # profiles solved on, with counts
    predicted: list[dict] = field(default_factory=list)    # per profile and concurrency
    robust: dict | None = None
    execution: str = "stage"    # how cold experts run: staged to their card, or on the CPU
    cache: dict | None = None   # how the cache split was chosen (placer.plan.cache)
    engine: dict | None = None  # an engine's own setup (placer.plan.llamacpp), if any
    # how the cards' caches run beyond their policy's name (version 2; None: per-layer slots,
    # no weights): {"pooled": bool, "weights": [7] | [L][7] | None, "calibration": [L][E] | None,
    # "transition": [L][E][E] | None}
    cache_params: dict | None = None
    # whether the runtime prefetches the next MoE layer's predicted experts into the slots
    # (placer.plan.prefetch): {"on", "reason", "depth", "max_per_layer", "slot_share",
    # "eviction", "predicted"}; None (a plan written before it): off
    prefetch: dict | None = None

    @property
    def moe_layers(self) -> list[int]:
        return list(self.model["moe_layers"])

    @property
    def experts_per_layer(self) -> int:
        return int(self.model["experts_per_layer"])

    def matrix(self, attr: str) -> np.ndarray:
        """[L, E] array of an ExpertPlacement attribute (card, bytes, resident_pages, ...)."""
        values = np.array([getattr(e, attr) for e in self.experts], dtype=np.int64)
        return values.reshape(len(self.moe_layers), self.experts_per_layer)

    def expert(self, layer: int, expert: int) -> ExpertPlacement:
        return self.experts[self.moe_layers.index(layer) * self.experts_per_layer + expert]

    def to_json(self) -> dict:
        return {
            "format": PLAN_FORMAT, "version": PLAN_VERSION, "placer_version": PLACER_VERSION,
            "model": self.model, "hardware": self.hardware.to_json(), "budget": self.budget,
            "page_size": self.page_size, "ep": self.ep, "solver": timeless(self.solver),
            "cards": [{"index": c.index, "budget_bytes": c.budget_bytes,
                       "capacity_bytes": c.capacity_bytes, "resident_bytes": c.resident_bytes,
                       "staging_bytes": c.staging_bytes, "homed_bytes": c.homed_bytes,
                       "cache_slots": c.cache_slots, "slot_bytes": c.slot_bytes,
                       "cache_policy": c.cache_policy, "layer_slots": list(c.layer_slots)}
                      for c in self.cards],
            "experts": [{"layer": e.layer, "expert": e.expert, "card": e.card, "bytes": e.bytes,
                         "resident_bytes": e.resident_bytes,
                         "pages": [{"index": p.index, "offset": p.offset, "length": p.length,
                                    "resident": p.resident} for p in e.pages]}
                        for e in self.experts],
            "calibration": self.calibration, "predicted": self.predicted, "robust": self.robust,
            "execution": self.execution, "cache": timeless(self.cache),
            "cache_params": self.cache_params, "prefetch": self.prefetch,
        } | ({"engine": self.engine} if self.engine is not None else {})


def timeless(section: dict | None) -> dict | None:
    """A plan section without the wall-clock seconds its solve took: the same inputs and seed
    give the same plan, byte for byte (the seconds are printed, not kept)."""
    if not isinstance(section, dict):
        return section
    return {k: v for k, v in section.items() if k != "seconds"}


def plan_quotas(plan: Plan, cache_slots: int | None = None) -> np.ndarray:
    """[C, L] cache slots per card and MoE layer: the plan's, or `cache_slots` on every card,
    split evenly over the layers, when given."""
    from solvers.cache import even_quotas

    layers = len(plan.moe_layers)
    if cache_slots is not None:
        check_cache_slots(plan, cache_slots)
        return even_quotas([cache_slots] * len(plan.cards), layers)
    return np.array([c.layer_slots or (0,) * layers for c in plan.cards], dtype=np.int64)


def check_cache_slots(plan: Plan, cache_slots: int | None) -> None:
    """PlacerError unless `cache_slots` (--cache-slots: that many slots on every card instead
    of the plan's) is None or in 0..the plan's experts: the slots, split over the MoE layers,
    then hold at most a layer's experts each, and what a cache allocates (a slot's state in the
    replay, an expert's weights in the runtime) is bounded by the model's experts."""
    most = len(plan.moe_layers) * plan.experts_per_layer
    if cache_slots is not None and not 0 <= cache_slots <= most:
        raise PlacerError(f"--cache-slots must be in 0..{most} for this plan (its "
                          f"{len(plan.moe_layers)} MoE layers x {plan.experts_per_layer} "
                          f"experts: a card caches no more), got {cache_slots}")


@dataclass(frozen=True)
class PlanPolicy:
    """How a plan's cards run their caches: the policy's `name` (solvers/cache_table.py) and
    make_policy's keyword `options`: pooled, and a fitted policy's parameters (learned's
    weights, calibration feature and transition, from the plan's cache_params)."""

    name: str
    options: dict


def plan_policy(plan: Plan) -> PlanPolicy:
    """The plan's cache policy, its parameters included: the one reading of a plan's policy
    that the runtime's caches (`plan_caches`) and every replay of the plan (evaluate, bench,
    solve's prediction) go through. A plan without cache slots names none: DEFAULT_POLICY
    then (what `--cache-slots N` gives such a plan)."""
    name = next((c.cache_policy for c in plan.cards if c.cache_policy), DEFAULT_POLICY)
    params = plan.cache_params or {}
    options = {"pooled": bool(params.get("pooled", False))}
    if policy_row(name).fitted:
        options |= {key: params.get(key) for key in ("weights", "calibration", "transition")}
    return PlanPolicy(name, options)


def plan_caches(plan: Plan, cache_slots: int | None = None) -> CachePolicy:
    """Fresh caches as the plan's cards run them (`plan_policy`): each card's slots per layer
    (or pooled) under the plan's policy and its parameters, or `cache_slots` slots on every
    card instead when given."""
    from solvers.cache import make_policy

    policy = plan_policy(plan)
    return make_policy(policy.name, plan_quotas(plan, cache_slots),
                       len(plan.moe_layers) * plan.experts_per_layer, **policy.options)


def plan_from_json(d: dict, source: str = "plan") -> Plan:
    """Read a plan (or the plan part of a manifest) from its JSON form, checked first
    (`placer.plan.check`: errors name `source` and the field)."""

    check_plan(d, source)
    try:
        return Plan(
            model=d["model"], hardware=spec_from_json(d["hardware"]), budget=d["budget"],
            page_size=d["page_size"], ep=d["ep"], solver=d["solver"],
            cards=[CardPlan(c["index"], c["budget_bytes"], c["staging_bytes"],
                            c["resident_bytes"], c["homed_bytes"], c.get("cache_slots", 0),
                            c.get("slot_bytes", 0), c.get("cache_policy"),
                            tuple(c.get("layer_slots", ()))) for c in d["cards"]],
            experts=[ExpertPlacement(e["layer"], e["expert"], e["card"], e["bytes"],
                                     tuple(Page(p["index"], p["offset"], p["length"],
                                                p["resident"]) for p in e["pages"]))
                     for e in d["experts"]],
            calibration=d.get("calibration", []), predicted=d.get("predicted", []),
            robust=d.get("robust"), execution=d.get("execution", "stage"),
            cache=d.get("cache"), engine=d.get("engine"), cache_params=d.get("cache_params"),
            prefetch=d.get("prefetch"))
    except (KeyError, TypeError) as exc:
        raise PlacerError(f"malformed plan: missing or bad field {exc}") from None


def read_plan(path: Path) -> Plan:
    """Read a plan.json or manifest.json file; a manifest's bytes must be those its digest
    covers (placer.plan.seal), checked first, as every reader of a placed directory does."""
    path = Path(path)
    if path.is_dir():
        path = path / "manifest.json"
    if not path.is_file():
        raise PlacerError(f"plan not found: {path}")
    raw = read_bounded(path, "manifest" if path.name == "manifest.json" else "plan",
                       error=PlacerError)
    d = loads_json(raw, str(path), PlacerError)
    if path.name == "manifest.json" or (isinstance(d, dict)
                                        and d.get("format") == MANIFEST_FORMAT):
        check_seal(raw, d, str(path))
    return plan_from_json(d, str(path))


def build_plan(inv: Inventory, spec: HardwareSpec, *, home: np.ndarray,
               resident_pages: np.ndarray, page_size: int | None, budget_bytes: np.ndarray,
               staging_bytes: np.ndarray, budget: dict, ep: str, solver: dict,
               execution: str = "stage", quotas: np.ndarray | None = None,
               cache_policy: str | None = None, cache_params: dict | None = None) -> Plan:
    """Assemble a plan from a solved placement.

    home, resident_pages: [L, E] int (card of each expert, leading pages resident);
    budget_bytes, staging_bytes: [C] int; quotas: [C, L] cache slots per card and layer
    (None: no cache); cache_params: how the caches run beyond the policy's name (Plan).
    """
    experts = []
    for i, ex in enumerate(inv.experts):
        layer_i, e = divmod(i, inv.experts_per_layer)
        r = int(resident_pages[layer_i, e])
        spans = page_spans(ex.bytes, page_size)
        experts.append(ExpertPlacement(
            ex.layer, ex.expert, int(home[layer_i, e]), ex.bytes,
            tuple(Page(j, o, n, j < r) for j, (o, n) in enumerate(spans))))
    cards = []
    for c in range(len(spec.cards)):
        mine = [x for x in experts if x.card == c]
        layer_slots = () if quotas is None or not quotas[c].any() else tuple(map(int, quotas[c]))
        unit = max((x.bytes for x in mine), default=0) if layer_slots else 0
        cards.append(CardPlan(c, int(budget_bytes[c]), int(staging_bytes[c]),
                              sum(x.resident_bytes for x in mine), sum(x.bytes for x in mine),
                              sum(layer_slots), unit, cache_policy if layer_slots else None,
                              layer_slots))
    model = {"fingerprint": inv.fingerprint, "architecture": inv.architecture,
             "model_type": inv.model_type, "num_layers": inv.num_layers,
             "moe_layers": list(inv.moe_layers), "experts_per_layer": inv.experts_per_layer,
             "top_k": inv.top_k, "estimated": inv.estimated,
             "hidden_size": inv.config.get("hidden_size"),
             "expert_flops": expert_flops(inv).tolist(), SHAPE_KEY: kv_shape(inv.config)}
    return Plan(model, spec, budget, page_size, ep, solver, cards, experts,
                execution=execution, cache_params=cache_params)
