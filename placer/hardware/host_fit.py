"""The share of the spec's host memory bandwidth that llama.cpp's CPU expert matmuls reach
(`[host] memory_bandwidth` is a streaming copy's: `placer probe --host`, or `hardware new`'s
estimate of one).

Decoding one token, ggml-cpu's MUL_MAT_ID (ggml/src/ggml-cpu/ggml-cpu.c
`ggml_compute_forward_mul_mat_id`, llama.cpp 0c1e5709 in llama-cpp-python 0.3.36) runs the
selected experts one after another; each expert's rows are cut into one chunk per thread
(64-row chunks when a single token uses it, fewer than 4 per thread, so `nth` chunks), and
every thread dot-products its rows' quantized blocks against the token (`vec_dot`, the
activations converted to the weights' `vec_dot_type` first). A thread reads a few tens of KB
of one expert, then moves to the next expert: short reads, dequantization and a barrier per
op, not a stream over all cores. So the CPU reads a host layer's experts at a share of the
streaming bandwidth, which this module holds, fitted to published llama.cpp runs
(benchmarks/fit_host.py, leave-one-group-out; placer/hardware/data/host_fit.csv keeps each
held-out fit and the fit on every group, with their sources). It applies where the spec has
no measured expert curve (`[[host.expert]]`, which times the expert itself).

The same file holds the share of a card's host-to-device bandwidth at which it reads what
spilled past its VRAM (solvers/llamacpp/cost.py, "the spill past VRAM"), fitted afterwards,
leave-one-group-out too, to the ratios between the settings of the groups whose runs spill
(each predicted with the host share fitted without the held-out group).
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from importlib import resources

HOST_FIT_TABLE = "data/host_fit.csv"
ALL_GROUPS = "none"  # the held_out of the fit on every group: the one placer uses


@dataclass(frozen=True)
class HostFit:
    """One fit: the group held out of it (ALL_GROUPS: none), the host share, the groups and
    runs it was fitted on, its root-mean-square log error there (of tok/s), the spill rate,
    the spilled groups it was fitted on and their root-mean-square log error of the pairs'
    ratios, and its sources."""

    held_out: str
    share: float
    groups: int
    runs: int
    rms_log_error: float
    spill_rate: float
    spill_groups: int
    spill_rms_log_error: float
    source: str


@cache
def host_fits() -> dict[str, HostFit]:
    """host_fit.csv by held-out group."""
    text = resources.files("placer.hardware").joinpath(HOST_FIT_TABLE).read_text(
        encoding="utf-8")
    return {r["held_out"]: HostFit(r["held_out"], float(r["share"]), int(r["groups"]),
                                   int(r["runs"]), float(r["rms_log_error"]),
                                   float(r["spill_rate"]), int(r["spill_groups"]),
                                   float(r["spill_rms_log_error"]), r["source"])
            for r in csv.DictReader(io.StringIO(text))}


_override: list[tuple[float, float]] = []


def llamacpp_host_share() -> float:
    """The host share placer uses: the fit on every group, or the one `using` sets."""
    return _override[-1][0] if _override else host_fits()[ALL_GROUPS].share


def llamacpp_spill_rate() -> float:
    """The spill rate placer uses: the fit on every spilled group, or the one `using` sets."""
    return _override[-1][1] if _override else host_fits()[ALL_GROUPS].spill_rate


@contextmanager
def using(share: float, spill_rate: float) -> Iterator[None]:
    """Predict with `share` and `spill_rate` in this process (benchmarks: the held-out fits,
    the fit's grid)."""
    _override.append((share, spill_rate))
    try:
        yield
    finally:
        _override.pop()
