"""Validate the `engine` section of a plan solved with `--engine llamacpp` before anything
uses it (placer/plan/check.py calls `check_engine` for every plan that has one).

Two steps, each failing on the first problem with one line naming the file and the field:

1. its shape against the shipped JSON Schema (placer/plan/schema/llamacpp_engine.schema.json,
   draft 2020-12): every field's type and bounds, so no size reaches an allocation unbounded
   (slot counts, MiB, layers, context) and no field a command reads is missing (`choice`,
   `n_cpu_moe`, ...);
2. the rules that tie its fields to each other and to the plan, each one what export and
   evaluate would otherwise trust: host layers are MoE layers of the plan, `n_cpu_moe` is
   null or exactly the N whose first N decoder layers they are (`-ncmoe N`), `tensor_split`
   finite with a positive sum, one value per card, `devices` the cards llama.cpp gives the
   layers under it (solvers.llamacpp.cost.layer_devices), `slots` the counts llama.cpp makes
   of `moe_cache_mib` for those host layers (solvers.llamacpp.lru.group_slots: one per group,
   derived, not trusted), a CPU share only with a cache, each card's -ts share of the cache
   beside its resident experts within its budget and within the largest allocation of the
   card's backend (a Vulkan card's: llama.cpp aborts at load above it; the plan's
   hardware.cards[].backend, placer/hardware/data/backends.csv), every expert cold exactly
   where its layer is a host layer, and the same for every option of the table (an option's
   resident experts are those of its GPU layers: `--option NAME` exports it as the choice is
   exported, so its cache must fit the cards as the choice's does); `llamacpp_build` one that
   solvers.llamacpp.builds re-derives from its `given` text, the same build it records (a
   failure names this field, not --llamacpp-version), with the flags the choice and every
   option use (a cache, a CPU share); the model's `hidden_size` and
   `expert_flops` present (the replay needs them) and every calibration entry with its
   `counts` (evaluate's drift reads them).

Numbers are checked before any arithmetic uses them: `tensor_split` finite (the schema lets
NaN through: NaN < 0 is false) and, summed as llama.cpp sums it (float32), finite and
positive, so 1e308 is one line here, not numpy's overflow warnings and a wrong layer map.
"""

from __future__ import annotations

import math
from functools import cache
from importlib import resources
from typing import Any

import jsonschema
import numpy as np

from placer.errors import PlacerError
from placer.hardware.backends import UNKNOWN, backend
from solvers.errors import SolverError

MAX_HIDDEN = 1 << 20
BUILD_GIVEN = "the plan's engine.llamacpp_build.given"  # how builds.build_from_json names it
MIB = 1 << 20


@cache
def engine_schema() -> dict:
    """The llama.cpp engine section's JSON Schema (draft 2020-12)."""
    import json

    text = resources.files("placer.plan").joinpath(
        "schema/llamacpp_engine.schema.json").read_text()
    return json.loads(text)


def check_engine(d: dict, source: str, layers: list[int], cards: list[dict]) -> None:
    """PlacerError (one line, "SOURCE: engine.FIELD: ...") for the first problem of plan
    JSON `d`'s engine section (module docstring); `layers`, `cards`: the plan's MoE layers
    and card objects, already checked."""

    def fail(field: str, problem: str) -> None:
        raise PlacerError(f"{source}: {field}: {problem}")

    engine = d["engine"]
    if not isinstance(engine, dict) or engine.get("name") != "llamacpp":
        fail("engine", "expected an object with name \"llamacpp\"")
    error = jsonschema.exceptions.best_match(
        jsonschema.Draft202012Validator(engine_schema()).iter_errors(engine))
    if error is not None:
        where = "engine" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}"
                                   for p in error.absolute_path)
        fail(where, _short(error.message))
    model = d["model"]
    hidden = model.get("hidden_size")
    if isinstance(hidden, bool) or not isinstance(hidden, int) or not 1 <= hidden <= MAX_HIDDEN:
        fail("model.hidden_size", f"a llama.cpp plan needs the hidden size (an integer in "
             f"1..{MAX_HIDDEN}), got {_short(repr(hidden))}")
    if model.get("expert_flops") is None:
        fail("model.expert_flops", "a llama.cpp plan needs each expert's FLOPs")
    for i, entry in enumerate(d.get("calibration", [])):
        if not isinstance(entry.get("counts"), list):
            fail(f"calibration[{i}].counts", "missing: a llama.cpp plan's calibration entries "
                 "carry their counts (evaluate compares traffic with them)")
    split, devices = _check_split(fail, engine, model, layers, cards)
    _check_layouts(fail, engine, layers)
    _check_setup(fail, "engine", engine, d, layers, split, devices)
    for i, option in enumerate(engine["options"]):
        _check_setup(fail, f"engine.options[{i}]", option, d, layers, split, devices)
    names = [o["name"] for o in engine["options"]]
    if len(set(names)) != len(names):
        fail("engine.options", "two options have the same name")
    if engine.get("tuner_pick") is not None and engine["tuner_pick"] not in names:
        fail("engine.tuner_pick", f"{_short(engine['tuner_pick'])!r} is not an option")
    _check_budgets(fail, engine, d, layers, cards, split, devices)
    for i, option in enumerate(engine["options"]):
        _check_option_budget(fail, f"engine.options[{i}]", option, d, layers, cards, split,
                             devices)
    _check_build(fail, engine)


