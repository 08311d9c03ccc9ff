"""What a llama.cpp plan and a llama.cpp bench print: the options side by side with their
intervals, where the cache loses, the choice; the summary `placer solve --engine llamacpp`
ends with; the measured and predicted tokens/s of `placer bench --engine llamacpp`."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from rich.table import Table

from placer.plan.estimates import STEP_RANGE, estimated_json
from placer.report.figures import capped, columns, label, plus_minus, print_table, span, wrapped
from placer.report.figures import console as rich_console
from placer.report.marks import (
    MARK,
    STEP_COLUMN,
    closing,
    marked,
    step_cell,
    step_text,
    table_marks,
)

if TYPE_CHECKING:
    from placer.plan.placement import Plan


def llamacpp_summary(plan: Plan, out: Path, full: Path | None, notes: Sequence[str] = ()
                     ) -> list[str]:
    """A llama.cpp plan in a few lines: the build and the choice, its predicted tokens/s and
    stall against -ncmoe N at the same VRAM per profile and concurrency, where the cache
    loses, the command, where the full tables are."""
    from solvers.llamacpp.builds import build_from_json

    engine = plan.engine
    judged = "held out" if engine["folds"] else "in sample (too few sequences for folds)"
    build = build_from_json(engine.get("llamacpp_build") or {}).label
    lines = [f"plan written to {out}", f"for {build}, judged {judged}"]
    lines += wrapped(f"choice: {engine['choice']}")
    ncmoe = next((o for o in engine["options"] if o["name"] == "ncmoe"), None)
    against = "-ncmoe" if ncmoe is None else _layers(ncmoe)
    estimated = estimated_json(plan.hardware)
    lines.append(f"predicted decode: the choice's stall / {against}'s (95% interval)"
                 + (f", tok/s {MARK} (below)" if estimated else ""))
    lines += capped(columns([(label(r["profile"]), f"B={r['concurrency']}",
                              f"{fig['ratio_to_ncmoe']:.3f}x {span(fig['ratio_to_ncmoe_ci95'])}",
                              f"{fig['tokens_per_s']:.2f} tok/s", step_text(fig, fmt="{:.1f}"))
                             for r in plan.predicted for fig in [r["options"]["chosen"]]]))
    losses = [f"{r['profile']} B={r['concurrency']}" for r in plan.predicted
              if any(note.startswith(f"{r['profile']} B={r['concurrency']}:")
                     for note in cache_losses(plan))]
    if losses:
        lines += wrapped(f"the cache loses at {', '.join(losses)} (why: the full tables)")
    lines.append(f"the command: placer export llamacpp {out}")
    return lines + closing(plan, full, notes)


def print_llamacpp(plan: Plan, out: Path) -> None:
    """The llama.cpp options side by side, per traffic and concurrency, with 95% intervals;
    where the cache loses; the choice."""
    console = rich_console()
    engine = plan.engine
    judged = ("on held-out folds of the calibration sequences" if engine["folds"]
              else "in sample (too few sequences for folds)")
    build = engine.get("llamacpp_build") or {}
    from solvers.llamacpp.builds import build_from_json
    console.print(f"{build_from_json(build).label}: choice judged {judged}: "
                  f"{engine['choice']}")
    options = {o["name"]: o for o in engine["options"]}
    pick = engine.get("tuner_pick")
    estimated = estimated_json(plan.hardware)
    for row in plan.predicted:
        table = Table(title=f"{row['profile']} B={row['concurrency']}: predicted decode "
                            "(± 95% bootstrap interval over sequences)")
        steps = any(STEP_RANGE in fig for fig in row["options"].values())
        for col in ("option", "host layers", "cache MiB", "slots", "cpu share",
                    "host experts", marked("tok/s", estimated), *([STEP_COLUMN] if steps else []),
                    marked("stall ms/step", estimated, stall=True), "vs -ncmoe"):
            table.add_column(col, justify="right", ratio=2 if col == "host layers" else None)
        for name, fig in row["options"].items():
            o = options[name]
            if o.get("tuner") and name != pick:
                continue
            low, high = fig["tokens_per_s_ci95"] or (None, None)
            tok = (f"{fig['tokens_per_s']:.2f}" if low is None
                   else f"{fig['tokens_per_s']:.2f} [{low:.2f}, {high:.2f}]")
            shown = f"{name} (the tuner's pick)" if name == pick else name
            table.add_row(shown, _layers(o), str(o["moe_cache_mib"]),
                          ",".join(map(str, o["slots"])) or "-",
                          f"{o.get('cpu_share', 0.0):g}",
                          "pinned" if o.get("pinned", True) else "mmap'd", tok,
                          *([step_cell(fig)] if steps else []),
                          plus_minus(fig, "stall_ms_per_step"),
                          f"{fig['ratio_to_ncmoe']:.3f}x {span(fig['ratio_to_ncmoe_ci95'])}")
        print_table(table, console)
    for line in table_marks(estimated):
        console.print(line, highlight=False)
    grid = [o["name"] for o in engine["options"] if o.get("tuner")]
    if grid:
        console.print(f"upstream's tuner (scripts/moe-cache-tune.py: -cmoe, its sizes x CPU "
                      f"shares) picks from {len(grid)} options; the table shows the one "
                      f"placer's replay ranks first; any of them: placer export llamacpp "
                      f"{out} --option NAME")
    for note in cache_losses(plan):
        console.print(f"note: {note}")
    console.print(f"plan written to {out}; placer export llamacpp {out} prints the command")


def _layers(option: dict) -> str:
    if not option["host_layers"]:
        return "none"
    if option["n_cpu_moe"] is not None:
        return f"-ncmoe {option['n_cpu_moe']}"
    return f"{len(option['host_layers'])}: {layer_runs(option['host_layers'])}"


def layer_runs(layers: Sequence[int]) -> str:
    """Ascending layer numbers with each run of consecutive ones as FIRST-LAST:
    [8, 10, 11, 12, 13] -> "8, 10-13" (a table cell that wraps between runs)."""
    runs: list[list[int]] = []
    for layer in layers:
        if runs and layer == runs[-1][-1] + 1:
            runs[-1].append(layer)
        else:
            runs.append([layer])
    return ", ".join(f"{r[0]}" if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)


def cache_losses(plan: Plan) -> list[str]:
    """Where every cached option is slower than the best one without a cache, and why: too
    few slots for a step at that concurrency (llama.cpp then leaves the cache unused), or
    the misses' uploads over the link."""
    from solvers.llamacpp.lru import MAX_BATCH

    notes = []
    options = {o["name"]: o for o in plan.engine["options"]}
    cached = {name for name, o in options.items() if o["moe_cache_mib"]}
    need_of = min(int(plan.model["top_k"]), plan.experts_per_layer)
    for row in plan.predicted:
        figs, b = row["options"], row["concurrency"]
        plain = max(v["tokens_per_s"] for k, v in figs.items() if k not in cached)
        mine = [k for k in figs if k in cached and not options[k].get("tuner")]
        if not mine or max(figs[k]["tokens_per_s"] for k in mine) >= plain:
            continue
        best = max(mine, key=lambda k: figs[k]["tokens_per_s"])
        slots = min(options[best]["slots"])
        need = min(b * need_of, plan.experts_per_layer)
        why = (f"its {slots} slots are fewer than the {need} experts a step of {b} needs per "
               f"layer, so llama.cpp leaves the cache unused at B={b}"
               if slots < need or b > MAX_BATCH
               else f"it serves {100 * figs[best]['hit_rate']:.0f}% of the selected bytes from "
                    f"VRAM and every miss crosses the link ({len(options[best]['host_layers'])}"
                    f" host layers share {len(options[best]['slots'])} LRU)")
        notes.append(f"{row['profile']} B={b}: the cache loses: its best option "
                     f"({best}, {options[best]['moe_cache_mib']} MiB) "
                     f"{figs[best]['tokens_per_s']:.2f} tok/s against {plain:.2f} without it: "
                     f"{why}")
    return notes


