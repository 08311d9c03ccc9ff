"""The serving box: cards, their host links, and the decode step time, from a TOML spec.

A spec file looks like (sizes take units, rates take "/s"):

    name = "8x-rtx5090d-pcie5"
    description = "8 x RTX 5090 D (32 GB) on PCIe 5.0 x16, two sockets"
    host_ram = "1TiB"
    cards = 8                      # or a list of tables, one per card, overriding [card]

    [card]                         # every card, unless a card table says otherwise
    model = "RTX 5090 D"
    vram = "32GiB"
    reserved_dense = "3GiB"        # dense (non-expert) weights on this card
    reserved_kv = "4GiB"           # KV cache
    reserved_activations = "2GiB"
    h2d_bandwidth = "53GB/s"       # pinned host-to-device copies
    latency_us = 10.0              # fixed cost of one copy

    [[link]]                       # cards sharing a host link (socket, PCIe switch)
    name = "socket0"
    cards = [0, 1, 2, 3]
    bandwidth = "150GB/s"

    [decode]
    base_step_ms = { 1 = 9.0, 8 = 28.0 }   # step time with every expert resident, by batch

Cards in no link have no shared bound. Base step time is interpolated linearly in the batch.
"""

from __future__ import annotations

import tomllib
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path

from placer.errors import PlacerError
from placer.units import parse_bytes, parse_rate

CARD_FIELDS = ("model", "vram", "reserved_dense", "reserved_kv", "reserved_activations",
               "h2d_bandwidth", "latency_us")


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
class HardwareSpec:
    name: str
    description: str
    host_ram: int
    cards: tuple[Card, ...]
    links: tuple[Link, ...]
    base_step_ms: tuple[tuple[int, float], ...]  # (batch, ms) sorted by batch

    def base_step_s(self, batch: int) -> float:
        """Decode step time at `batch` with every expert resident (linear interpolation)."""
        points = self.base_step_ms
        if len(points) == 1:
            return points[0][1] / 1e3
        lo, hi = (points[0], points[1]) if batch <= points[0][0] else (points[-2], points[-1])
        for a, b in zip(points, points[1:], strict=False):
            if a[0] <= batch <= b[0]:
                lo, hi = a, b
        slope = (hi[1] - lo[1]) / (hi[0] - lo[0])
        return max(0.0, lo[1] + slope * (batch - lo[0])) / 1e3

    def groups(self) -> list[tuple[int, ...]]:
        """Host-link groups in link order; cards in no link form one last group."""
        linked = {c for link in self.links for c in link.cards}
        rest = tuple(c.index for c in self.cards if c.index not in linked)
        return [link.cards for link in self.links] + ([rest] if rest else [])

    def to_json(self) -> dict:
        d = asdict(self)
        d["base_step_ms"] = {str(b): ms for b, ms in self.base_step_ms}
        return d


def spec_from_json(d: dict) -> HardwareSpec:
    """Inverse of `HardwareSpec.to_json` (as stored in a plan or manifest)."""
    return HardwareSpec(
        name=d["name"], description=d["description"], host_ram=int(d["host_ram"]),
        cards=tuple(Card(**c) for c in d["cards"]),
        links=tuple(Link(lk["name"], tuple(lk["cards"]), float(lk["bandwidth"]))
                    for lk in d["links"]),
        base_step_ms=tuple(sorted((int(b), float(ms)) for b, ms in d["base_step_ms"].items())))


def preset_names() -> list[str]:
    """Names of the specs that ship with placer."""
    return sorted(p.name.removesuffix(".toml")
                  for p in resources.files("placer.presets").iterdir()
                  if p.name.endswith(".toml"))


def load_spec(name_or_path: str | Path) -> HardwareSpec:
    """A spec from a TOML file path, or a preset by name."""
    path = Path(name_or_path)
    if path.suffix == ".toml" or path.exists():
        if not path.is_file():
            raise PlacerError(f"hardware spec not found: {path}")
        text = path.read_text()
    else:
        if str(name_or_path) not in preset_names():
            raise PlacerError(f"unknown hardware preset {str(name_or_path)!r}; presets: "
                              f"{', '.join(preset_names())} (or give a .toml path)")
        text = resources.files("placer.presets").joinpath(f"{name_or_path}.toml").read_text()
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise PlacerError(f"hardware spec {name_or_path}: invalid TOML ({exc})") from None
    return parse_spec(data, str(name_or_path))


