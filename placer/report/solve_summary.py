"""What `placer solve` ends with: `report_solve` writes the full tables beside the plan
(plan.json -> plan.txt) and prints the summary (a plan for placer's runtime: the solver, the
cards, the cache, the predicted stall against layer offload; a llama.cpp plan's:
report/llamacpp.py), or with --verbose the tables."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from placer.plan.estimates import estimated_json
from placer.report.figures import beside, capped, columns, finish, label, span, wrapped
from placer.report.llamacpp import llamacpp_summary, print_llamacpp
from placer.report.marks import MARK, closing, step_text
from placer.report.prefetch import prefetch_lines
from placer.report.solve import guard_served, print_plan, solver_bound
from placer.units import format_bytes

if TYPE_CHECKING:
    from placer.files import Inputs
    from placer.plan.placement import Plan


def report_solve(plan: Plan, out: Path, notes: Sequence[str] = (), *, verbose: bool = False,
                 quiet: bool = False, inputs: Inputs = ()) -> None:
    """The full tables of `plan` (written to `out`) to the text file beside it; then the
    summary on stdout, or with `verbose` the tables, or with `quiet` nothing (--json)."""
    if plan.engine is not None:
        show, summary = (lambda: print_llamacpp(plan, out)), llamacpp_summary
    else:
        show, summary = (lambda: print_plan(plan, out, notes)), solve_summary
    finish(show, lambda full: summary(plan, out, full, notes), beside(out), verbose=verbose,
           quiet=quiet, inputs=inputs)


def solve_summary(plan: Plan, out: Path, full: Path | None, notes: Sequence[str] = ()
                  ) -> list[str]:
    """A plan for placer's runtime in a few lines: the solver, the cards, the cache, prefetch,
    the predicted stall against layer offload per profile and concurrency, the estimates, where
    the full tables are."""
    s = plan.solver
    lines = [f"plan written to {out}",
             f"solver {s['name']}: {s['status']}, {solver_bound(s)}"
             + (f", {s['seconds']:.2f} s" if "seconds" in s else "")
             + f", {len(plan.cards)} card{'s' if len(plan.cards) != 1 else ''}"]
    lines += wrapped(f"note: {s['note']}") if s.get("note") else []
    lines += card_lines(plan)
    lines += cache_lines(plan.cache or {}) + prefetch_lines(plan.prefetch, replayed_only=True)
    estimated = estimated_json(plan.hardware)
    lines.append("predicted on calibration traffic: stall / layer offload (95% interval)"
                 + (f", tok/s {MARK} (below)" if estimated else ""))
    lines += capped(columns([(label(r["profile"]), f"B={r['concurrency']}",
                              f"{r['ratio_to_layer']:.3f}x {span(r['ratio_to_layer_ci95'])}",
                              f"{r['placement']['tokens_per_s']:.2f} tok/s",
                              absolute(r, "layer", "layer offload", bool(estimated)))
                             for r in plan.predicted]))
    if plan.robust:
        worst = plan.robust.get("worst_ratio") or max(plan.robust["ratios"].values())
        lines.append(f"robust: at most {worst:.3f}x layer offload's stall on any traffic set "
                     "and concurrency")
    return lines + closing(plan, full, notes)


def absolute(row: dict, line: str, name: str, estimated: bool) -> str:
    """The last cell of a summary's prediction row: the placement's step range where its base
    step is an estimate ("step estimated: 41.0-63.0 tok/s"), else `line`'s tokens/s (on an
    estimated spec an absolute figure says little beyond the ratio before it)."""
    step = step_text(row["placement"], fmt="{:.1f}")
    if step or estimated:
        return step
    return f"({name} {row[line]['tokens_per_s']:.2f})"


def card_lines(plan: Plan, most: int = 4) -> list[str]:
    """One line per kind of card (cards alike in budget, pins and slots share one)."""
    kinds: dict[str, list[int]] = {}
    for c in plan.cards:
        slots = (f"{c.cache_slots} x {format_bytes(c.slot_bytes)} cache slots ({c.cache_policy})"
                 if c.cache_slots else "no cache slots")
        kinds.setdefault(f"{format_bytes(c.resident_bytes)} pinned of "
                         f"{format_bytes(c.budget_bytes)}, {slots}, "
                         f"{format_bytes(c.homed_bytes - c.resident_bytes)} cold", []
                         ).append(c.index)
    lines = [f"card{'s' if len(ids) > 1 else ''} {','.join(map(str, ids))}: {what}"
             for what, ids in kinds.items()]
    return lines if len(lines) <= most else [*lines[:most - 1],
                                             f"... {len(lines) - most + 1} more kinds of card"]


def cache_lines(cache: dict) -> list[str]:
    """The cache's choice in a line (and a line where the guard changed it)."""
    if cache.get("mode") == "off":
        return wrapped(f"cache: none ({cache['reason']})")
    if not cache:
        return []
    how = "pooled" if cache.get("pooled") else "per layer"
    judged = ("in sample" if cache["held_out"] == "in sample"
              else f"held out, {cache['folds']}" if cache["folds"] else "held out")
    lines = wrapped(f"cache: {cache['policy']} {how}, {cache['mode']}: {cache['chosen']}, "
                    f"judged {judged}: {cache['held_out_stall_ms_per_step']:.4f} ms/step")
    found = cache.get("guard")
    if found and found["switched"]:
        was, now = found["instead_of"], guard_served(found, cache)
        lines += wrapped(f"guard: {was[1]}{' pooled' if was[2] else ''} on the {was[0]}'s pins "
                         f"and slots was set aside for {now[1]}{' pooled' if now[2] else ''} "
                         "(why: the full tables)")
    return lines