def print_llamacpp_bench(report: dict) -> None:
    """Two rows per option: measured and predicted decode tokens/s with their 95% intervals
    and ratios to the first option; then the cache's logged and replayed counts."""
    console = rich_console()
    device = report["device"]["label"] if report.get("device") else "the --server's device"
    table = Table(title=f"llama.cpp {report['build']} ({report['driver']}) on {device}: "
                        f"{report['num_prompts']} prompts x {report['trials']} trials, "
                        f"up to {report['max_new_tokens']} new tokens (95% intervals; "
                        "ratios to the first option)")
    step = "predicted_tokens_per_s_step"
    steps = any(step in r for r in report["options"])
    for col in ("option", "", "decode tok/s", *([STEP_COLUMN] if steps else []), "/ first",
                "pred / meas"):
        table.add_column(col, justify="left" if col == "option" else "right")
    for r in report["options"]:
        name = r["option"] + (f" (= {', '.join(r['same_as'])})" if r["same_as"] else "")
        table.add_row(name, "measured", figure(r, "measured_tokens_per_s"),
                      *([""] if steps else []), figure(r, "measured_ratio_to_first", "{:.3f}"),
                      "-" if r["predicted_over_measured"] is None
                      else f"{r['predicted_over_measured']:.3f}")
        table.add_row("", marked("predicted", report["estimated"]),
                      figure(r, "predicted_tokens_per_s"),
                      *([step_cell(r, step)] if steps else []),
                      figure(r, "predicted_ratio_to_first", "{:.3f}"), "", end_section=True)
    print_table(table, console)
    for line in table_marks(report["estimated"]):
        console.print(line, highlight=False)
    for r in report["options"]:
        console.print(f"{r['option']}: {r['flags']}", highlight=False)
        c = r["cache"]
        if c is not None:
            logged = "; ".join(f"{k}: {v[0]} hits, {v[1]} misses" for k, v in c["logged"].items())
            replayed = "; ".join(f"{k}: {v[0]} hits, {v[1]} misses"
                                 for k, v in c["replayed"].items())
            console.print(f"  cache logged   {logged or 'nothing'} (slots {c['slots_logged']})\n"
                          f"  cache replayed {replayed or 'nothing'} (slots "
                          f"{c['slots_replayed']}): "
                          + ("equal" if c["agrees"] else "DIFFERENT"), highlight=False)
    console.print(f"cache policy assumed: {report['cache_policy_assumed']}", highlight=False)
    for note in report["notes"]:
        console.print(f"note: {note}", highlight=False)
    cal = report.get("calibration")
    if cal:
        console.print(f"calibrated on {', '.join(cal['options'])}: {cal['fitted']}; spec "
                      f"written to {cal['spec_out']}", highlight=False)


def figure(row: dict, key: str, fmt: str = "{:.2f}") -> str:
    return f"{fmt.format(row[key])} {span(row[f'{key}_ci95'], fmt)}"

