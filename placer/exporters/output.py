"""What every exporter checks about where it writes."""

from __future__ import annotations

from pathlib import Path

from placer.errors import PlacerError


def plan_file(plan: Path) -> Path:
    """The file `read_plan` reads for `plan` (a plan.json, a manifest.json, or a placed dir)."""
    plan = Path(plan)
    return plan / "manifest.json" if plan.is_dir() else plan


def check_out(plan: Path, out: Path) -> None:
    """Refuse an `--out` that is the plan (or the placed directory's manifest) itself: writing
    there would destroy the input."""
    source, target = plan_file(plan).resolve(), Path(out).resolve()
    if source == target or (target.exists() and source.exists() and target.samefile(source)):
        raise PlacerError(f"--out {out} is the plan being exported ({source}); "
                          "write the export to another file")
