"""The marks every summary closes with: what stands on estimates rather than on what was read
or measured, and where the full tables are; and the marks of every table's tok/s and ms
where the spec's figures are ESTIMATED (`estimated`: placer/plan/estimates.py's list of
{"figure", "probe"}, what every --json carries), with each figure's step range."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from placer.plan.estimates import STEP_FIGURE, STEP_RANGE, estimated_json
from placer.report.figures import wrapped

if TYPE_CHECKING:
    from placer.plan.placement import Plan

MARK = "ESTIMATED"
SUMMARY_PROBES = 1  # probes a summary names (the base step's first); the full tables: all


def closing(plan: Plan, full: Path | None, notes: Sequence[str] = ()) -> list[str]:
    """`notes` (what the traces left out), the estimate marks and where the full tables are."""
    lines = [line for note in notes for line in wrapped(f"note: {note}")]
    lines += estimate_lines(plan)
    where = f"{full} (and --verbose)" if full is not None else "--verbose"
    return lines + [f"the full tables: {where}"]


def estimate_lines(plan: Plan) -> list[str]:
    """The plan's estimates, a line each ("estimate: ..."), wrapped."""
    return [line for e in estimates(plan) for line in wrapped(f"estimate: {e}")]


def estimates(plan: Plan) -> list[str]:
    """What in the plan stands on estimates rather than what was read or measured."""
    out = []
    if plan.model.get("estimated"):
        out.append("the model's sizes come from its config.json (no weights read)")
    out += spec_estimates(estimated_json(plan.hardware), SUMMARY_PROBES)
    cut = [f"{r['profile']} B={r['concurrency']}" for r in plan.predicted if "judged_steps" in r]
    if cut:
        out.append(f"{', '.join(cut)} predicted on a prefix of the steps")
    return out


def spec_estimates(estimated: Sequence[dict], most: int | None = None) -> list[str]:
    """What rests on the spec's ESTIMATED figures and the probe that replaces each, grouped
    by probe (the first `most` groups, the base step's first: a summary's few lines; the
    rest are in the full tables): every tok/s; every stall ms too unless only the base step
    is estimated (the stall is priced without it: placer/plan/estimates.py)."""
    if not estimated:
        return []
    names = [e["figure"] for e in estimated]
    rests = "every tok/s" + ("" if names == [STEP_FIGURE] else " and ms")
    by_probe: dict[str, list[str]] = {}
    for e in sorted(estimated, key=lambda e: e["figure"] != STEP_FIGURE):
        by_probe.setdefault(e["probe"], []).append(e["figure"])
    groups = [f"{', '.join(figures)}: {probe}" for probe, figures in by_probe.items()]
    more = len(groups) - (len(groups) if most is None else most)
    return ([f"{rests} rests on the spec's {MARK} {', '.join(names)}; ratios move far less"]
            + groups[:len(groups) - more]
            + ([f"the probes of the other {more} groups of figures: the full tables"]
               if more > 0 else []))


def table_marks(estimated: Sequence[dict]) -> list[str]:
    """The lines under a table whose tok/s (and ms) columns are marked."""
    return [line for e in spec_estimates(estimated) for line in wrapped(f"{MARK}: {e}")]


def marked(header: str, estimated: Sequence[dict], *, stall: bool = False) -> str:
    """A tok/s column's `header` (`stall`: an ms column's) marked where its figures rest on
    an ESTIMATED figure: a tok/s on any, a stall on any but the base step."""
    names = {e["figure"] for e in estimated} - ({STEP_FIGURE} if stall else set())
    return f"{header} {MARK}" if names else header


STEP_COLUMN = "step estimated tok/s"  # a table's column of step ranges, where it has any


def step_cell(figure: dict, key: str = STEP_RANGE) -> str:
    """A figure's step range in a table's STEP_COLUMN, "41.00-63.00", or "" where it has
    none."""
    found = figure.get(key)
    return "" if found is None else f"{found[0]:.2f}-{found[1]:.2f}"


def step_ranges(label: str, figures: dict[str, dict]) -> list[str]:
    """Under a table with no room for a column of them: the step range of each named figure
    that has one, "step estimated tok/s, B=1: placement 41.00-63.00, ...", wrapped."""
    ranges = [f"{name} {step_cell(f)}" for name, f in figures.items() if STEP_RANGE in f]
    return wrapped(f"{STEP_COLUMN}, {label}: {', '.join(ranges)}") if ranges else []


def step_text(figure: dict, key: str = STEP_RANGE, fmt: str = "{:.2f}") -> str:
    """A figure's step range, "step estimated: 41.00-63.00 tok/s", or "" where it has none
    (a measured step, a spread of [1, 1])."""
    found = figure.get(key)
    if found is None:
        return ""
    return f"step estimated: {fmt.format(found[0])}-{fmt.format(found[1])} tok/s"
