"""The serving box: cards, their host links, the host CPU, and the decode step time, from a
TOML spec.

A spec file looks like (sizes take units, rates take "/s"):

    name = "8x-rtx5090d-pcie5"
    description = "8 x RTX 5090 D (32 GB) on PCIe 5.0 x16, two sockets"
    host_ram = "1TiB"
    cards = 8                      # or a list of tables, one per card, overriding [card]
    os = "linux"                   # optional: linux (default), windows, wsl2 or macos: with
                                   # the backend, whether a card spills past its VRAM

    [card]                         # every card, unless a card table says otherwise
    model = "RTX 5090 D"
    vram = "32GiB"
    reserved_dense = "3GiB"        # dense (non-expert) weights on this card
    reserved_kv = "4GiB"           # KV cache
    reserved_activations = "2GiB"
    h2d_bandwidth = "53GB/s"       # pinned host-to-device copies
    h2d_pageable_bandwidth = "26GB/s"  # optional: copies from pageable (mmap'd) host memory
    latency_us = 10.0              # fixed cost of one copy
    backend = "cuda"               # optional: llama.cpp's backend (placer/hardware/backends.py)
    spills = true                  # optional: buffers past VRAM spill to host memory (read
                                   # over the link each step) instead of failing to load;
                                   # default by `os` and backend (placer/hardware/spill.py)

    [[link]]                       # cards sharing a host link (socket, PCIe switch)
    name = "socket0"
    cards = [0, 1, 2, 3]
    bandwidth = "150GB/s"

    [decode]                       # required
    base_step_ms = { 1 = 9.0, 8 = 28.0 }   # step time with every expert resident, by batch
    spread = [0.8, 1.3]            # optional: where an estimated step may lie, as factors
                                   # of base_step_ms (the fit's spread); default [1, 1]

    [host]                         # optional: the CPU that computes cold experts in place
    memory_bandwidth = "300GB/s"   # streaming bandwidth from host RAM (roofline fallback)
    flops = "2TFLOPS"              # effective FLOP/s on the expert matmuls (roofline fallback)
    sync_us = 30.0                 # per-layer hand-off to the CPU and back
    sockets = 2                    # default 1
    offload_min_batch = 32         # default 32: steps of >= 32 tokens have the GPU compute
                                   # the cold experts after copying them (llama.cpp's
                                   # GGML_OP_OFFLOAD_MIN_BATCH); 0: the CPU always does

    [[host.expert]]                # optional, repeatable: an expert's measured time over n
    hidden = 2048                  # tokens, cold from RAM (placer probe --host writes it;
    inter = 768                    # placer/hardware/timing.py); with any, the cpu model
    dtype = "bfloat16"             # takes the one nearest in bytes, scaled by bytes,
    tokens = [1, 8, 64]            # instead of the roofline
    ms = [8.9, 24.0, 136.0]

    estimated = ["base_step_ms", "card.h2d_bandwidth"]   # optional, at the top: the figures
                                   # that stand in for a measurement (ESTIMABLE names each
                                   # and the probe that measures it); a probe that writes a
                                   # figure drops it from the list

    [context]                      # optional: the context the KV reserve is for
    tokens = 8192                  # llama-server -c (the export prints it)
    kv_type = "q8_0"               # K and V cache type: f16 (default), q8_0, q4_0, ...
                                   # (-ctk / -ctv; placer/checkpoint/kv.py sizes the cache)

Cards in no link have no shared bound. Base step time is interpolated linearly in the batch
(held at the smallest batch's time below it). Every number must be finite; sizes and rates
are bounded (2**60) so a typo cannot reach the solvers as an absurd figure, and rates from
below too (1 MB/s, 1 MFLOP/s): "1e-300FLOPS" is not a slow CPU but a typo that would
predict a decode step of 10**306 ms.
"""

from __future__ import annotations

import tomllib
from dataclasses import asdict, dataclass, replace
from importlib import resources
from pathlib import Path
from typing import Any