def _float32_sum_ok(split: list[float]) -> bool:
    """Whether the -ts values, each >= 0 and finite, sum in float32 (as llama.cpp's
    load_tensors adds them) to a finite positive number at every step."""
    with np.errstate(all="ignore"):
        points = np.cumsum(np.asarray(split, dtype=np.float64).astype(np.float32),
                           dtype=np.float32)
    return bool(all(x >= 0 for x in split) and np.isfinite(points).all() and points[-1] > 0)


def _check_option_budget(fail, at: str, option: dict, d: dict, layers: list[int],
                         cards: list[dict], split: list[float], devices: list[int]) -> None:
    """An option's cache (its -ts shares) beside the experts of its GPU layers within each
    card's budget, as _check_budgets checks the choice's."""
    host = set(option["host_layers"])
    mib = option["moe_cache_mib"]
    resident = [0] * len(cards)
    for e in d["experts"]:
        if e["layer"] not in host:
            resident[e["card"]] += e["bytes"]
    cached = {dev for dev, layer in zip(devices, layers, strict=True) if layer in host}
    total = sum(split[c] for c in cached)
    for c, card in enumerate(cards):
        share = (mib << 20) * split[c] / total if c in cached and total > 0 else 0
        if resident[c] + share > card["budget_bytes"]:
            fail(f"{at}.moe_cache_mib", f"{mib} MiB of cache (card {c}'s -ts share) beside "
                 f"the experts of the option's GPU layers exceed card {c}'s budget "
                 f"({card['budget_bytes']} bytes)")


def _check_alloc(fail, field: str, mib: int, d: dict, cached: set[int], split: list[float]
                 ) -> None:
    """Each `cached` card's -ts share of a `mib` MiB cache within its backend's largest
    allocation (the plan's hardware, already validated)."""
    total = sum(split[c] for c in cached)
    for c in sorted(cached):
        share = mib * split[c] / total if total > 0 else 0
        name = d["hardware"]["cards"][c].get("backend", UNKNOWN)
        limit = backend(name).max_alloc_mib
        if limit and share > limit:
            fail(field, f"{mib} MiB of cache puts {share:.0f} MiB on card {c}, above its "
                 f"{name} backend's largest allocation ({limit} MiB; llama.cpp aborts at "
                 "load above it: placer/hardware/data/backends.csv)")


def _check_build(fail, engine: dict) -> None:
    """The recorded build: the one its `given` text names (builds.build_from_json, which
    re-derives it), each recorded field that build's own, and a build that has the flags
    the choice and every option use (--moe-cache-mib for a cache, --moe-cache-cpu-share for
    a CPU share): export would print them for a llama.cpp that has none."""
    from solvers.llamacpp.builds import build_from_json

    build = engine.get("llamacpp_build")
    try:
        made = build_from_json(build)
    except SolverError as exc:
        fail("engine.llamacpp_build.given", str(exc).removeprefix(f"{BUILD_GIVEN}: "))
    derived = made.to_json()
    for key, value in (build or {}).items():
        if key in derived and key != "given" and value != derived[key]:
            fail(f"engine.llamacpp_build.{key}", f"{_short(repr(value))}, but "
                 f"{_short(repr(derived['given']))} is {_short(repr(derived[key]))}")
    setups = [("engine", engine), *((f"engine.options[{i}]", o)
                                    for i, o in enumerate(engine["options"]))]
    for at, setup in setups:
        if setup["moe_cache_mib"] and not made.has_cache:
            fail("engine.llamacpp_build", f"{made.label} has no --moe-cache-mib, but "
                 f"{at}.moe_cache_mib is {setup['moe_cache_mib']}")
        if setup.get("cpu_share", 0.0) and not made.has_cpu_share:
            fail("engine.llamacpp_build", f"{made.label} has no --moe-cache-cpu-share, but "
                 f"{at}.cpu_share is {setup['cpu_share']:g}")


