"""What placer knows of GPUs, host links and host memory before anything is measured: the
figures `placer hardware new` writes into a spec (marked ESTIMATED where they stand in for a
measurement) and `placer probe --step --estimate` divides by.

Cards (the table is package data, placer/hardware/data/cards.csv): VRAM, memory bandwidth,
and dense tensor throughput in bf16 (FP32 accumulate, as torch's matmuls run) and int8, each
with the vendor document it comes from (`source`), the card's tier and vendor (what the decode
step's fit and the default backend go by: placer/hardware/step_fit.py). Where
the document prints only the sparse figure, or only the FP16-accumulate one, the dense
FP32-accumulate figure is derived from it as the document's own notes say (sparse = 2 x
dense; GeForce cards run FP16/BF16 with FP32 accumulate at half their FP16-accumulate rate,
workstation and data-centre cards at the full rate) and `derived` says how. Figures were
transcribed from the documents named (no network here to re-read them: a figure found wrong
is one line to fix); None where the document gives none. VRAM as the vendor writes it ("12
GB" of GDDR is 12 GiB), bandwidth in decimal GB/s. The cards the published llama.cpp
scoreboards measured (docs/research/llamacpp-measurements/) came from that research's
cards.csv, whose bandwidths were transcribed from spec sheets and not re-fetched: their
`source` says so; a unified-memory chip's VRAM is the configuration the source names.

Links: PCI Express generations by their transfer rate per lane (PCI-SIG base specifications:
3.0, 8 GT/s; 4.0, 16 GT/s; 5.0, 32 GT/s; all 128b/130b encoded), so a x16 link carries
16 x rate x 128/130 / 8 bytes/s one way (15.75 GB/s for 3.0). Host memory: DDR4 / DDR5 at a
transfer rate (MT/s) over 64-bit channels (JEDEC JESD79-4, JESD79-5): rate x 8 bytes per
channel. What a pinned copy or a streaming CPU copy reaches of those peaks is a typical
share (H2D_SHARE, STREAM_SHARE), marked ESTIMATED until `placer probe` measures it.
"""

from __future__ import annotations

import csv
import difflib
import io
import re
from dataclasses import dataclass
from importlib import resources

from placer.errors import PlacerError
from traces.errors import shown

CARD_TABLE = "data/cards.csv"  # package data beside this module
TIERS = ("gddr", "hbm", "legacy", "uma")  # what a card's memory and architecture make it
VENDORS = ("nvidia", "amd", "intel", "apple")


@dataclass(frozen=True)
class CardFigures:
    """One card's published figures."""

    name: str               # as a spec's `[card] model` names it
    vram_gib: float
    bandwidth_gbps: float   # decimal GB/s of device memory
    bf16_tflops: float | None  # dense tensor, FP32 accumulate
    int8_tops: float | None    # dense tensor
    source: str             # the vendor document the figures come from
    derived: str = ""       # how a figure not printed there was derived
    aliases: tuple[str, ...] = ()
    tier: str = "gddr"      # TIERS: the step fit's class of the card (step_fit.py)
    vendor: str = "nvidia"  # VENDORS: picks `hardware new`'s default backend

    @property
    def bandwidth(self) -> float:
        """Bytes/s of device memory."""
        return self.bandwidth_gbps * 1e9


def read_cards(text: str) -> tuple[CardFigures, ...]:
    """The card table from its CSV (`CARD_TABLE`): one row a card, aliases `|`-separated,
    empty tensor figures None."""
    def figure(value: str) -> float | None:
        return float(value) if value else None

    return tuple(CardFigures(
        r["name"], float(r["vram_gib"]), float(r["bandwidth_gbps"]), figure(r["bf16_tflops"]),
        figure(r["int8_tops"]), r["source"], r["derived"],
        tuple(a for a in r["aliases"].split("|") if a), r["tier"], r["vendor"])
        for r in csv.DictReader(io.StringIO(text)))


CARDS = read_cards(resources.files("placer.hardware").joinpath(CARD_TABLE).read_text(
    encoding="utf-8"))

