"""Validate a plan (or the plan part of a manifest) as read from JSON, before anything uses it.

`placer.plan.placement.plan_from_json` calls `check_plan` on every plan it reads, so emit,
evaluate, export and run all refuse the same bad plans with the same one line: the first
problem, naming the file and the field ("plan.json: experts[12].pages[1].length: ..."). What
is checked: the types of every field a command reads, that every (layer, expert) is listed
once and in order, that indices are in range, that each expert's pages tile its bytes with a
resident prefix, that the recorded resident and homed bytes agree with the pages, that each
card's resident pages, cache slots (each large enough for any expert the card homes, under a
known policy) and staging buffer fit its budget and its card in the plan's hardware
(validated as a hardware spec), and that calibration counts are [L, E] of finite counts.
"""

from __future__ import annotations

import copy
import json
import math
from functools import cache
from importlib import resources
from typing import Any

import jsonschema

from placer.errors import PlacerError
from placer.hardware.spec import HardwareSpec, spec_from_json
from placer.hardware.spec_values import MAX_BYTES
from placer.plan.engine_check import check_engine
from placer.plan.format import (
    MANIFEST_FORMAT,
    MANIFEST_VERSION,
    PLAN_FORMAT,
    READ_VERSIONS,
    page_spans,
)
from placer.plan.options import LEARNED_FEATURES
from solvers.cache_table import POLICY_NAMES
from traces.errors import first_line
from traces.options import MAX_PLAN_SLOTS

REQUIRED = ("model", "hardware", "budget", "page_size", "ep", "solver", "cards", "experts")
CARD_BYTES = ("budget_bytes", "staging_bytes", "resident_bytes", "homed_bytes")
MAX_SLOTS = MAX_PLAN_SLOTS  # cache slots per card
# An expert's FLOPs per token: 6 x hidden x inter is 7e12 at 2**20 x 2**20; past 1e15 a
# figure is a typo, and 1e308 overflows the replay's arithmetic (numpy's warnings, inf).
MAX_EXPERT_FLOPS = 1e15
# A calibration count: selections of one expert, exact in float64 up to 2**53; past it (1e308)
# the drift's sums overflow (numpy's warnings) instead of being refused.
MAX_CALIBRATION_COUNT = 2**53


class _Where:
    """Raises PlacerError naming the file and the field path."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, field: str, problem: str) -> None:
        raise PlacerError(f"{self.source}: {field}: {problem}")


def check_plan(d: Any, source: str) -> None:
    """Raise a one-line PlacerError for the first problem of plan JSON `d` read from `source`."""
    w = _Where(source)
    if not isinstance(d, dict):
        raise PlacerError(f"{source}: expected a JSON object (a placer plan), got "
                          f"{_kind(d)}")
    if d.get("format") not in (PLAN_FORMAT, MANIFEST_FORMAT):
        raise PlacerError(f"{source}: not a placer plan or manifest "
                          f"(no 'format': '{PLAN_FORMAT}')")
    versions = READ_VERSIONS + ((MANIFEST_VERSION,) if d["format"] == MANIFEST_FORMAT else ())
    if d.get("version") not in versions:
        raise PlacerError(f"{source}: plan version {d.get('version')!r} is not supported "
                          f"(this placer reads versions {', '.join(map(str, versions))})")
    for key in REQUIRED:
        if key not in d:
            w.fail(key, "missing")
    layers, experts_per_layer = _check_model(w, d["model"])
    spec = spec_from_json(d["hardware"], source)
    page_size = d["page_size"]
    if page_size is not None and not _int_in(page_size, 1, MAX_BYTES):
        w.fail("page_size", f"expected null or a positive integer, got {page_size!r}")
    flops = d["model"].get("expert_flops")
    if flops is not None and not (
            isinstance(flops, list) and len(flops) == len(layers)
            and all(isinstance(row, list) and len(row) == experts_per_layer
                    and all(_number(v) and math.isfinite(v) and 0 <= v <= MAX_EXPERT_FLOPS
                            for v in row)
                    for row in flops)):
        w.fail("model.expert_flops", f"expected [{len(layers)}][{experts_per_layer}] "
               f"finite numbers in 0..{MAX_EXPERT_FLOPS:g} (an expert's FLOPs per token)")
    cards = _check_cards(w, d["cards"], spec, len(layers))
    sums = _check_experts(w, d["experts"], layers, experts_per_layer, len(cards), page_size)
    for c, card in enumerate(cards):
        resident, homed, largest = sums[c]
        if card.get("cache_slots", 0) and card.get("slot_bytes", 0) < largest:
            w.fail(f"cards[{c}].slot_bytes", f"{card['slot_bytes']}, but card {c} homes an "
                   f"expert of {largest} bytes: a cache slot must hold any of them")
        if card["resident_bytes"] != resident:
            w.fail(f"cards[{c}].resident_bytes", f"{card['resident_bytes']} but the resident "
                   f"pages of the experts homed on card {c} hold {resident}")
        if card["homed_bytes"] != homed:
            w.fail(f"cards[{c}].homed_bytes", f"{card['homed_bytes']} but the experts homed on "
                   f"card {c} hold {homed}")
    _check_calibration(w, d.get("calibration", []), len(layers), experts_per_layer)
    _check_sections(w, d)
    _check_cache_params(w, d, cards, len(layers), experts_per_layer)
    if d.get("engine") is not None:
        check_engine(d, source, layers, cards)


@cache
def plan_schema() -> dict:
    """The plan's JSON Schema (draft 2020-12), shipped as placer/plan/schema/plan.schema.json."""
    return json.loads(resources.files("placer.plan").joinpath("schema/plan.schema.json")
                      .read_text())


