"""The backends llama.cpp runs a card with (CUDA with and without graphs, Vulkan, ROCm, Metal,
CPU), as they behave: what each adds to an expert's upload and a layer's hand-off, the largest
allocation it makes (a cache above it aborts at load), and the decode-step fit for each
backend and card tier. Both are package data beside the card table:

- placer/hardware/data/backends.csv: written by hand, each row with its source;
- placer/hardware/data/step_fit.csv: written by `python benchmarks/fit_step.py` from the
  published measurements in docs/research/llamacpp-measurements/ (placer/hardware/step_fit.py;
  a test re-runs the fit and compares).

A card's fit is its backend's row for its tier where the fit had enough rows of that tier,
else the backend's row over every tier (`any`).
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from functools import cache
from importlib import resources

from placer.checkpoint.step import StepFit
from placer.errors import PlacerError
from placer.hardware.cards import CardFigures
from traces.errors import shown

BACKENDS_TABLE = "data/backends.csv"
FIT_TABLE = "data/step_fit.csv"
UNKNOWN = "unknown"  # a spec that names no backend: taken for cuda where one matters
ANY_TIER = "any"


@dataclass(frozen=True)
class Backend:
    """One backend's costs and limits."""

    name: str
    vendors: tuple[str, ...]  # the card vendors it is `hardware new`'s default for
    upload_us: float          # what one expert upload costs beyond its bytes
    sync_us: float            # a layer's hand-off to the CPU and back
    max_alloc_mib: int        # the largest one allocation (a cache); 0: no limit
    source: str


@dataclass(frozen=True)
class FitRow:
    """One fitted (backend, tier) row of step_fit.csv: the StepFit and how well it
    reproduced its own sources (relative error of tok/s)."""

    backend: str
    tier: str
    share: float
    layer_us: float
    spread: tuple[float, float]
    rows: int
    median_error: float
    worst_error: float
    source: str

    def step_fit(self) -> StepFit:
        return StepFit(self.share, self.layer_us, self.spread,
                       f"{self.backend} fit, {self.tier} tier, {self.rows} published runs")


FIT_FIELDS = ("backend", "tier", "share", "layer_us", "spread_lo", "spread_hi", "rows",
              "median_error", "worst_error", "source")


def read_fit_rows(text: str) -> tuple[FitRow, ...]:
    """step_fit.csv's rows."""
    return tuple(FitRow(r["backend"], r["tier"], float(r["share"]), float(r["layer_us"]),
                        (float(r["spread_lo"]), float(r["spread_hi"])), int(r["rows"]),
                        float(r["median_error"]), float(r["worst_error"]), r["source"])
                 for r in csv.DictReader(io.StringIO(text)))


def _data(name: str) -> str:
    return resources.files("placer.hardware").joinpath(name).read_text(encoding="utf-8")


@cache
def backends() -> dict[str, Backend]:
    """backends.csv by name."""
    return {r["backend"]: Backend(r["backend"], tuple(v for v in r["vendors"].split("|") if v),
                                  float(r["upload_us"]), float(r["sync_us"]),
                                  int(r["max_alloc_mib"]), r["source"])
            for r in csv.DictReader(io.StringIO(_data(BACKENDS_TABLE)))}


@cache
def fit_rows() -> tuple[FitRow, ...]:
    """The shipped step_fit.csv."""
    return read_fit_rows(_data(FIT_TABLE))


def backend(name: str, what: str = "--backend") -> Backend:
    """The backend named `name` (UNKNOWN: cuda's figures), or a PlacerError naming `what`."""
    known = backends()
    found = known.get("cuda" if name == UNKNOWN else name)
    if found is None:
        raise PlacerError(f"{what}: unknown backend '{shown(name)}'; known: "
                          f"{', '.join(known)}")
    return found


def default_backend(card: CardFigures) -> str:
    """The backend a card of its vendor runs by default (backends.csv's `vendors`)."""
    return next(b.name for b in backends().values() if card.vendor in b.vendors)


def fit_for(card: CardFigures | None, name: str) -> FitRow:
    """The step fit for `card` on backend `name`: its tier's row, else (or for a card the
    table does not know, None) the backend's `any`."""
    rows = [r for r in fit_rows() if r.backend == backend(name).name]
    return next((r for r in rows if card is not None and r.tier == card.tier),
                next(r for r in rows if r.tier == ANY_TIER))
