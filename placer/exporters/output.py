"""What every exporter checks about where it writes."""

from __future__ import annotations

from pathlib import Path

from placer.files import Inputs, check_outputs


def plan_file(plan: Path) -> Path:
    """The file `read_plan` reads for `plan` (a plan.json, a manifest.json, or a placed dir)."""
    plan = Path(plan)
    return plan / "manifest.json" if plan.is_dir() else plan


def check_out(plan: Path, out: Path, *more: tuple[str, Path | None]) -> Inputs:
    """What an export reads (the plan, or the placed directory's manifest, and `more`: a
    config, the GGUF), for the atomic writer to keep `out` apart from; refused now when `out`
    is, is inside or holds one of them, or lies in a checkpoint (placer.files.check_outputs),
    before anything is written."""
    inputs = [("the plan being exported", plan_file(plan)), *more]
    check_outputs([("--out", out)], inputs)
    return inputs
