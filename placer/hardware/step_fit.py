"""The decode-step fit: per backend (and card tier where the data holds enough of one), the
share of a card's published bandwidth that weights stream at and a decoder layer's fixed cost
(launches, syncs), fitted to published llama.cpp measurements, and the range its own sources
lie in. `python benchmarks/fit_step.py` runs it on docs/research/llamacpp-measurements/ and
writes placer/hardware/data/step_fit.csv (read by placer/hardware/backends.py); a test re-runs
it and compares.

The measurements (read NOTES.md there first): llama.cpp's scoreboards (ggml-org/llama.cpp
discussions #15013 CUDA, #10879 Vulkan, #15021 ROCm, #4167 Apple; scraped or transcribed by
third parties, each row naming the path) time `llama-bench -m llama-2-7b.Q4_0.gguf -ngl 99`:
tg128, 128 tokens decoded from an empty context, so the step reads the weights (3.56 GiB, 32
layers; Apple's #4167 also F16 and Q8_0 of LLaMA 7B) and no KV: every weight but the token
embedding table (32,000 x 4,096), of which a token reads one row (`read_bytes`; the table is
in the file's own type: 3.56 GiB is LLaMA 7B's 6.74 B weights at Q4_0's 4.5 bits with the
output head at Q6_K, llama.cpp's quantizer's rule, src/llama-quant.cpp). Each row's card is the card
table's (placer/hardware/cards.py, whose bandwidth the estimate divides by); a row is left out
where its card's bandwidth is ambiguous or unposted (the research cards.csv says so) or
where NOTES.md finds it wrong (`SUSPECT`), and a repeat of a row (one run transcribed twice)
counts once. FA on and off count as two runs of the card (FA moves tg128 by 2-5%).

Model: step = bytes / (share x bandwidth) + layers x layer_us (checkpoint.step.step_ms, which
the estimate uses too). Fitted by least squares on the relative error of the step (a 3 ms and a
30 ms step weigh alike): linear in 1/share and layer_us; a negative per-layer cost is refitted
at 0, a share above 1 at 1 (the better of the two). A group (backend, tier) with at least
MIN_ROWS rows gets its own row; every backend gets an `any` row over all its tiers. Its spread
is the 5th-95th percentile of measured / predicted step over its rows (widened to hold 1), its
errors the median and worst |predicted / measured tok/s - 1|.

CUDA without graphs has no published scoreboard: its rows are CUDA's with a per-layer cost
raised by NOGRAPHS_GAIN of the fitted CUDA step of Llama 2 7B Q4_0 on an H100 (NVIDIA's
"Optimizing llama.cpp AI Inference with CUDA Graphs", developer.nvidia.com, 2024: graphs give
up to 1.2x on H100 for small models), over its 32 layers: an upper bound, so the spread's low
end is divided by the gain. CPU has no usable row (the one CPU run posts no RAM): its row is
the bandwidth floor at STREAM_SHARE (cards.py) with CPU_SPREAD, marked as assumed.
"""

from __future__ import annotations

import csv
import io
import math
import statistics
from dataclasses import dataclass

import numpy as np

from placer.checkpoint.step import StepFit, step_ms
from placer.errors import PlacerError
from placer.hardware.backends import ANY_TIER, FIT_FIELDS, FitRow
from placer.hardware.cards import STREAM_SHARE, CardFigures, card

GIB = 2**30
LAYERS = 32  # LLaMA (v1, 2) 7B's decoder layers
VOCAB, HIDDEN = 32000, 4096  # LLaMA (v1, 2) 7B's token embedding table
TABLE_BYTES_A_WEIGHT = {"Q4_0": 18 / 32, "Q8_0": 34 / 32, "F16": 2.0}  # ggml's block sizes
MIN_ROWS = 4
BACKENDS = {"CUDA": "cuda", "ROCm": "rocm", "Vulkan": "vulkan", "Metal": "metal", "CPU": "cpu"}
SUSPECT = {("Vulkan", "Apple M3"): "1.01 of its bandwidth: its label or bandwidth is wrong "
                                   "(NOTES.md section 2)"}
NOGRAPHS_GAIN = 1.2
NOGRAPHS_CARD = "H100"
NOGRAPHS_SOURCE = ("CUDA rows with layer_us raised by {gain:g}x's share of the CUDA step of "
                   "Llama 2 7B Q4_0 on an H100 over 32 layers: NVIDIA, 'Optimizing llama.cpp "
                   "AI Inference with CUDA Graphs' (developer.nvidia.com/blog, 2024: up to "
                   "{gain:g}x); no graphs-off scoreboard is published")