from placer.checkpoint.kv import Context, parse_context
from placer.errors import PlacerError
from placer.hardware.backends import UNKNOWN, backend
from placer.hardware.spec_values import (
    flops_of,
    is_int,
    kind_of,
    number_of,
    rate_of,
    size_of,
    table_list,
    text_of,
)
from placer.hardware.spill import DEFAULT_OS, check_os, default_spills
from placer.hardware.timing import ExpertTiming, parse_timings
from traces.errors import shown
from traces.formats.bounded import read_bounded
from traces.formats.jsontext import MAX_DEPTH, decode_utf8, depth
from traces.options import MAX_CARDS as OPTION_MAX_CARDS

CARD_FIELDS = ("model", "vram", "reserved_dense", "reserved_kv", "reserved_activations",
               "h2d_bandwidth", "h2d_pageable_bandwidth", "backend", "spills", "latency_us")
SPEC_FIELDS = ("name", "description", "host_ram", "estimated", "cards", "card", "link", "decode",
               "host", "context", "os")
LINK_FIELDS = ("name", "cards", "bandwidth")
HOST_FIELDS = ("memory_bandwidth", "flops", "sync_us", "sockets", "offload_min_batch", "expert")
MAX_CARDS = OPTION_MAX_CARDS  # traces.options bounds --cards by the same
MAX_BATCH = 1 << 20
MAX_MS = 1e6               # a decode step, latency or sync longer than this is a typo
MAX_SOCKETS = 64
MAX_SPREAD = 100.0         # an estimated step off by more than 100x is no estimate
_PROBE = "placer probe on the box (it prints the card figures to copy into SPEC)"
_HOST_PROBE = "placer probe --host --model M --hardware SPEC --out SPEC"
# The figures a spec may hold before anything is measured, and what replaces each.
ESTIMABLE = {
    "base_step_ms": "placer probe --step --model M --hardware SPEC --out SPEC",
    "card.h2d_bandwidth": _PROBE,
    "card.latency_us": _PROBE,
    "card.reserved": "the model's dense weights and KV cache: placer hardware new --model M",
    "host.memory_bandwidth": _HOST_PROBE,
    "host.flops": _HOST_PROBE,
    "host.sync_us": _HOST_PROBE + " (on the box, a GPU visible)",
}
PRESETS = resources.files("placer.hardware.presets")
# llama.cpp's default GGML_OP_OFFLOAD_MIN_BATCH, as solvers.cpu.OFFLOAD_MIN_BATCH names it (a
# test checks they agree): imported from there, it would load numpy at every command's start.
OFFLOAD_MIN_BATCH = 32


@dataclass(frozen=True)
class Card:
    index: int
    model: str
    vram: int
    reserved_dense: int
    reserved_kv: int
    reserved_activations: int
    h2d_bandwidth: float  # bytes/s
    latency_s: float
    h2d_pageable_bandwidth: float | None = None  # bytes/s from mmap'd memory (None: unknown)
    backend: str = UNKNOWN  # backends.csv's name; its largest allocation caps a cache here
    spills: bool | None = None  # past VRAM: True spills to host memory, None the OS's default

    @property
    def max_alloc(self) -> int | None:
        """Bytes of the largest one allocation its backend makes (None: no limit)."""
        mib = backend(self.backend).max_alloc_mib
        return mib * 2**20 if mib else None

    @property
    def free_bytes(self) -> int:
        """VRAM left for expert pages and the staging buffer."""
        return self.vram - self.reserved_dense - self.reserved_kv - self.reserved_activations


@dataclass(frozen=True)
class Link:
    name: str
    cards: tuple[int, ...]
    bandwidth: float  # bytes/s shared by its cards' host-to-device copies


@dataclass(frozen=True)
class Host:
    """The host CPU, for cold experts computed where they lie (llama.cpp -ot, KTransformers)."""

    memory_bandwidth: float  # bytes/s streamed from host RAM
    flops: float             # effective FLOP/s on the expert matmuls
    sync_s: float            # per-layer hand-off to the CPU and back
    sockets: int = 1
    offload_min_batch: int = OFFLOAD_MIN_BATCH  # steps the GPU computes (0: never)
    expert: tuple[ExpertTiming, ...] = ()        # measured experts (placer probe --host)


