"""The summary `placer plan` ends with: the choice, the held-out stall against layer offload
(-ncmoe N for a llama.cpp plan) and the plain cache with 95% intervals per traffic set and
concurrency, the verdicts, the estimate marks, where the full tables are, the command."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from placer.report.evaluate import ratio_lines
from placer.report.figures import shell_lines, wrapped
from placer.report.marks import estimate_lines
from placer.report.solve_summary import cache_lines, card_lines

if TYPE_CHECKING:
    from placer.plan.placement import Plan

FULL_TABLES = ("plan.txt", "evaluate.txt")  # under --out, where `placer plan` writes them


def plan_summary(plan: Plan, report: dict, command: str, out: Path) -> list[str]:
    """`plan` (written to OUT/plan.json), its held-out evaluation `report` (placer
    evaluate's, the --json form) and the `command` that runs it, in about 25 lines of at
    most 100 columns; the full tables are the files of FULL_TABLES under `out` that exist."""
    lines = [*choice_lines(plan, Path(out) / "plan.json"),
             f"held out: the placement's stall / each baseline's (95% interval), "
             f"{'every held-out token' if report['steps'] is None else report['replay']}"]
    lines += ratio_lines(report["results"])
    for v in report["verdicts"]:
        if not v["ok"] or v["verdict"] != "better":
            lines += wrapped(v["message"])
    lines += estimate_lines(plan)
    tables = [str(Path(out) / name) for name in FULL_TABLES if (Path(out) / name).is_file()]
    if tables:
        lines += wrapped(f"the full tables: {', '.join(tables)}")
    return [*lines, f"to run it ({Path(out) / 'run.sh'}):", *shell_lines(command)]


def choice_lines(plan: Plan, path: Path) -> list[str]:
    """What the plan chose: llama.cpp's host layers and cache, or placer's pins and slots."""
    if plan.engine is not None:
        from solvers.llamacpp.builds import build_from_json

        build = build_from_json(plan.engine.get("llamacpp_build") or {}).label
        return [f"plan: {path} for {build}", *wrapped(f"choice: {plan.engine['choice']}")]
    s = plan.solver
    return [f"plan: {path} for placer's runtime: solver {s['name']}, {s['status']}",
            *card_lines(plan), *cache_lines(plan.cache or {})]