def _check_split(fail, engine: dict, model: dict, layers: list[int], cards: list[dict]
                 ) -> tuple[list[float], list[int]]:
    """The -ts proportions and each MoE layer's card, after checking them against the cards
    and llama.cpp's assignment."""
    given = engine.get("tensor_split")
    if given is None:
        if len(cards) != 1:
            fail("engine.tensor_split", f"null, but the plan has {len(cards)} cards: expected "
                 "a -ts proportion per card")
        split = [1.0]
    else:
        split = list(given)
        if len(split) != len(cards):
            fail("engine.tensor_split", f"{len(split)} proportions for {len(cards)} cards")
        if not all(math.isfinite(x) for x in split) or not _float32_sum_ok(split):
            fail("engine.tensor_split", f"expected finite proportions >= 0 whose sum, as "
                 f"llama.cpp adds them in float32, is finite and positive, got "
                 f"{_short(repr(split))}")
    from solvers.llamacpp.cost import layer_devices  # numba: only for llama.cpp plans

    expected = [0] * len(layers)
    if given is not None:
        n_layer = model.get("num_layers", layers[-1] + 1)
        expected = layer_devices(n_layer, split)[layers].tolist()
    devices = engine.get("devices") or [0] * len(layers)
    if list(devices) != expected:
        fail("engine.devices", f"expected the card llama.cpp gives each MoE layer under -ts "
             f"{_short(repr(split))} ({_short(repr(expected))}), got {_short(repr(devices))}")
    return split, expected


def _check_layouts(fail, engine: dict, layers: list[int]) -> None:
    layouts = engine["layouts"]
    if len(layouts) != len(layers):
        fail("engine.layouts", f"{len(layouts)} layouts for {len(layers)} MoE layers")


def _check_setup(fail, at: str, setup: dict, d: dict, layers: list[int], split: list[float],
                 devices: list[int]) -> None:
    """One setup (the engine's choice or an option): host layers, -ncmoe, share, slots."""
    host = setup["host_layers"]
    moe = set(layers)
    if any(x not in moe for x in host):
        fail(f"{at}.host_layers", f"expected MoE layers of the plan, got {_short(repr(host))}")
    leading = sorted(host) == list(range(max(host) + 1)) if host else False
    if setup["n_cpu_moe"] is not None and (not leading or setup["n_cpu_moe"] != max(host) + 1):
        fail(f"{at}.n_cpu_moe", f"{setup['n_cpu_moe']}, but the host layers "
             f"{_short(repr(sorted(host)))} are "
             + (f"the first {max(host) + 1} decoder layers" if leading
                else "not the first N decoder layers (-ncmoe N would move others)"))
    mib = setup["moe_cache_mib"]
    if setup.get("cpu_share", 0.0) > 0 and mib == 0:
        fail(f"{at}.cpu_share", "a CPU share without a cache (moe_cache_mib 0)")
    if not math.isfinite(setup.get("cpu_share", 0.0)):
        fail(f"{at}.cpu_share", "expected a number in [0, 1]")
    from solvers.llamacpp.lru import cache_groups, group_slots

    engine = d["engine"]
    model = d["model"]
    host_mask = np.isin(layers, host)
    groups = cache_groups(np.where(host_mask, devices, -1),
                          [(key, tuple(nb2)) for key, nb2 in engine["layouts"]],
                          int(model["experts_per_layer"]))
    if mib == 0:
        expected: list[int] = []
    else:
        if not host:
            fail(f"{at}.moe_cache_mib", f"{mib} MiB of cache, but no host layer to cache")
        _check_alloc(fail, f"{at}.moe_cache_mib", mib, d,
                     {dev for dev, layer in zip(devices, layers, strict=True) if layer in host},
                     split)
        try:
            expected = group_slots(mib * MIB, groups, int(model["top_k"]),
                                   tensor_split=split if len(split) > 1 else None,
                                   alignment=int(engine["alignment"])).tolist()
        except SolverError as exc:
            fail(f"{at}.moe_cache_mib", str(exc))
    if list(setup["slots"]) != expected:
        fail(f"{at}.slots", f"expected the slots llama.cpp makes of {mib} MiB for these host "
             f"layers, one per cache group ({_short(repr(expected))}), got "
             f"{_short(repr(setup['slots']))}")


def _check_budgets(fail, engine: dict, d: dict, layers: list[int], cards: list[dict],
                   split: list[float], devices: list[int]) -> None:
    """Each card's -ts share of the cache beside its resident experts within its budget, and
    every expert cold exactly where its layer is a host layer."""
    host = set(engine["host_layers"])
    mib = engine["moe_cache_mib"]
    cached = {dev for dev, layer in zip(devices, layers, strict=True) if layer in host}
    total = sum(split[c] for c in cached)
    for c, card in enumerate(cards):
        share = (mib << 20) * split[c] / total if c in cached and total > 0 else 0
        if card["resident_bytes"] + share > card["budget_bytes"]:
            fail("engine.moe_cache_mib", f"{mib} MiB of cache (card {c}'s -ts share) beside "
                 f"the resident experts exceed card {c}'s budget")
    for i, e in enumerate(d["experts"]):
        resident = any(p["resident"] for p in e["pages"])  # pages checked by check_plan
        if resident == (e["layer"] in host):
            fail(f"experts[{i}].resident_bytes", f"layer {e['layer']} is "
                 f"{'a host' if e['layer'] in host else 'a GPU'} layer of engine.host_layers"
                 f" but this expert is {'resident' if resident else 'cold'}")


def _short(text: Any, limit: int = 120) -> str:
    """`text` cut to `limit` characters (an error line stays one short line)."""
    text = str(text)
    return text if len(text) <= limit else text[:limit - 3] + "..."
