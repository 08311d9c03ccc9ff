"""The full tables of a plan for placer's runtime: the solver, the cards, the cache split and
the policies it was judged under, the predictions (its summary: solve_summary.py)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table

from placer.plan.estimates import STEP_RANGE, estimated_json
from placer.report.figures import bold, plus_minus, print_table, span
from placer.report.figures import console as rich_console
from placer.report.marks import STEP_COLUMN, marked, step_cell, table_marks
from placer.report.prefetch import prefetch_lines
from placer.units import format_bytes

if TYPE_CHECKING:
    from placer.plan.placement import Plan


def print_plan(plan: Plan, out: Path, notes: Sequence[str] = ()) -> None:
    """The full tables of a plan: solver quality, cards, the cache split, predictions; then
    `notes` (what the traces left out)."""
    console = rich_console()
    s = plan.solver
    bound = solver_bound(s)
    console.print(f"solver {s['name']}: objective {s['objective']:.6g} ({s['objective_unit']}), "
                  f"{bound}" + (f", {s['seconds']:.2f} s" if "seconds" in s else "")
                  + f", {s['status']}")
    if s.get("note"):
        console.print(f"note: {s['note']}", highlight=False)
    cards = Table(title="cards")
    for col in ("card", "budget", "staging", "pinned", "cache slots", "homed experts",
                "cold"):
        cards.add_column(col, justify="right")
    for c in plan.cards:
        slots = (f"{c.cache_slots} x {format_bytes(c.slot_bytes)} ({c.cache_policy})"
                 if c.cache_slots else "0")
        cards.add_row(str(c.index), format_bytes(c.budget_bytes), format_bytes(c.staging_bytes),
                      format_bytes(c.resident_bytes), slots, format_bytes(c.homed_bytes),
                      format_bytes(c.homed_bytes - c.resident_bytes))
    print_table(cards, console)
    estimated = estimated_json(plan.hardware)
    print_cache(plan.cache or {}, estimated)
    for line in prefetch_lines(plan.prefetch):
        console.print(line, highlight=False)
    print_table(prediction_table(plan.predicted, "predicted on calibration traffic (± 95% "
                                                 "bootstrap interval over sequences)",
                                 estimated), console)
    for line in table_marks(estimated):
        console.print(line, highlight=False)
    for r in plan.predicted:
        if "judged_steps" in r:
            kept, steps = r["judged_steps"]
            console.print(f"{r['profile']} B={r['concurrency']} predicted on its first {kept} "
                          f"of {steps} steps (in sample, a large calibration: a prefix bounds the "
                          "replay's seconds)")
    if plan.robust:
        ratios = ", ".join(f"{k}: {v:.3f}" for k, v in plan.robust["ratios"].items())
        console.print(f"robust: stall / layer-offload stall per profile and concurrency: {ratios}")
    console.print(f"plan written to {out}")
    for note in notes:
        console.print(f"note: {note}", highlight=False)


def solver_bound(solver: dict) -> str:
    """"bound B, gap G%", or "bound n/a" where the solver proved none (None or NaN: greedy,
    a time limit before any bound), and the gap likewise."""
    bound, gap = solver.get("bound"), solver.get("gap")
    if bound is None or not math.isfinite(bound):
        return "bound n/a"
    gap_text = "n/a" if gap is None or not math.isfinite(gap) else f"{100 * gap:.2f}%"
    return f"bound {bound:.6g}, gap {gap_text}"


def print_cache(cache: dict, estimated: Sequence[dict]) -> None:
    """How the split between pins and slots was chosen: every candidate's held-out figures,
    the chosen one marked (and its ms columns where they rest on `estimated`)."""
    console = rich_console()
    if cache.get("mode") == "off":
        console.print(f"cache: none ({cache['reason']})")
        return
    if not cache:
        return
    judged = {"in sample": "in sample (too few sequences for folds)"}.get(
        cache["held_out"], f"held out: {cache['held_out']}"
        + (f" ({cache['folds']})" if cache["folds"] else ""))
    regret = cache.get("held_out_regret")
    unlike = cache.get("held_out_unlike_stall_ms_per_step")
    how = "pooled (one pool per card)" if cache.get("pooled") else "per layer"
    console.print(f"cache: {cache['policy']} {how}, {cache['mode']}: {cache['chosen']}, "
                  f"judged {judged}: held-out stall {cache['held_out_stall_ms_per_step']:.4f} "
                  f"ms/step" + ("" if unlike is None else
                                f", {unlike:.4f} on the same folds with experts renamed "
                                f"(traffic unlike the calibration)")
                  + ("" if regret is None else
                     f", regret {regret:.4f} (mean stall / the plain cache's)"))
    table = Table(title="candidates on the same held-out traffic (each chosen without the "
                        "part it is judged on)")
    columns = ["candidate", "pinned", "cache slots", marked("stall ms/step", estimated, stall=True)]
    columns += [marked("renamed ms/step", estimated, stall=True)] if unlike is not None else []
    plain = next((c for c in cache["candidates"] if c["kind"] == "cache"), None)
    for col in columns + (["regret (ratio)"] if regret is not None else []):
        table.add_column(col, justify="left" if col == "candidate" else "right")
    for c in cache["candidates"]:
        row = [("* " if c["chosen"] else "  ") + c["name"], str(c["pinned"]), str(c["slots"]),
               f"{c['held_out_stall_ms_per_step']:.4f}"]
        if unlike is not None:
            renamed = c["held_out_unlike_stall_ms_per_step"]
            row.append("-" if renamed is None else f"{renamed:.4f}")
        if regret is not None:
            row.append(f"{c['held_out_regret']:.4f}")
        table.add_row(*row, style="bold" if c["chosen"] else None)
    print_table(table, console)
    print_policies(cache, console, estimated)
    for note in cache.get("notes", []):
        console.print(f"note: {note}")
    if unlike is not None and regret is None and plain is not None \
            and unlike > plain["held_out_unlike_stall_ms_per_step"]:
        console.print(f"note: on traffic unlike the calibration (the held-out folds with each "
                      f"layer's experts renamed, as another task would route) this split "
                      f"stalls {unlike / plain['held_out_unlike_stall_ms_per_step']:.2f}x the "
                      f"plain cache; if the serving traffic may differ from the calibration, "
                      f"--robust weighs that in")


def print_policies(cache: dict, console: Console, estimated: Sequence[dict] = ()) -> None:
    """The policies the chosen split (and the plain cache) was judged under (--cache-policy
    auto), the chosen one marked: held-out stall per step on the same folds and on them
    renamed (the learned weights of each fold fitted on the other folds); a line where the
    guard (solvers/cache/choice.py) changed the choice, and why."""
    rows = cache.get("policies") or []
    if not rows:
        return
    judged = cache.get("policy_judged_share", 1.0)
    table = Table(title="cache policies serving the chosen split and the plain cache, on the "
                        "same held-out folds and on them renamed"
                  + ("" if judged >= 1.0 else f" (the first {judged:.0%} of each fold's "
                     "requests, scaled to the split's figure)"))
    for col in ("policy", "pins and slots", "slots", *(marked(f"{what} ms/step", estimated,
                                                              stall=True)
                                                       for what in ("stall", "renamed"))):
        table.add_column(col, justify="left" if col == "policy" else "right")
    for r in rows:
        renamed = r["held_out_unlike_stall_ms_per_step"]
        table.add_row(("* " if r["chosen"] else "  ") + r["policy"], r.get("plan", "split"),
                      "pooled" if r["pooled"] else "per layer",
                      f"{r['held_out_stall_ms_per_step']:.4f}",
                      "-" if renamed is None else f"{renamed:.4f}",
                      style="bold" if r["chosen"] else None)
    print_table(table, console)
    found = cache.get("guard")
    if found and found["switched"]:
        print_guard(found, cache, rows, console)


def print_guard(found: dict, cache: dict, rows: list[dict], console: Console) -> None:
    """One line: the guard changed the choice (solvers/cache/choice.py), the tests that fired
    (its `fired`, the first's reason `why`), and what serves instead."""
    was, (low, high) = found["instead_of"], found["renamed_ratio_ci95"]
    now = guard_served(found, cache)
    served_low, served_high = found["served_renamed_ratio_ci95"]
    fired = found.get("fired") or [None]
    why = (f"{found['renamed_ratio']:.3f}x [{low:.3f}, {high:.3f}] the better engine cache "
           f"({found['engine']} per layer, nothing pinned) on the renamed folds (traffic "
           "unlike the calibration)")
    if fired[0] == "above":
        why = f"stalls {why}, above it beyond the interval"
    elif fired[0] == "small_gain":
        why = (f"stalls {found['objective_ratio']:.3f}x the engines on its own folds, "
               f"{found['why']} (and {why})")
    else:  # loose_interval
        why = f"stalls {why}: {found['why']}"
    also = (f" (the guard's {', '.join(fired[1:])} test{'s' if len(fired) > 2 else ''} "
            "fired too)") if fired[1:] else ""
    console.print(
        f"guard: {was[1]}{' pooled' if was[2] else ''} on the {was[0]}'s pins and slots "
        f"{why}{also}; {now[1]}{' pooled' if now[2] else ''} on the "
        f"{now[0] or rows_plan(rows)}'s pins and slots serves instead "
        f"({found['served_renamed_ratio']:.3f}x [{served_low:.3f}, {served_high:.3f}] there)")


def guard_served(found: dict, cache: dict) -> list:
    """[plan, policy, pooled]: the row the guard chose. A plan from before the guard named it
    served what its cache serves (plan None: the chosen policy row's); where prefetch is on
    the cache serves lru in its place (placer.plan.prefetch.served: its note says so)."""
    return found.get("served") or [None, cache["policy"], cache.get("pooled")]


def rows_plan(rows: list[dict]) -> str:
    """Whose pins and slots the chosen policy row serves."""
    return next(r.get("plan", "split") for r in rows if r["chosen"])


def prediction_table(rows: list[dict], title: str, estimated: Sequence[dict]) -> Table:
    """Per (profile, concurrency), one row per line (placement, layer offload, uniform):
    stall with the half-width of its 95% interval, tokens/s (and where the base step is an
    estimate, its step range), hit rate; the placement's row gives its paired ratio to layer
    offload with its interval. `estimated` (the spec's, as --json has it) marks the stall
    and tok/s columns that rest on an estimate."""
    table = Table(title=title)
    lines = (("placement", "placement"), ("layer", "layer offload"), ("uniform", "uniform"))
    steps = any(STEP_RANGE in r[key] for r in rows for key, _ in lines)
    for col in ("line", marked("stall ms/step", estimated, stall=True),
                marked("tok/s", estimated), *([STEP_COLUMN] if steps else []), "hit rate",
                "stall / layer offload"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(bold(f"{r['profile']} B={r['concurrency']}"), end_section=True)
        for i, (key, name) in enumerate(lines):
            f = r[key]
            table.add_row(name, plus_minus(f, "stall_ms_per_step"), f"{f['tokens_per_s']:.2f}",
                          *([step_cell(f)] if steps else []),
                          f"{f['hit_rate']:.3f}",
                          f"{r['ratio_to_layer']:.3f}x {span(r['ratio_to_layer_ci95'])}"
                          if key == "placement" else "", end_section=i == 2)
    return table
