"""What a prediction rests on that nothing measured: the spec's ESTIMATED figures, each with
the probe that replaces it (the `"estimated"` of every command's --json), and where an
estimated decode step moves each predicted tokens/s (its step range, `tokens_per_s_step`).

The step range is derived from the stall, not re-priced: every replay prices the stall
without the base step (solvers/cost.py StepStats.summary, solvers/judge/intervals.py
line_figures, solvers/llamacpp/cost.py judge: the base step enters only tokens/s =
B / (base + stall)), so re-pricing with base x lo and base x hi would give the same stall,
and the range is exactly [B / (base x hi + stall), B / (base x lo + stall)]. It is separate
from the traffic interval (`tokens_per_s_ci95`, the variation between sequences at the
spec's base step); a spec whose `[decode] spread` is [1, 1] (a measured step) gives none.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from placer.hardware.spec import ESTIMABLE

if TYPE_CHECKING:
    from placer.hardware.spec import HardwareSpec

STEP_RANGE = "tokens_per_s_step"  # a figure's tokens/s at base x spread's hi and lo
STEP_FIGURE = "base_step_ms"


def estimated_json(*specs: HardwareSpec) -> list[dict[str, str]]:
    """The figures of `specs` marked estimated, once each in the order found, with the probe
    that measures each: [{"figure": "base_step_ms", "probe": "placer probe --step ..."}]."""
    names = dict.fromkeys(name for spec in specs for name in spec.estimated)
    return [{"figure": name, "probe": ESTIMABLE[name]} for name in names]


def step_range(spec: HardwareSpec, batch: int, stall_ms: float) -> list[float] | None:
    """[low, high] tokens/s of a step of `batch` stalling `stall_ms` when the base step lies
    anywhere in spec.step_range_s (module docstring); None where the spread is [1, 1]."""
    from solvers.judge.intervals import tokens_per_s  # numpy: not at the CLI's start

    if tuple(spec.step_spread) == (1.0, 1.0):
        return None
    fast, slow = spec.step_range_s(batch)
    stall = stall_ms / 1e3
    return [tokens_per_s(batch, slow, stall), tokens_per_s(batch, fast, stall)]


def step_range_field(spec: HardwareSpec, batch: int, stall_ms: float) -> dict[str, list[float]]:
    """{STEP_RANGE: step_range(...)} to merge into a figure, or {} where there is none."""
    found = step_range(spec, batch, stall_ms)
    return {} if found is None else {STEP_RANGE: found}


def add_step_ranges(rows: Iterable[dict], spec: HardwareSpec) -> None:
    """Give every predicted figure of `rows` (one per concurrency, `concurrency` its batch;
    a figure is a dict with tokens_per_s and stall_ms_per_step, at any depth: a line's,
    a llama.cpp option's) its step range, where the spec has one."""
    for row in rows:
        for figure in _figures(row):
            figure.update(step_range_field(spec, int(row["concurrency"]),
                                           figure["stall_ms_per_step"]))


def _figures(d: dict) -> list[dict]:
    """The dicts under `d` (itself included) holding a tokens/s and a stall."""
    if "tokens_per_s" in d and "stall_ms_per_step" in d:
        return [d]
    return [f for v in d.values() if isinstance(v, dict) for f in _figures(v)]