CPU_SOURCE = ("ASSUMED, not fitted: the host's streaming share (cards.STREAM_SHARE) and a "
              "factor of 2 either way; the one CPU run published (a 12-core Xeon, "
              "dense_scoreboard.csv) posts no RAM")
CPU_SPREAD = (0.5, 2.0)


@dataclass(frozen=True)
class Run:
    """One published tg128 run: the card, its backend, what a step reads, tok/s."""

    label: str
    backend: str
    card: CardFigures
    read_bytes: float
    tok_s: float
    source: str

    def predicted_ms(self, fit: StepFit) -> float:
        return step_ms(self.read_bytes, LAYERS, self.card.bandwidth, fit)

    @property
    def measured_ms(self) -> float:
        return 1e3 / self.tok_s


def read_runs(scoreboard: str, research_cards: str) -> tuple[list[Run], list[tuple[str, str]]]:
    """The runs a fit uses from dense_scoreboard.csv's text, and (label, why) for every card
    label left out, once each; research_cards is the research cards.csv (its notes flag the
    ambiguous bandwidths). A label of a usable row that the card table lacks is an error:
    the table must cover every card the sources measured."""
    flagged = {r["card"]: r["notes"] or "no published bandwidth"
               for r in csv.DictReader(io.StringIO(research_cards))
               if not r["bandwidth_GBps"] or "AMBIGUOUS" in r["notes"] or "ASSUMED" in r["notes"]}
    runs, seen, left = [], set(), {}
    for r in csv.DictReader(io.StringIO(scoreboard)):
        label = r["card"].split(" (willitrun")[0]
        why = flagged.get(r["card"]) or flagged.get(label) or SUSPECT.get((r["backend"], label))
        if why:
            left.setdefault(label, why)
            continue
        found = card(label)
        if found is None:
            raise PlacerError(f"dense_scoreboard.csv: card {label!r} is not in the card table "
                              "(placer/hardware/data/cards.csv)")
        size, unit = r["model_size_bytes"].split()
        if unit != "GiB":
            raise PlacerError(f"dense_scoreboard.csv: model size {r['model_size_bytes']!r}: "
                              "expected GiB")
        tok_s = float(r["tg128"].split("±")[0])
        key = (found.name, r["backend"], size, tok_s)
        if key not in seen:
            seen.add(key)
            runs.append(Run(label, BACKENDS[r["backend"]], found,
                            read_bytes(float(size) * GIB, r["model"]), tok_s,
                            f"{r['source']}, {r['date']}"))
    return runs, sorted(left.items())


def read_bytes(file_bytes: float, model: str) -> float:
    """Bytes a decode token of LLaMA 7B in the file of `file_bytes` reads: all but the token
    embedding table's other rows (the table in the file's type, named in `model`)."""
    kind = next((q for q in TABLE_BYTES_A_WEIGHT if q in model), None)
    if kind is None:
        raise PlacerError(f"dense_scoreboard.csv: model {model!r}: expected a LLaMA 7B in "
                          f"{', '.join(TABLE_BYTES_A_WEIGHT)}")
    return file_bytes - (VOCAB - 1) * HIDDEN * TABLE_BYTES_A_WEIGHT[kind]


def fit_runs(runs: list[Run]) -> StepFit:
    """(share, layer_us) minimising the squared relative error of the step over `runs`, with
    share <= 1 and layer_us >= 0 (the least-squares point, else the best on a bound)."""
    x = np.array([r.read_bytes / r.card.bandwidth / r.measured_ms * 1e3 for r in runs])
    z = np.array([LAYERS / 1e3 / r.measured_ms for r in runs])
    (inverse, layer_us), *_ = np.linalg.lstsq(np.stack([x, z], axis=1), np.ones(len(runs)),
                                              rcond=None)
    if inverse < 1 or layer_us < 0:
        no_layer = (max(1.0, float(x.sum() / (x * x).sum())), 0.0)
        full = (1.0, max(0.0, float((z * (1 - x)).sum() / (z * z).sum())))
        inverse, layer_us = min((no_layer, full), key=lambda p: float(
            ((p[0] * x + p[1] * z - 1) ** 2).sum()))
    return StepFit(round(1 / float(inverse), 3), round(float(layer_us), 1))


