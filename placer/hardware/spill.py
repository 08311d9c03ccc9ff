"""Whether a card's buffers spill to host memory when they exceed its VRAM, or fail to load.

llama.cpp allocates what the flags put on a card (an `-ngl`/`-ncmoe`/`-ot` the user set is
never re-fitted: `common/fit.cpp` aborts its fit when they are set) and the backend's allocator
decides what happens past the card's memory: on Linux CUDA `cudaMalloc` fails and the load
fails; on Windows the NVIDIA driver's system memory fallback and AMD's HIP put the overflow in
shared host memory, which the card then reads over its host link. Vulkan asks for
device-local memory only unless GGML_VK_ALLOW_SYSMEM_FALLBACK is set. The table of
defaults, one row per (OS, backend) with its source, is package data
(placer/hardware/data/spill.csv); a spec names the OS (`os`, default linux) and a card may
say otherwise (`spills = true`: GGML_CUDA_ENABLE_UNIFIED_MEMORY=1 or
GGML_VK_ALLOW_SYSMEM_FALLBACK set; `false`: the fallback turned off in the driver).
"""

from __future__ import annotations

import csv
import io
from functools import cache
from importlib import resources

from placer.errors import PlacerError
from traces.errors import shown

SPILL_TABLE = "data/spill.csv"
OSES = ("linux", "windows", "wsl2", "macos")
DEFAULT_OS = "linux"


@cache
def spill_rows() -> dict[tuple[str, str], tuple[bool, str]]:
    """spill.csv by (os, backend): (spills, source)."""
    text = resources.files("placer.hardware").joinpath(SPILL_TABLE).read_text(encoding="utf-8")
    return {(r["os"], r["backend"]): (r["spills"] == "true", r["source"])
            for r in csv.DictReader(io.StringIO(text))}


def check_os(name: str, what: str = "--os") -> str:
    """`name` if it is an OS placer knows, else a PlacerError naming `what`."""
    if name not in OSES:
        raise PlacerError(f"{what}: unknown OS '{shown(name)}'; known: {', '.join(OSES)}")
    return name


def default_spills(os: str, backend: str) -> tuple[bool, str]:
    """Whether a card on `backend` (a backends.csv name; "unknown" is taken for cuda) spills
    by default on `os`, and the source that says so."""
    key = (os, "cuda" if backend == "unknown" else backend)
    return spill_rows().get(key, (False, f"no row for {os} and {backend}: taken as failing"))



def spill_note(spills: bool, why: str) -> str:
    """What `hardware new` writes beside the cards: whether they spill past VRAM, and why
    (HardwareSpec.spills)."""
    fate = "spills to host memory, read over the link each step" if spills else "fails to load"
    return (f"past VRAM: {fate} ({why}); set spills = {str(not spills).lower()} in [card] "
            f"where the box {'has the fallback turned off' if spills else 'is set to spill'}")