def parse_spec(data: dict, source: str = "spec") -> HardwareSpec:
    """Validate a spec's TOML data; errors name the offending field."""
    defaults = data.get("card", {})
    cards_field = data.get("cards")
    if isinstance(cards_field, int):
        tables = [{} for _ in range(cards_field)]
    elif isinstance(cards_field, list):
        tables = cards_field
    else:
        raise PlacerError(f"{source}: 'cards' must be a count or a list of card tables")
    if not tables:
        raise PlacerError(f"{source}: 'cards' must name at least one card")
    cards = tuple(_card(i, {**defaults, **t}, source) for i, t in enumerate(tables))
    links = tuple(_link(i, lk, len(cards), source) for i, lk in enumerate(data.get("link", [])))
    seen: dict[int, str] = {}
    for link in links:
        for c in link.cards:
            if c in seen:
                raise PlacerError(f"{source}: link {link.name!r}: card {c} is already in link "
                                  f"{seen[c]!r}")
            seen[c] = link.name
    steps = data.get("decode", {}).get("base_step_ms", {"1": 0.0})
    try:
        base = tuple(sorted((int(b), float(ms)) for b, ms in steps.items()))
    except (AttributeError, ValueError):
        raise PlacerError(f"{source}: decode.base_step_ms must map batch sizes to ms") from None
    if any(b < 1 or ms < 0 for b, ms in base):
        raise PlacerError(f"{source}: decode.base_step_ms needs batch >= 1 and ms >= 0")
    return HardwareSpec(
        name=str(data.get("name", source)), description=str(data.get("description", "")),
        host_ram=parse_bytes(data.get("host_ram", 0), "host_ram"), cards=cards, links=links,
        base_step_ms=base)


def _card(index: int, t: dict, source: str) -> Card:
    where = f"{source}: cards[{index}]"
    unknown = set(t) - set(CARD_FIELDS)
    if unknown:
        raise PlacerError(f"{where}: unknown field {sorted(unknown)[0]!r}")
    for key in ("vram", "h2d_bandwidth"):
        if key not in t:
            raise PlacerError(f"{where}.{key}: missing")
    sizes = {k: parse_bytes(t.get(k, 0), f"{where}.{k}")
             for k in ("vram", "reserved_dense", "reserved_kv", "reserved_activations")}
    for k, v in sizes.items():
        if v < 0:
            raise PlacerError(f"{where}.{k}: must not be negative")
    reserved = sizes["reserved_dense"] + sizes["reserved_kv"] + sizes["reserved_activations"]
    if reserved > sizes["vram"]:
        raise PlacerError(f"{where}.reserved_*: reserved bytes ({reserved}) exceed vram "
                          f"({sizes['vram']})")
    bandwidth = parse_rate(t["h2d_bandwidth"], f"{where}.h2d_bandwidth")
    if bandwidth <= 0:
        raise PlacerError(f"{where}.h2d_bandwidth: must be positive")
    latency_us = float(t.get("latency_us", 0.0))
    if latency_us < 0:
        raise PlacerError(f"{where}.latency_us: must not be negative")
    return Card(index, str(t.get("model", "GPU")), sizes["vram"], sizes["reserved_dense"],
                sizes["reserved_kv"], sizes["reserved_activations"], bandwidth, latency_us / 1e6)


def _link(index: int, t: dict, num_cards: int, source: str) -> Link:
    name = str(t.get("name", f"link{index}"))
    where = f"{source}: link {name!r}"
    cards = t.get("cards")
    if not isinstance(cards, list) or not cards:
        raise PlacerError(f"{where}.cards: must list card indices")
    for c in cards:
        if not isinstance(c, int) or not 0 <= c < num_cards:
            raise PlacerError(f"{where}.cards: unknown card {c!r} (cards are 0..{num_cards - 1})")
    if "bandwidth" not in t:
        raise PlacerError(f"{where}.bandwidth: missing")
    bandwidth = parse_rate(t["bandwidth"], f"{where}.bandwidth")
    if bandwidth <= 0:
        raise PlacerError(f"{where}.bandwidth: must be positive")
    return Link(name, tuple(cards), bandwidth)