@cache
def _sections_validator() -> jsonschema.Draft202012Validator:
    """The schema with `experts` and `cards` only typed as lists: their items are walked by
    _check_experts and _check_cards (the same types, with the cross-field rules), which take
    milliseconds where jsonschema takes seconds over the 15k experts of a 61 x 256 model."""
    schema = copy.deepcopy(plan_schema())
    schema["properties"]["experts"] = schema["properties"]["cards"] = {"type": "array"}
    return jsonschema.Draft202012Validator(schema)


def _check_sections(w: _Where, d: dict) -> None:
    """Every section of plan `d` against the shipped schema: the first error (the shallowest,
    then first in the file) names its field."""
    error = min(_sections_validator().iter_errors(d),
                key=lambda e: (len(e.absolute_path), list(map(str, e.absolute_path))),
                default=None)
    if error is not None:
        field = "".join(f"[{p}]" if isinstance(p, int) else f".{p}"
                        for p in error.absolute_path).lstrip(".") or "(top level)"
        w.fail(field, first_line(error.message))


def _check_model(w: _Where, model: Any) -> tuple[list[int], int]:
    """The plan's MoE layers and experts per layer, after checking `model`'s fields."""
    if not isinstance(model, dict):
        w.fail("model", f"expected an object, got {_kind(model)}")
    for key in ("fingerprint", "moe_layers", "experts_per_layer", "top_k"):
        if key not in model:
            w.fail(f"model.{key}", "missing")
    if not isinstance(model["fingerprint"], str):
        w.fail("model.fingerprint", f"expected a string, got {model['fingerprint']!r}")
    layers = model["moe_layers"]
    if not isinstance(layers, list) or not layers:
        w.fail("model.moe_layers", f"expected a non-empty list of layer indices, got "
               f"{_kind(layers)}")
    for i, layer in enumerate(layers):
        if not _int_in(layer, 0, 1 << 20):
            w.fail(f"model.moe_layers[{i}]", f"expected a layer index, got {layer!r}")
        if i and layer <= layers[i - 1]:
            w.fail("model.moe_layers", f"expected increasing layer indices, got {layers}")
    num_layers = model.get("num_layers", layers[-1] + 1)
    if not _int_in(num_layers, layers[-1] + 1, 1 << 20):
        w.fail("model.num_layers", f"expected an integer > {layers[-1]} (the last MoE layer), "
               f"got {num_layers!r}")
    experts = model["experts_per_layer"]
    if not _int_in(experts, 1, 1 << 20):
        w.fail("model.experts_per_layer", f"expected a positive integer, got {experts!r}")
    if not _int_in(model["top_k"], 1, experts):
        w.fail("model.top_k", f"expected an integer in 1..{experts} (experts per layer), got "
               f"{model['top_k']!r}")
    if not isinstance(model.get("estimated", False), bool):
        w.fail("model.estimated", f"expected true or false, got {model['estimated']!r}")
    return layers, experts


