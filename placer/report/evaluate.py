"""What `placer evaluate` prints: per traffic set and concurrency, the placement beside every
baseline with 95% intervals, the ratios and verdicts, the drift, the calibration curve; and
the summary it (and `placer plan`) ends with: the ratios against layer offload (-ncmoe N for a
llama.cpp plan) and the verdicts."""

from __future__ import annotations

import math
from pathlib import Path

from rich.table import Table

from placer.files import write_json_atomic
from placer.report.figures import (
    MOST_ROWS,
    beside,
    bold,
    bytes_plus_minus,
    capped,
    columns,
    finish,
    label,
    plus_minus,
    print_table,
    span,
    wrapped,
)
from placer.report.figures import console as rich_console
from placer.report.marks import (
    SUMMARY_PROBES,
    marked,
    spec_estimates,
    step_ranges,
    table_marks,
)
from placer.report.prefetch import prefetch_summary, print_prefetch


def report_evaluate(report: dict, out: Path | None = None, *, verbose: bool = False,
                    quiet: bool = False) -> None:
    """With `out`, the report as JSON there and its full tables beside it (evaluate.json,
    evaluate.txt); then the summary on stdout, or with `verbose` the full tables, or with
    `quiet` nothing (--json)."""
    if out is not None:
        write_json_atomic({k: v for k, v in report.items() if k != "per_layer"}, out)
    finish(lambda: print_report(report), lambda full: evaluate_summary(report, full),
           None if out is None else beside(out), verbose=verbose, quiet=quiet)


def evaluate_summary(report: dict, full: Path | None = None) -> list[str]:
    """An evaluation in a few lines: how it was replayed, per traffic set, concurrency and
    execution the stall against layer offload (-ncmoe N for llama.cpp) and against the plain
    cache with their intervals and the verdict, the warnings, where the full tables are."""
    how = report["replay"]
    lines = [f"predicted on {how}, seed {report['seed']}: the placement's stall / each "
             "baseline's (95% interval)"]
    lines += ratio_lines(report["results"])
    for build in dict.fromkeys(r["llamacpp_build"] for r in report["results"]
                               if "llamacpp_build" in r):
        lines.append(f"replayed as {build} runs its cache")
    for v in report["verdicts"]:
        if not v["ok"] or v["verdict"] != "better":
            lines += wrapped(v["message"])
    lines += [line for e in spec_estimates(estimated(report), SUMMARY_PROBES)
              for line in wrapped(f"estimate: {e}")]
    lines += [line for s in report.get("prefetch", []) for line in prefetch_summary(s)]
    notes = report["notes"]
    said = f"{len(notes)} note{'s' if len(notes) != 1 else ''}, drift and the" if notes else \
        "drift and the"
    where = f"{full} (and --verbose)" if full is not None else "--verbose"
    return lines + wrapped(f"{said} full tables: {where}")


def ratio_lines(results: list[dict]) -> list[str]:
    """One aligned line per row: traffic, B, execution, / layer offload (or / -ncmoe),
    verdict, / the plain cache (lru; a llama.cpp plan's / no cache)."""
    names = short_names([r["traces"] for r in results])
    rows = [(names[r["traces"]], str(r["concurrency"]), r["execution"],
             ratio_text(r, "layer", short=True), r["verdict"],
             ratio_text(r, "lru", short=True) if "ratio_to_lru" in r
             else ratio_text(r, "nocache", short=True) if "ratio_to_nocache" in r else "-")
            for r in results]
    llama = [r["execution"] == "llamacpp" for r in results]
    cache = "/ no cache" if all(llama) else "/ lru or no cache" if any(llama) else "/ lru"
    head = [("traffic", "B", "execution", "/ -ncmoe" if all(llama) else "/ layer offload",
             "verdict", cache)]
    lines = capped(columns(head + rows), MOST_ROWS + 1)
    paths = {n: p for p, n in names.items() if n != p}
    return lines + [f"  {n}: {p}" for n, p in list(paths.items())[:3]]


def short_names(paths: list[str]) -> dict[str, str]:
    """Each traffic set's name in a summary row: its path's last part where those differ,
    else the path cut at its start."""
    unique = list(dict.fromkeys(paths))
    last = {p: Path(p).name or p for p in unique}
    if len(set(last.values())) == len(unique):
        return {p: label(n, 16) for p, n in last.items()}
    return {p: label(p, 16) for p in unique}