@dataclass(frozen=True)
class HardwareSpec:
    name: str
    description: str
    host_ram: int
    cards: tuple[Card, ...]
    links: tuple[Link, ...]
    base_step_ms: tuple[tuple[int, float], ...]  # (batch, ms) sorted by batch, ms > 0
    host: Host | None = None
    estimated: tuple[str, ...] = ()  # ESTIMABLE's names of the figures not measured
    step_spread: tuple[float, float] = (1.0, 1.0)  # the step lies in base x [lo, hi]
    context: Context | None = None  # [context]: what reserved_kv holds (None: not said)
    os: str = DEFAULT_OS  # the box's OS (placer/hardware/spill.py): whether cards spill

    def spills(self, card: Card) -> tuple[bool, str]:
        """Whether `card`'s buffers past its VRAM spill to host memory rather than fail, and
        why (the card's own `spills`, else the OS and backend's default)."""
        if card.spills is not None:
            return card.spills, f"the spec's spills = {str(card.spills).lower()}"
        spills, _ = default_spills(self.os, card.backend)
        return spills, f"{self.os} with {card.backend}, by default (placer/hardware/data/spill.csv)"

    def base_step_s(self, batch: int) -> float:
        """Decode step time at `batch` with every expert resident: linear interpolation,
        extrapolated from the last segment above the largest batch, held at the first
        point's time below the smallest."""
        points = self.base_step_ms
        if len(points) == 1 or batch <= points[0][0]:
            return points[0][1] / 1e3
        lo, hi = points[-2], points[-1]
        for a, b in zip(points, points[1:], strict=False):
            if a[0] <= batch <= b[0]:
                lo, hi = a, b
                break
        slope = (hi[1] - lo[1]) / (hi[0] - lo[0])
        return (lo[1] + slope * (batch - lo[0])) / 1e3

    def step_range_s(self, batch: int) -> tuple[float, float]:
        """The least and most the step at `batch` may take: base_step_s x `step_spread`."""
        base = self.base_step_s(batch)
        return base * self.step_spread[0], base * self.step_spread[1]

    def measured(self, *figures: str) -> HardwareSpec:
        """This spec with `figures` (names of ESTIMABLE) no longer marked estimated; a measured
        base_step_ms also drops the estimate's spread."""
        spread = (1.0, 1.0) if "base_step_ms" in figures else self.step_spread
        return replace(self, estimated=tuple(e for e in self.estimated if e not in figures),
                       step_spread=spread)

    def groups(self) -> list[tuple[int, ...]]:
        """Host-link groups in link order; cards in no link form one last group."""
        linked = {c for link in self.links for c in link.cards}
        rest = tuple(c.index for c in self.cards if c.index not in linked)
        return [link.cards for link in self.links] + ([rest] if rest else [])

    def to_json(self) -> dict:
        d = asdict(self)
        d["base_step_ms"] = {str(b): ms for b, ms in self.base_step_ms}
        d["estimated"] = list(self.estimated)
        d["step_spread"] = list(self.step_spread)
        if self.context is None:
            del d["context"]
        return d


def spec_from_json(d: Any, source: str = "plan") -> HardwareSpec:
    """Inverse of `HardwareSpec.to_json` (as stored in a plan or manifest), validated by the
    same checks as a TOML spec; errors name `source`'s field ("plan.json: hardware...")."""
    where = f"{source}: hardware"
    if not isinstance(d, dict):
        raise PlacerError(f"{where}: expected a table, got {kind_of(d)}")
    optional = {"host", "estimated", "step_spread", "context", "os"}  # plans before these
    expected = {"name", "description", "host_ram", "cards", "links", "base_step_ms", *optional}
    unknown = set(d) - expected
    if unknown:
        raise PlacerError(f"{where}: unknown field {sorted(unknown)[0]!r}")
    missing = expected - optional - set(d)
    if missing:
        raise PlacerError(f"{where}.{sorted(missing)[0]}: missing")
    cards = table_list(d["cards"], f"{where}.cards")
    for i, c in enumerate(cards):
        if c.get("index") != i:
            raise PlacerError(f"{where}.cards[{i}].index: expected {i}, got {c.get('index')!r}")
    data = {"name": d["name"], "description": d["description"], "host_ram": d["host_ram"],
            "cards": [{k: v for k, v in c.items() if k != "index"} for c in cards],
            "link": d["links"], "decode": {"base_step_ms": d["base_step_ms"],
                                           "spread": d.get("step_spread", [1.0, 1.0])},
            "estimated": d.get("estimated", []), "os": d.get("os", DEFAULT_OS)}
    for key in ("host", "context"):
        if d.get(key) is not None:
            data[key] = d[key]
    return parse_spec(data, source, seconds=True, field="hardware.")