def _check_cards(w: _Where, cards: Any, spec: HardwareSpec, layers: int) -> list[dict]:
    """The card objects, after checking each fits its budget and its card in `spec`."""
    if not isinstance(cards, list):
        w.fail("cards", f"expected a list, got {_kind(cards)}")
    if len(cards) != len(spec.cards):
        w.fail("cards", f"{len(cards)} cards, but the plan's hardware has {len(spec.cards)}")
    for c, card in enumerate(cards):
        at = f"cards[{c}]"
        if not isinstance(card, dict):
            w.fail(at, f"expected an object, got {_kind(card)}")
        if card.get("index") != c or not _int_in(card.get("index"), 0, c):
            w.fail(f"{at}.index", f"expected {c}, got {card.get('index')!r}")
        for key in CARD_BYTES:
            if key not in card:
                w.fail(f"{at}.{key}", "missing")
            if not _int_in(card[key], 0, MAX_BYTES):
                w.fail(f"{at}.{key}", f"expected a byte count >= 0, got {card[key]!r}")
        budget, staging, resident = (card[k] for k in CARD_BYTES[:3])
        cached = _check_cache(w, at, card, layers)
        if "capacity_bytes" in card and card["capacity_bytes"] != budget - staging - cached:
            w.fail(f"{at}.capacity_bytes", f"{card['capacity_bytes']!r}, but budget_bytes - "
                   f"staging_bytes - cache_slots x slot_bytes is {budget - staging - cached}")
        used = (f"{resident} resident + {staging} staging"
                + (f" + {cached} cache" if cached else "") + " bytes")
        if resident + staging + cached > budget:
            w.fail(f"{at}.resident_bytes", f"card {c} is over its budget: {used} > budget_bytes "
                   f"{budget}")
        free = spec.cards[c].free_bytes
        if resident + staging + cached > free:
            w.fail(f"{at}.resident_bytes", f"card {c} is over its VRAM in the plan's hardware: "
                   f"{used} > {free} free (vram minus reserved)")
    return cards


def _check_cache(w: _Where, at: str, card: dict, layers: int) -> int:
    """The bytes of a card's cache slots, after checking cache_slots, layer_slots,
    slot_bytes and cache_policy (all optional: a plan without them has no cache)."""
    slots, unit = card.get("cache_slots", 0), card.get("slot_bytes", 0)
    policy, per_layer = card.get("cache_policy"), card.get("layer_slots", [])
    if not _int_in(slots, 0, MAX_SLOTS):
        w.fail(f"{at}.cache_slots", f"expected a slot count in 0..{MAX_SLOTS}, got {slots!r}")
    if not (isinstance(per_layer, list) and all(_int_in(n, 0, MAX_SLOTS) for n in per_layer)
            and len(per_layer) in ((layers,) if slots else (0, layers))):
        w.fail(f"{at}.layer_slots", f"expected {layers} slot counts (one per MoE layer)"
               f"{'' if slots else ' or none'}, got {per_layer!r}")
    if sum(per_layer) != slots:
        w.fail(f"{at}.layer_slots", f"they sum to {sum(per_layer)}, but cache_slots is {slots}")
    if not _int_in(unit, 0, MAX_BYTES):
        w.fail(f"{at}.slot_bytes", f"expected a byte count >= 0, got {unit!r}")
    if slots and policy not in POLICY_NAMES:
        w.fail(f"{at}.cache_policy", f"expected one of {', '.join(POLICY_NAMES)} for "
               f"{slots} cache slots, got {policy!r}")
    if not slots and policy is not None:
        w.fail(f"{at}.cache_policy", f"expected null without cache slots, got {policy!r}")
    if slots * unit > MAX_BYTES:
        w.fail(f"{at}.cache_slots", f"{slots} slots of {unit} bytes is beyond any card")
    return slots * unit