def print_report(report: dict) -> None:
    """Every row reads: placement X, layer offload Y, uniform U, oracle Z, each figure with
    the half-width of its 95% interval; then each row's ratios and verdict."""
    console = rich_console()
    how = (f"{report['replay']} (B>1: continuous batching, "
           f"{report['groupings']} orders)" if report["steps"] is None else report["replay"])
    by_traces: dict[str, list[dict]] = {}
    for r in report["results"]:
        by_traces.setdefault(r["traces"], []).append(r)
    for traces, rows in by_traces.items():  # the path in the title: row labels stay short
        table = Table(title=f"{traces}: predicted on {how}, seed {report['seed']}; ± 95% "
                            f"bootstrap interval ({report['replicates']} replicates)")
        for col in ("line", "hit rate", "cold bytes/token", "cold experts/token",
                    marked("stall ms/step", estimated(report), stall=True),
                    marked("tok/s", estimated(report))):
            table.add_column(col, justify="right")
        for r in rows:
            table.add_row(bold(f"B={r['concurrency']} {r['execution']}"),
                          end_section=True)
            lines = [line for line in LINE_NAMES if line in r]
            for i, line in enumerate(lines):
                f = r[line]
                table.add_row(line_name(r, line), plus_minus(f, "hit_rate", "{:.3f}"),
                              bytes_plus_minus(f, "staged_bytes_per_token"),
                              plus_minus(f, "transfers_per_token", "{:.2f}"),
                              plus_minus(f, "stall_ms_per_step", "{:.4f}"),
                              plus_minus(f, "tokens_per_s", "{:.2f}"),
                              end_section=i == len(lines) - 1)
        print_table(table, console)
        for r in rows:  # seven columns: no room for an eighth, the step ranges below
            for line in step_ranges(f"B={r['concurrency']} {r['execution']}",
                                    {LINE_NAMES[k]: r[k] for k in LINE_NAMES if k in r}):
                console.print(line, highlight=False)
    for line in table_marks(estimated(report)):
        console.print(line, highlight=False)
    for r in report["results"]:
        others = "".join(f", / {LINE_NAMES[k]} {ratio_text(r, k)}"
                         for k in ("oracle", "lru", "lfuda", "belady", "nocache")
                         if f"ratio_to_{k}" in r)
        console.print(f"{r['traces']} B={r['concurrency']} {r['execution']}: {r['tokens']} "
                      f"tokens in "
                      f"{r['steps']} steps, interval over {r['interval_units']} "
                      f"{r['interval_over']}; stall / layer offload {ratio_text(r, 'layer')} "
                      f"({r['verdict']}){others}")
    for build in dict.fromkeys(r["llamacpp_build"] for r in report["results"]
                               if "llamacpp_build" in r):
        console.print(f"replayed as {build} runs its cache")
    for note in report["notes"]:
        console.print(f"note: {note}")
    for d in report["drift"]:
        console.print(f"drift {d['traces']}: Jensen-Shannon divergence from the calibration "
                      f"profile {_drift(d)}")
    if "curve" in report:
        curve = Table(title="held-out figures vs calibration traffic (k-fold over sequences; "
                            "± 95% interval over folds)")
        for col in ("line", "share of training sequences", "calibration tokens", "hit rate",
                    marked("stall ms/step", estimated(report), stall=True)):
            curve.add_column(col, justify="right")
        for row in report["curve"]:
            curve.add_row(row["line"], "" if row["fraction"] is None else f"{row['fraction']:g}",
                          f"{row['tokens']:.0f}" if "tokens" in row else "",
                          plus_minus(row, "hit_rate", "{:.3f}"),
                          plus_minus(row, "stall_ms_per_step", "{:.4f}"))
        print_table(curve, console)
    print_prefetch(report.get("prefetch", []), console)
    for v in report["verdicts"]:
        console.print(v["message"], style="bold red" if not v["ok"] and "WARNING" in v[
            "message"] else {"better": "green"}.get(v["verdict"], "yellow"))
    if "plot" in report:
        console.print(f"plot written to {report['plot']}")


def estimated(report: dict) -> list[dict]:
    """The spec figures the report's predictions rest on ([] in a report written before
    they were recorded: a `placer plan` stage it resumes)."""
    return report.get("estimated", [])


LINE_NAMES = {"placement": "placement", "layer": "layer offload", "uniform": "uniform",
              "oracle": "static oracle", "lru": "lru", "lfuda": "lfuda", "belady": "belady",
              "nocache": "no cache"}  # nocache: a llama.cpp plan's host layers, no cache


def ratio_text(row: dict, line: str, short: bool = False) -> str:
    """The placement's stall over `line`'s, "1.234 [1.1, 1.3]"; where `line` never stalls
    (the ratio is infinite, JSON's null) it says so instead of "inf" (`short`: "n/a")."""
    ratio, ci = row[f"ratio_to_{line}"], row[f"ratio_to_{line}_ci95"]
    if ratio is None or not math.isfinite(ratio):
        return "n/a" if short else (f"n/a ({LINE_NAMES[line]} stalls 0 ms/step; the placement "
                                    f"{row['placement']['stall_ms_per_step']:.4f})")
    if ci is None:
        return f"{ratio:.3f} {span(None)}"
    bounds = ", ".join(f"{x:.3f}" if math.isfinite(x) else "n/a" if math.isnan(x)
                       else "unbounded" for x in ci)
    return f"{ratio:.3f} [{bounds}]"


def line_name(row: dict, line: str) -> str:
    """A line's name in the table, with its cache where it has one."""
    cache = row.get("cache", {}).get(line)
    if cache is None:
        return LINE_NAMES[line]
    slots = sorted(set(cache["slots"]))
    each = f"{slots[0]}" if len(slots) == 1 else "/".join(map(str, cache["slots"]))
    policy = "" if cache["policy"] == line else f"{cache['policy']}, "
    pooled = ", pooled" if cache.get("pooled") else ""
    return f"{LINE_NAMES[line]} ({policy}{each} slots{pooled})"


def _drift(drift: dict) -> str:
    """The mean JS divergence over layers in bits, "± half-width" of its 95% interval, or
    without one where there is none (imported counts have no sequences; too few
    sequences: the report's note says which)."""
    if drift["js_mean_bits_ci95"] is None:
        return f"{drift['js_mean_bits']:.4f} bits (mean over layers; no interval, see the note)"
    return f"{plus_minus(drift, 'js_mean_bits', '{:.4f}')} bits (mean over layers)"