def preset_names() -> list[str]:
    """Names of the specs that ship with placer."""
    return sorted(p.name.removesuffix(".toml")
                  for p in PRESETS.iterdir()
                  if p.name.endswith(".toml"))


def load_spec(name_or_path: str | Path) -> HardwareSpec:
    """A spec from a TOML file path, or a preset by name."""
    return spec_of_text(spec_text(name_or_path), str(name_or_path))


def spec_text(name_or_path: str | Path) -> str:
    """The TOML text of a spec file path, or of a preset by name."""
    path = Path(name_or_path)
    if path.suffix == ".toml" or path.exists():
        if not path.is_file():
            raise PlacerError(f"hardware spec not found: {path}")
        raw = read_bounded(path, "spec", f"hardware spec {path}", PlacerError)
    else:
        if str(name_or_path) not in preset_names():
            raise PlacerError(f"unknown hardware preset '{shown(name_or_path)}'; presets: "
                              f"{', '.join(preset_names())} (or give a .toml path)")
        raw = PRESETS.joinpath(f"{name_or_path}.toml").read_bytes()
    return decode_utf8(raw, f"hardware spec {name_or_path}", PlacerError)


def spec_of_text(text: str, name_or_path: str) -> HardwareSpec:
    """The spec a TOML text holds (`name_or_path`: where it came from, for errors)."""
    try:
        data = tomllib.loads(text)
    except (tomllib.TOMLDecodeError, ValueError) as exc:  # ValueError: 5000-digit integers
        raise PlacerError(f"hardware spec {name_or_path}: invalid TOML ({exc})") from None
    except RecursionError:
        raise PlacerError(f"hardware spec {name_or_path}: nested too deeply to be a spec"
                          ) from None
    if depth(data) > MAX_DEPTH:
        raise PlacerError(f"hardware spec {name_or_path}: nested deeper than {MAX_DEPTH} "
                          "levels (a spec needs 3)")
    return parse_spec(data, name_or_path)


def parse_spec(data: Any, source: str = "spec", *, seconds: bool = False, field: str = ""
               ) -> HardwareSpec:
    """Validate a spec's TOML data; errors name the offending field ("SOURCE: FIELD..."). With
    `seconds`, the card and host tables give latency_s and sync_s (the JSON form) instead of
    latency_us and sync_us; `field` prefixes every field name ("hardware.")."""
    at = f"{source}: {field}"
    top = f"{source}: {field.rstrip('.')}" if field else source
    if not isinstance(data, dict):
        raise PlacerError(f"{top}: expected a table, got {kind_of(data)}")
    unknown = set(data) - set(SPEC_FIELDS)
    if unknown:
        raise PlacerError(f"{top}: unknown field {sorted(unknown)[0]!r}")
    defaults = data.get("card", {})
    if not isinstance(defaults, dict):
        raise PlacerError(f"{at}card: expected a table, got {kind_of(defaults)}")
    cards_field = data.get("cards")
    if is_int(cards_field):
        if not 0 <= cards_field <= MAX_CARDS:
            raise PlacerError(f"{at}cards: expected 1..{MAX_CARDS} cards, got {cards_field}")
        tables = [{} for _ in range(cards_field)]
    elif isinstance(cards_field, list):
        tables = table_list(cards_field, f"{at}cards")
        if len(tables) > MAX_CARDS:
            raise PlacerError(f"{at}cards: more than {MAX_CARDS} cards")
    else:
        raise PlacerError(f"{at}cards: expected a count or a list of card tables, got "
                          f"{kind_of(cards_field)}")
    if not tables:
        raise PlacerError(f"{at}cards: must name at least one card")
    cards = tuple(_card(i, {**defaults, **t}, at, seconds) for i, t in enumerate(tables))
    links = tuple(_link(i, lk, len(cards), at)
                  for i, lk in enumerate(table_list(data.get("link", []), f"{at}link")))
    seen: dict[int, str] = {}
    for link in links:
        for c in link.cards:
            if c in seen:
                raise PlacerError(f"{at}link {link.name!r}: card {c} is already in link "
                                  f"{seen[c]!r}")
            seen[c] = link.name
    host_ram = size_of(data.get("host_ram", 0), f"{at}host_ram")
    host = _host(data["host"], f"{at}host", seconds) if "host" in data else None
    decode_at = top if seconds else f"{at}decode"
    return HardwareSpec(
        name=text_of(data.get("name", source), f"{at}name"),
        description=text_of(data.get("description", ""), f"{at}description"),
        host_ram=host_ram, cards=cards, links=links,
        base_step_ms=_base_steps(data.get("decode"), decode_at),
        host=host, estimated=_estimated(data.get("estimated", []), f"{at}estimated"),
        step_spread=_spread(data["decode"].get("spread", [1.0, 1.0]),
                            f"{decode_at}.{'step_' if seconds else ''}spread"),
        context=parse_context(data["context"], f"{at}context") if "context" in data else None,
        os=check_os(text_of(data.get("os", DEFAULT_OS), f"{at}os"), f"{at}os"))


