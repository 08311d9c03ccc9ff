"""The marks every summary closes with: what stands on estimates rather than on what was read
or measured, and where the full tables are."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from placer.report.figures import wrapped

if TYPE_CHECKING:
    from placer.plan.placement import Plan


def closing(plan: Plan, full: Path | None, notes: Sequence[str] = ()) -> list[str]:
    """`notes` (what the traces left out), the estimate marks and where the full tables are."""
    lines = [line for note in notes for line in wrapped(f"note: {note}")]
    lines += [f"estimate: {e}" for e in estimates(plan)]
    where = f"{full} (and --verbose)" if full is not None else "--verbose"
    return lines + [f"the full tables: {where}"]


def estimates(plan: Plan) -> list[str]:
    """What in the plan stands on estimates rather than what was read or measured."""
    out = []
    if plan.model.get("estimated"):
        out.append("the model's sizes come from its config.json (no weights read)")
    if "ESTIMATED" in plan.hardware.description:
        out.append("the spec has ESTIMATED figures: `placer probe` measures them")
    cut = [f"{r['profile']} B={r['concurrency']}" for r in plan.predicted if "judged_steps" in r]
    if cut:
        out.append(f"{', '.join(cut)} predicted on a prefix of the steps")
    return out