# PCI Express generations: GT/s per lane (PCI-SIG base specifications 3.0, 4.0, 5.0).
PCIE_GTS = {"3.0": 8.0, "4.0": 16.0, "5.0": 32.0}
PCIE_SOURCE = "PCI-SIG PCI Express Base Specification (8 / 16 / 32 GT/s, 128b/130b)"
PCIE_LANES = (1, 2, 4, 8, 16)
H2D_SHARE = 0.8  # of a link's peak a pinned host-to-device copy typically reaches
# DDR transfer rates (MT/s) accepted: JEDEC's and the overclocked kits people run.
DDR_RATES = {"ddr4": (1600, 5333), "ddr5": (3200, 9600)}
DDR_SOURCE = "JEDEC JESD79-4 (DDR4) / JESD79-5 (DDR5): 64-bit channels, rate x 8 bytes"
MAX_CHANNELS = 24
STREAM_SHARE = 0.75  # of DDR's peak a streaming copy over all cores typically reaches
_PCIE = re.compile(r"^\s*(?:pcie\s*)?(\d\.\d)\s*x\s*(\d+)\s*$", re.IGNORECASE)
_DDR = re.compile(r"^\s*(ddr[45])-(\d+)\s*x\s*(\d+)\s*$", re.IGNORECASE)


def normalized(name: str) -> str:
    """A card name compared: lower case, vendor words and spaces dropped ("NVIDIA GeForce
    RTX 3060" and "rtx3060" are one)."""
    text = name.lower()
    for word in ("nvidia", "geforce", "amd", "radeon"):
        text = text.replace(word, "")
    return "".join(text.split())


def card(name: str) -> CardFigures | None:
    """The table's card named `name` (its name or an alias, normalized), or None."""
    key = normalized(name)
    return next((c for c in CARDS if key in {normalized(n) for n in (c.name, *c.aliases)}),
                None)


def known_card(name: str) -> CardFigures:
    """card(name), or a PlacerError naming the nearest cards placer knows (the table has
    about a hundred: `placer hardware cards` lists them)."""
    found = card(name)
    if found is None:
        near = difflib.get_close_matches(name[:100].lower(), [c.name.lower() for c in CARDS],
                                         n=5, cutoff=0.5)
        names = {c.name.lower(): c.name for c in CARDS}
        maybe = f"; nearest: {', '.join(names[n] for n in near)}" if near else ""
        raise PlacerError(f"--card: placer knows no card '{shown(name)}'{maybe} (`placer "
                          f"hardware cards` lists the {len(CARDS)} it knows; or start from a "
                          "preset: placer hardware list)")
    return found


# Words after a model name that make another card of it ("RTX 3060 Ti", "RTX 4090 D").
MODEL_SUFFIXES = frozenset({"ti", "super", "d", "ada", "xt", "xtx", "gre"})


def same_card(spec_model: str, device_name: str) -> bool:
    """Whether the GPU named `device_name` (as CUDA names it: "NVIDIA GeForce RTX 3060",
    "NVIDIA H100 80GB HBM3") is a `spec_model` card: its words, vendor words dropped, start
    with the model's, and the next one (if any) does not name another card of it ("Ti")."""
    def words(text: str) -> list[str]:
        return [w for w in re.split(r"[\s_-]+", text.lower())
                if w and w not in ("nvidia", "geforce", "amd", "radeon")]

    model, device = words(spec_model), words(device_name)
    if not model or device[:len(model)] != model:
        return False
    rest = device[len(model):]
    return not rest or rest[0] not in MODEL_SUFFIXES


def memory_bandwidth(card_model: str) -> float | None:
    """Bytes/s of `card_model`'s memory, or None for a card not in the table."""
    found = card(card_model)
    return None if found is None else found.bandwidth


def pcie_link(text: str) -> tuple[str, int, float]:
    """(generation, lanes, peak bytes/s one way) of "3.0x16" (or "pcie4.0x8")."""
    m = _PCIE.match(text)
    if not m or m[1] not in PCIE_GTS or int(m[2]) not in PCIE_LANES:
        raise PlacerError(f"--pcie: expected GEN x LANES with GEN one of "
                          f"{', '.join(PCIE_GTS)} and LANES one of "
                          f"{', '.join(map(str, PCIE_LANES))} (e.g. 4.0x16), got '{shown(text)}'")
    lanes = int(m[2])
    return m[1], lanes, PCIE_GTS[m[1]] * 1e9 * lanes * 128 / 130 / 8


def ddr_memory(text: str) -> tuple[str, int, int, float]:
    """(kind, MT/s, channels, peak bytes/s) of "ddr4-3200x2"."""
    m = _DDR.match(text)
    if m:
        kind, rate, channels = m[1].lower(), int(m[2]), int(m[3])
        low, high = DDR_RATES[kind]
        if low <= rate <= high and 1 <= channels <= MAX_CHANNELS:
            return kind, rate, channels, rate * 1e6 * 8 * channels
    ranges = "; ".join(f"{k} {lo}..{hi}" for k, (lo, hi) in DDR_RATES.items())
    raise PlacerError(f"--ram: expected KIND-RATExCHANNELS (e.g. ddr4-3200x2, ddr5-6000x2; "
                      f"MT/s {ranges}; 1..{MAX_CHANNELS} channels), got '{shown(text)}'")