def _estimated(value: Any, where: str) -> tuple[str, ...]:
    """The names in `estimated`, each one of ESTIMABLE, once."""
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise PlacerError(f"{where}: expected a list of figure names, got {kind_of(value)}")
    for name in value:
        if name not in ESTIMABLE:
            raise PlacerError(f"{where}: unknown figure {shown(name)!r}; known: "
                              f"{', '.join(ESTIMABLE)}")
    if len(set(value)) != len(value):
        raise PlacerError(f"{where}: a figure is named twice")
    return tuple(value)


def _spread(value: Any, where: str) -> tuple[float, float]:
    """[lo, hi] with 0 < lo <= 1 <= hi <= MAX_SPREAD."""
    if not isinstance(value, list) or len(value) != 2:
        raise PlacerError(f"{where}: expected [lo, hi], factors of base_step_ms, got "
                          f"{kind_of(value)}")
    lo = number_of(value[0], f"{where}[0]", 1 / MAX_SPREAD, 1.0)
    hi = number_of(value[1], f"{where}[1]", 1.0, MAX_SPREAD)
    return lo, hi


def _card(index: int, t: dict, at: str, seconds: bool) -> Card:
    where = f"{at}cards[{index}]"
    latency_key = "latency_s" if seconds else "latency_us"
    unknown = set(t) - {*CARD_FIELDS[:-1], latency_key}
    if unknown:
        raise PlacerError(f"{where}: unknown field {sorted(unknown)[0]!r}")
    for key in ("vram", "h2d_bandwidth"):
        if key not in t:
            raise PlacerError(f"{where}.{key}: missing")
    sizes = {k: size_of(t.get(k, 0), f"{where}.{k}")
             for k in ("vram", "reserved_dense", "reserved_kv", "reserved_activations")}
    reserved = sizes["reserved_dense"] + sizes["reserved_kv"] + sizes["reserved_activations"]
    if reserved > sizes["vram"]:
        raise PlacerError(f"{where}.reserved_*: reserved bytes ({reserved}) exceed vram "
                          f"({sizes['vram']})")
    bandwidth = rate_of(t["h2d_bandwidth"], f"{where}.h2d_bandwidth")
    scale = 1e6 if seconds else 1.0
    latency = number_of(t.get(latency_key, 0.0), f"{where}.{latency_key}", 0.0, MAX_MS / scale)
    pageable = t.get("h2d_pageable_bandwidth")
    name = text_of(t.get("backend", UNKNOWN), f"{where}.backend")
    if name != UNKNOWN:
        backend(name, f"{where}.backend")
    spills = t.get("spills")
    if spills is not None and not isinstance(spills, bool):
        raise PlacerError(f"{where}.spills: expected true or false, got {kind_of(spills)}")
    return Card(index, text_of(t.get("model", "GPU"), f"{where}.model"), sizes["vram"],
                sizes["reserved_dense"], sizes["reserved_kv"], sizes["reserved_activations"],
                bandwidth, latency if seconds else latency / 1e6,
                None if pageable is None else rate_of(pageable,
                                                    f"{where}.h2d_pageable_bandwidth"),
                name, spills)