def scored(backend: str, tier: str, fit: StepFit, runs: list[Run], source: str) -> FitRow:
    """The FitRow of `fit` over `runs`: spread and errors as the module docstring says."""
    ratios = [r.measured_ms / r.predicted_ms(fit) for r in runs]
    deciles = statistics.quantiles(ratios, n=20, method="inclusive")
    spread = (math.floor(min(deciles[0], 1.0) * 100) / 100,  # rounded outwards
              math.ceil(max(deciles[-1], 1.0) * 100) / 100)
    errors = [abs(1 / q - 1) for q in ratios]
    return FitRow(backend, tier, fit.share, fit.layer_us, spread, len(runs),
                  round(statistics.median(errors), 3), round(max(errors), 3), source)


def sources_of(runs: list[Run]) -> str:
    """The distinct sources of `runs`, with how many runs each gave."""
    counts: dict[str, int] = {}
    for r in runs:
        counts[r.source] = counts.get(r.source, 0) + 1
    return "; ".join(f"{s} ({n} runs)" for s, n in counts.items())


def fit_all(runs: list[Run]) -> list[FitRow]:
    """Every backend's `any` row and each tier's with MIN_ROWS runs; CUDA without graphs and
    CPU as the module docstring says."""
    rows = []
    for backend in dict.fromkeys(r.backend for r in runs):
        mine = [r for r in runs if r.backend == backend]
        whole = fit_runs(mine)
        rows.append(scored(backend, ANY_TIER, whole, mine, sources_of(mine)))
        for tier in dict.fromkeys(r.card.tier for r in mine):
            group = [r for r in mine if r.card.tier == tier]
            if len(group) >= MIN_ROWS and len(group) < len(mine):
                rows.append(scored(backend, tier, fit_runs(group), group, sources_of(group)))
    rows += nographs(rows)
    if not any(r.backend == "cpu" for r in rows):
        rows.append(FitRow("cpu", ANY_TIER, STREAM_SHARE, 0.0, CPU_SPREAD, 0, 0.0, 0.0,
                           CPU_SOURCE))
    return rows


def nographs(rows: list[FitRow]) -> list[FitRow]:
    """cuda-nographs: each CUDA row with the per-layer cost graphs save (module docstring);
    not fitted (no run of its own), so no rows and no errors."""
    whole = next(r for r in rows if r.backend == "cuda" and r.tier == ANY_TIER)
    h100 = card(NOGRAPHS_CARD)
    assert h100 is not None
    step = step_ms(read_bytes(3.56 * GIB, "Q4_0"), LAYERS, h100.bandwidth, whole.step_fit())
    extra = round((NOGRAPHS_GAIN - 1) * step / LAYERS * 1e3, 1)
    return [FitRow("cuda-nographs", row.tier, row.share, round(row.layer_us + extra, 1),
                   (round(row.spread[0] / NOGRAPHS_GAIN, 2), row.spread[1]), 0, 0.0, 0.0,
                   NOGRAPHS_SOURCE.format(gain=NOGRAPHS_GAIN))
            for row in rows if row.backend == "cuda"]


def fit_csv(rows: list[FitRow]) -> str:
    """step_fit.csv's text."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(FIT_FIELDS)
    for r in rows:
        writer.writerow([r.backend, r.tier, f"{r.share:g}", f"{r.layer_us:g}",
                         f"{r.spread[0]:g}", f"{r.spread[1]:g}", r.rows,
                         f"{r.median_error:g}", f"{r.worst_error:g}", r.source])
    return out.getvalue()


def fit_table(rows: tuple[FitRow, ...] | list[FitRow]) -> str:
    """The fit as docs/hardware.md shows it: one Markdown line a row (a test keeps them in
    step with step_fit.csv)."""
    lines = ["| backend | tier | runs | share | us a layer | spread | median error | "
             "worst error |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        errors = (f"{100 * r.median_error:.1f}% | {100 * r.worst_error:.1f}%" if r.rows
                  else "not fitted | not fitted")
        lines.append(f"| {r.backend} | {r.tier} | {r.rows} | {r.share:g} | {r.layer_us:g} | "
                     f"{r.spread[0]:g}-{r.spread[1]:g} | {errors} |")
    return "\n".join(lines)
