"""What placer knows of GPUs, host links and host memory before anything is measured: the
figures `placer hardware new` writes into a spec (marked ESTIMATED where they stand in for a
measurement) and `placer probe --step --estimate` divides by.

Cards: VRAM, memory bandwidth, and dense tensor throughput in bf16 (FP32 accumulate, as
torch's matmuls run) and int8, each with the vendor document it comes from (`source`). Where
the document prints only the sparse figure, or only the FP16-accumulate one, the dense
FP32-accumulate figure is derived from it as the document's own notes say (sparse = 2 x
dense; GeForce cards run FP16/BF16 with FP32 accumulate at half their FP16-accumulate rate,
workstation and data-centre cards at the full rate) and `derived` says how. Figures were
transcribed from the documents named (no network here to re-read them: a figure found wrong
is one line to fix); None where the document gives none. VRAM as the vendor writes it ("12
GB" of GDDR is 12 GiB), bandwidth in decimal GB/s.

Links: PCI Express generations by their transfer rate per lane (PCI-SIG base specifications:
3.0, 8 GT/s; 4.0, 16 GT/s; 5.0, 32 GT/s; all 128b/130b encoded), so a x16 link carries
16 x rate x 128/130 / 8 bytes/s one way (15.75 GB/s for 3.0). Host memory: DDR4 / DDR5 at a
transfer rate (MT/s) over 64-bit channels (JEDEC JESD79-4, JESD79-5): rate x 8 bytes per
channel. What a pinned copy or a streaming CPU copy reaches of those peaks is a typical
share (H2D_SHARE, STREAM_SHARE), marked ESTIMATED until `placer probe` measures it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from placer.errors import PlacerError
from traces.errors import shown

AMPERE_WP = ("NVIDIA Ampere GA102 GPU Architecture whitepaper v2.1, Appendix A "
             "(https://www.nvidia.com/content/PDF/nvidia-ampere-ga-102-gpu-architecture-"
             "whitepaper-v2.pdf)")
ADA_WP = ("NVIDIA Ada GPU Architecture whitepaper v2.01, Appendix A "
          "(https://images.nvidia.com/aem-dam/Solutions/geforce/ada/nvidia-ada-gpu-"
          "architecture.pdf)")
BLACKWELL_WP = ("NVIDIA RTX Blackwell GPU Architecture whitepaper v1.1, Appendix A "
                "(https://images.nvidia.com/aem-dam/Solutions/geforce/blackwell/nvidia-rtx-"
                "blackwell-gpu-architecture.pdf)")
GEFORCE_SPECS = "NVIDIA GeForce product page, Specs (https://www.nvidia.com/en-us/geforce/)"
GEFORCE_HALF = ("SMs x 4 tensor cores x 256 FP16-accumulate FLOP a clock x the boost clock; "
                "bf16 with FP32 accumulate at half that on GeForce, int8 at twice it (the "
                "appendix's own ratios)")


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

    @property
    def bandwidth(self) -> float:
        """Bytes/s of device memory."""
        return self.bandwidth_gbps * 1e9


CARDS = (
    CardFigures("RTX 3060", 12, 360.0, 25.5, 101.9, AMPERE_WP + "; " + GEFORCE_SPECS,
                "tensor figures derived (GA106 is not in the appendix): 28 SMs at the 1777 "
                "MHz boost clock; " + GEFORCE_HALF, ("RTX 3060 12GB",)),
    CardFigures("RTX 3090", 24, 936.0, 71.0, 284.0, AMPERE_WP),
    CardFigures("RTX 3090 Ti", 24, 1008.0, 80.0, 320.0, AMPERE_WP + "; " + GEFORCE_SPECS,
                "tensor figures: the RTX 3090's scaled by SMs x boost clock (84 x 1860 MHz "
                "against 82 x 1695 MHz)"),
    CardFigures("RTX 4060 Ti 16GB", 16, 288.0, 44.1, 176.5, ADA_WP + "; " + GEFORCE_SPECS,
                "tensor figures derived: 34 SMs at the 2535 MHz boost clock; " + GEFORCE_HALF,
                ("RTX 4060 Ti",)),
    CardFigures("RTX 4070", 12, 504.0, 58.3, 233.2, ADA_WP + "; " + GEFORCE_SPECS,
                "tensor figures derived: 46 SMs at 2475 MHz; " + GEFORCE_HALF),
    CardFigures("RTX 4080", 16, 716.8, 97.5, 389.9, ADA_WP),
    CardFigures("RTX 4090", 24, 1008.0, 165.2, 660.6, ADA_WP),
    CardFigures("RTX 4090 D", 24, 1008.0, None, None, GEFORCE_SPECS,
                "tensor figures not published for the D model"),
    CardFigures("RTX 5070", 12, 672.0, 61.7, 246.9, BLACKWELL_WP,
                "tensor figures derived: 48 SMs at 2512 MHz; " + GEFORCE_HALF),
    CardFigures("RTX 5080", 16, 960.0, 112.6, 450.2, BLACKWELL_WP),
    CardFigures("RTX 5090", 32, 1792.0, 209.5, 838.0, BLACKWELL_WP),
    CardFigures("RTX 5090 D", 32, 1792.0, None, None, GEFORCE_SPECS,
                "tensor figures not published for the D model (its AI TOPS are capped below "
                "the RTX 5090's)"),
    CardFigures("RTX A6000", 48, 768.0, 154.8, 309.7,
                "NVIDIA RTX A6000 datasheet (https://www.nvidia.com/content/dam/en-zz/Solutions"
                "/design-visualization/quadro-product-literature/proviz-print-nvidia-rtx-a6000-"
                "datasheet-us-nvidia-1454980-r9-web%20(1).pdf)",
                "tensor figures: the datasheet's 309.7 TFLOPS is FP16 with sparsity, so 154.8 "
                "dense; int8 dense 2 x that", ("A6000",)),
    CardFigures("RTX 6000 Ada", 48, 960.0, 364.2, 728.5,
                "NVIDIA RTX 6000 Ada Generation datasheet (https://www.nvidia.com/content/dam/"
                "en-zz/Solutions/design-visualization/rtx-6000/proviz-print-rtx6000-datasheet-"
                "web-2504660.pdf)",
                "tensor figures: the datasheet's 1457 TFLOPS is FP8 with sparsity: bf16 dense "
                "= 1457 / 4, int8 dense = 1457 / 2", ("RTX 6000 Ada Generation",)),
    CardFigures("RX 7900 XTX", 24, 960.0, 122.8, 122.8,
                "AMD Radeon RX 7900 XTX specifications (https://www.amd.com/en/products/"
                "graphics/desktops/radeon/7000-series/amd-radeon-rx-7900xtx.html)",
                "bf16 and int8: the page's peak half-precision figure (RDNA 3's WMMA runs "
                "BF16 and INT8 at the FP16 rate)", ("Radeon RX 7900 XTX",)),
    CardFigures("L40S", 48, 864.0, 362.0, 733.0,
                "NVIDIA L40S datasheet (https://resources.nvidia.com/en-us-l40s/l40s-datasheet-"
                "28413)", "dense: half the datasheet's with-sparsity figures"),
    CardFigures("A100", 80, 2039.0, 312.0, 624.0,
                "NVIDIA A100 datasheet, 80GB SXM (https://www.nvidia.com/content/dam/en-zz/"
                "Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-"
                "web.pdf)"),
    CardFigures("H100", 80, 3350.0, 989.0, 1979.0,
                "NVIDIA H100 datasheet, SXM (https://resources.nvidia.com/en-us-tensor-core/"
                "nvidia-tensor-core-gpu-datasheet)",
                "dense: half the datasheet's with-sparsity figures"),
    CardFigures("H200", 141, 4800.0, 989.0, 1979.0,
                "NVIDIA H200 product page, SXM (https://www.nvidia.com/en-us/data-center/h200/)",
                "dense: half the page's with-sparsity figures"),
    CardFigures("B200", 180, 8000.0, 2250.0, 4500.0,
                "NVIDIA DGX B200 datasheet (https://resources.nvidia.com/en-us-dgx-systems/dgx-"
                "b200-datasheet)", "per GPU: the 8-GPU system's dense figures / 8"),
)

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
    """card(name), or a PlacerError listing the cards placer knows."""
    found = card(name)
    if found is None:
        raise PlacerError(f"--card: placer knows no card '{shown(name)}'; known: "
                          f"{', '.join(c.name for c in CARDS)} (or start from a preset: "
                          "placer hardware list)")
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
