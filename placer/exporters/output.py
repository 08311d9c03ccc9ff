"""What every exporter checks about where it writes."""

from __future__ import annotations

from pathlib import Path

from placer.files import Inputs, check_apart


def plan_file(plan: Path) -> Path:
    """The file `read_plan` reads for `plan` (a plan.json, a manifest.json, or a placed dir)."""
    plan = Path(plan)
    return plan / "manifest.json" if plan.is_dir() else plan


def check_out(plan: Path, out: Path, config: Path | None = None) -> Inputs:
    """What an export reads (the plan, or the placed directory's manifest; a config), for
    the atomic writer to keep `out` apart from; refused now when `out` is one of them or lies
    in a checkpoint (placer.files.check_apart), before anything is read."""
    inputs = [("the plan being exported", plan_file(plan)), ("the config", config)]
    check_apart(out, inputs)
    return inputs