def _check_cache_params(w: _Where, d: dict, cards: list[dict], layers: int, experts: int
                        ) -> None:
    """cache_params (version 2; absent or null: per-layer slots, no weights): pooled, and the
    learned policy's weights and calibration frequencies, which it requires, and its
    transition probabilities (null: none)."""
    params = d.get("cache_params")
    learned = any(c.get("cache_policy") == "learned" for c in cards)
    if params is None:
        if learned:
            w.fail("cache_params", "expected the learned cache policy's weights and "
                   "calibration frequencies, got none")
        return
    if d["version"] < 2:
        w.fail("cache_params", f"a version {d['version']} plan has none, got {_kind(params)}")
    if not isinstance(params, dict):
        w.fail("cache_params", f"expected null or an object, got {_kind(params)}")
    if not isinstance(params.get("pooled", False), bool):
        w.fail("cache_params.pooled", f"expected true or false, got {params['pooled']!r}")
    weights, freqs = params.get("weights"), params.get("calibration")

    def one_set(row: Any) -> bool:
        return isinstance(row, list) and len(row) == len(LEARNED_FEATURES) and all(
            _number(v) and math.isfinite(v) for v in row)

    if (weights is not None or learned) and not (one_set(weights) or (
            isinstance(weights, list) and len(weights) == layers
            and all(one_set(row) for row in weights))):
        w.fail("cache_params.weights", f"expected {len(LEARNED_FEATURES)} finite numbers "
               f"({', '.join(LEARNED_FEATURES)}), or [{layers}] rows of them (one per layer), "
               f"got {repr(weights)[:80]}")
    if (freqs is not None or learned) and not (
            isinstance(freqs, list) and len(freqs) == layers
            and all(isinstance(row, list) and len(row) == experts
                    and all(_number(v) and math.isfinite(v) for v in row) for row in freqs)):
        w.fail("cache_params.calibration", f"expected [{layers}][{experts}] finite numbers "
               "(each expert's calibration frequency)")
    moves = params.get("transition")
    if moves is not None and not (
            isinstance(moves, list) and len(moves) == layers and all(
                isinstance(rows, list) and len(rows) == experts and all(
                    isinstance(row, list) and len(row) == experts
                    and all(_number(v) and math.isfinite(v) for v in row) for row in rows)
                for rows in moves)):
        w.fail("cache_params.transition", f"expected null or [{layers}][{experts}][{experts}] "
               "finite numbers (the learned policy's next-step selection probabilities)")