def _link(index: int, t: dict, num_cards: int, at: str) -> Link:
    name = text_of(t.get("name", f"link{index}"), f"{at}link[{index}].name")
    where = f"{at}link {name!r}"
    unknown = set(t) - set(LINK_FIELDS)
    if unknown:
        raise PlacerError(f"{where}: unknown field {sorted(unknown)[0]!r}")
    cards = t.get("cards")
    if not isinstance(cards, list) or not cards:
        raise PlacerError(f"{where}.cards: must list card indices")
    for c in cards:
        if not is_int(c) or not 0 <= c < num_cards:
            raise PlacerError(f"{where}.cards: unknown card {c!r} (cards are 0..{num_cards - 1})")
    if len(set(cards)) != len(cards):
        raise PlacerError(f"{where}.cards: a card is listed twice in {cards}")
    if "bandwidth" not in t:
        raise PlacerError(f"{where}.bandwidth: missing")
    return Link(name, tuple(cards), rate_of(t["bandwidth"], f"{where}.bandwidth"))


def _base_steps(decode: Any, where: str) -> tuple[tuple[int, float], ...]:
    """(batch, ms) sorted by batch from `[decode] base_step_ms` (required: no default)."""
    table = "a table of batch size to ms (e.g. { 1 = 9.0 })"
    need = f"{where}.base_step_ms: required, {table}"
    if decode is None:
        raise PlacerError(f"{where}: missing; give [decode] base_step_ms, {table}")
    if not isinstance(decode, dict):
        raise PlacerError(f"{where}: expected a table, got {kind_of(decode)}")
    unknown = set(decode) - {"base_step_ms", "spread"}
    if unknown:
        raise PlacerError(f"{where}: unknown field {sorted(unknown)[0]!r}")
    steps = decode.get("base_step_ms")
    if not isinstance(steps, dict) or not steps:
        raise PlacerError(need)
    points: dict[int, float] = {}
    for key, ms in steps.items():
        text = str(key).strip()
        if not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= MAX_BATCH:
            raise PlacerError(f"{where}.base_step_ms: batch {key!r} is not an integer in "
                              f"1..{MAX_BATCH}")
        batch = int(text)
        if batch in points:
            raise PlacerError(f"{where}.base_step_ms: batch {batch} is given twice ({key!r})")
        points[batch] = number_of(ms, f"{where}.base_step_ms[{key}]", 0.0, MAX_MS, positive=True)
    base = tuple(sorted(points.items()))
    for (b0, ms0), (b1, ms1) in zip(base, base[1:], strict=False):
        if ms1 < ms0:
            raise PlacerError(f"{where}.base_step_ms: step time falls from {ms0} ms at batch "
                              f"{b0} to {ms1} ms at batch {b1} (it must not decrease)")
    return base


def _host(t: Any, where: str, seconds: bool) -> Host:
    if not isinstance(t, dict):
        raise PlacerError(f"{where}: expected a table, got {kind_of(t)}")
    sync_key = "sync_s" if seconds else "sync_us"
    allowed = set(HOST_FIELDS) - {"sync_us"} | {sync_key}
    unknown = set(t) - allowed
    if unknown:
        raise PlacerError(f"{where}: unknown field {sorted(unknown)[0]!r}")
    for key in sorted(allowed - {"sockets", "offload_min_batch", "expert"}):
        if key not in t:
            raise PlacerError(f"{where}.{key}: missing")
    sockets = t.get("sockets", 1)
    if not is_int(sockets) or not 1 <= sockets <= MAX_SOCKETS:
        raise PlacerError(f"{where}.sockets: expected an integer in 1..{MAX_SOCKETS}, "
                          f"got {sockets!r}")
    scale = 1e6 if seconds else 1.0
    sync = number_of(t[sync_key], f"{where}.{sync_key}", 0.0, MAX_MS / scale)
    offload = t.get("offload_min_batch", OFFLOAD_MIN_BATCH)
    if not is_int(offload) or not 0 <= offload <= MAX_BATCH:
        raise PlacerError(f"{where}.offload_min_batch: expected an integer in 0..{MAX_BATCH}, "
                          f"got {offload!r}")
    return Host(memory_bandwidth=rate_of(t["memory_bandwidth"], f"{where}.memory_bandwidth"),
                flops=flops_of(t["flops"], f"{where}.flops"),
                sync_s=sync if seconds else sync / 1e6, sockets=sockets,
                offload_min_batch=offload,
                expert=parse_timings(t.get("expert", []), f"{where}.expert", seconds))