def _check_experts(w: _Where, experts: Any, layers: list[int], per_layer: int, num_cards: int,
                   page_size: int | None) -> list[tuple[int, int]]:
    """[(resident bytes, homed bytes, largest expert)] per card, after checking every expert
    and its pages."""
    if not isinstance(experts, list):
        w.fail("experts", f"expected a list, got {_kind(experts)}")
    if not experts:
        w.fail("experts", "the plan lists no experts")
    position = {layer: i for i, layer in enumerate(layers)}
    seen: dict[tuple[int, int], int] = {}
    sums = [[0, 0, 0] for _ in range(num_cards)]
    for i, e in enumerate(experts):
        at = f"experts[{i}]"
        if not isinstance(e, dict):
            w.fail(at, f"expected an object, got {_kind(e)}")
        for key in ("layer", "expert", "card", "bytes", "pages"):
            if key not in e:
                w.fail(f"{at}.{key}", "missing")
        if not _int_in(e["layer"], 0, 1 << 20) or e["layer"] not in position:
            w.fail(f"{at}.layer", f"{e['layer']!r} is not a MoE layer of the model "
                   f"({layers[0]}..{layers[-1]})")
        if not _int_in(e["expert"], 0, per_layer - 1):
            w.fail(f"{at}.expert", f"expected an expert index in 0..{per_layer - 1}, got "
                   f"{e['expert']!r}")
        if not _int_in(e["card"], 0, num_cards - 1):
            w.fail(f"{at}.card", f"expected a card index in 0..{num_cards - 1}, got "
                   f"{e['card']!r}")
        key = (e["layer"], e["expert"])
        if key in seen:
            w.fail(f"{at}", f"layer {key[0]} expert {key[1]} is listed twice "
                   f"(also experts[{seen[key]}])")
        seen[key] = i
        resident = _check_pages(w, at, e, page_size)
        sums[e["card"]][0] += resident
        sums[e["card"]][1] += e["bytes"]
        sums[e["card"]][2] = max(sums[e["card"]][2], e["bytes"])
    for layer in layers:
        for expert in range(per_layer):
            if (layer, expert) not in seen:
                w.fail("experts", f"layer {layer} expert {expert} is missing")
    for i, e in enumerate(experts):
        want = (layers[i // per_layer], i % per_layer)
        if (e["layer"], e["expert"]) != want:
            w.fail(f"experts[{i}]", f"expected layer {want[0]} expert {want[1]} here (experts "
                   f"sorted by layer, then expert), got layer {e['layer']} expert "
                   f"{e['expert']}")
    return [(r, h, m) for r, h, m in sums]


def _check_pages(w: _Where, at: str, e: dict, page_size: int | None) -> int:
    """The resident bytes of expert `e`, after checking its pages tile its bytes."""
    nbytes, pages = e["bytes"], e["pages"]
    if not _int_in(nbytes, 1, MAX_BYTES):
        w.fail(f"{at}.bytes", f"expected a positive byte count, got {nbytes!r}")
    if not isinstance(pages, list) or not pages:
        w.fail(f"{at}.pages", f"expected a non-empty list of pages, got {_kind(pages)}")
    offset, resident, cold_seen = 0, 0, False
    for j, p in enumerate(pages):
        where = f"{at}.pages[{j}]"
        if not isinstance(p, dict):
            w.fail(where, f"expected an object, got {_kind(p)}")
        for key in ("index", "offset", "length", "resident"):
            if key not in p:
                w.fail(f"{where}.{key}", "missing")
        if p["index"] != j or not _int_in(p["index"], 0, j):
            w.fail(f"{where}.index", f"expected {j}, got {p['index']!r}")
        if p["offset"] != offset or not _int_in(p["offset"], 0, MAX_BYTES):
            w.fail(f"{where}.offset", f"expected {offset} (pages tile the expert in order), "
                   f"got {p['offset']!r}")
        if not _int_in(p["length"], 1, MAX_BYTES):
            w.fail(f"{where}.length", f"expected a positive byte count, got {p['length']!r}")
        if offset + p["length"] > nbytes:
            w.fail(f"{where}.length", f"page [{offset}, {offset + p['length']}) runs past the "
                   f"end of the expert ({nbytes} bytes)")
        if not isinstance(p["resident"], bool):
            w.fail(f"{where}.resident", f"expected true or false, got {p['resident']!r}")
        if p["resident"] and cold_seen:
            w.fail(f"{where}.resident", "a resident page after a cold one (residency must be "
                   "a prefix of the pages)")
        cold_seen = cold_seen or not p["resident"]
        resident += p["length"] if p["resident"] else 0
        offset += p["length"]
    if offset != nbytes:
        w.fail(f"{at}.pages", f"pages cover {offset} of the expert's {nbytes} bytes")
    spans = [(p["offset"], p["length"]) for p in pages]
    if spans != page_spans(nbytes, page_size):
        w.fail(f"{at}.pages", f"pages are not cut by page_size {page_size} "
               f"(expected {len(page_spans(nbytes, page_size))} pages)")
    if "resident_bytes" in e and e["resident_bytes"] != resident:
        w.fail(f"{at}.resident_bytes", f"{e['resident_bytes']!r}, but its resident pages hold "
               f"{resident}")
    return resident


def _check_calibration(w: _Where, calibration: Any, layers: int, experts: int) -> None:
    if not isinstance(calibration, list):
        w.fail("calibration", f"expected a list, got {_kind(calibration)}")
    for i, entry in enumerate(calibration):
        if not isinstance(entry, dict):
            w.fail(f"calibration[{i}]", f"expected an object, got {_kind(entry)}")
        counts = entry.get("counts")
        if counts is None:
            continue
        if (not isinstance(counts, list) or len(counts) != layers
                or not all(isinstance(row, list) and len(row) == experts for row in counts)):
            w.fail(f"calibration[{i}].counts", f"expected {layers} rows of {experts} counts")
        for row in counts:
            for x in row:
                if not (_int_in(x, 0, MAX_CALIBRATION_COUNT) or (
                        isinstance(x, float) and 0 <= x <= MAX_CALIBRATION_COUNT)):
                    w.fail(f"calibration[{i}].counts", f"expected counts in "
                           f"0..2**53, got {x!r}")


def _int_in(value: Any, lo: int, hi: int) -> bool:
    """`value` is a JSON integer (not a bool, not a float) in [lo, hi]."""
    return isinstance(value, int) and not isinstance(value, bool) and lo <= value <= hi


def _number(value: Any) -> bool:
    """`value` is a JSON number (int or float, not a bool)."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def _kind(value: Any) -> str:
    """A short description of what was found where something else was expected."""
    if isinstance(value, list):
        return f"a list of {len(value)}"
    if value is None:
        return "null"
    return f"{type(value).__name__} {str(value)[:40]!r}"
