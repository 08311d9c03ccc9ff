"""`placer evaluate`: what a placement costs on held-out traffic, before deployment."""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from placer.commands.common import (
    bytes_plus_minus,
    command,
    parse_list,
    plus_minus,
    print_json,
    print_table,
    span,
)
from placer.commands.common import console as rich_console
from placer.errors import PlacerError
from placer.files import check_target


def register(app: typer.Typer) -> None:
    @command(app, "evaluate")
    def evaluate_cmd(
        plan_path: Annotated[Path, typer.Argument(
            metavar="PLAN_OR_MANIFEST", help="plan.json, manifest.json or a placed directory.")],
        traces: Annotated[list[Path] | None, typer.Option(
            help="Trace directory to replay (repeat for several traffic sets).")] = None,
        concurrency: Annotated[str | None, typer.Option(
            help="Concurrent sequences, e.g. 1,8 (default: the plan's).")] = None,
        steps: Annotated[int | None, typer.Option(
            help="Sample this many decode steps per trace set and concurrency instead of "
                 "replaying every held-out token (the default; imported count matrices have "
                 "no tokens and are always sampled).")] = None,
        seed: Annotated[int | None, typer.Option(
            help="Seed of the batching orders, samples and bootstrap (default: the plan's).")
                        ] = None,
        oracle_time_limit: Annotated[float, typer.Option(
            help="Seconds for the oracle ILP on each traffic set and concurrency.")] = 10.0,
        curve: Annotated[bool, typer.Option(
            help="Also show held-out figures against the amount of calibration traffic.")
        ] = False,
        folds: Annotated[int, typer.Option(help="Folds over sequences for --curve (>= 2).")
                         ] = 4,
        plot: Annotated[Path | None, typer.Option(help="Write a PNG of per-layer staging "
                                                       "and drift heatmaps (a .png path).")
                        ] = None,
        cache_slots: Annotated[int | None, typer.Option(
            help="Replay the placement with N cache slots per card instead of the plan's "
                 "own (what `placer run --cache-slots N` runs).")] = None,
        execution: Annotated[str | None, typer.Option(
            help="How a cold expert runs: stage (copied to its GPU: placer's runtime), cpu "
                 "(computed by the host CPU: llama.cpp -ot / --n-cpu-moe, KTransformers; needs "
                 "the spec's \\[host]) or both, side by side (default: the plan's).")] = None,
        llamacpp_version: Annotated[str | None, typer.Option(
            help="For a plan solved with --engine llamacpp: replay the cache of this llama.cpp "
                 "build (bNNNNN, vX.Y.Z or the first line of `llama-server --version`) instead "
                 "of the plan's.")] = None,
        json_out: Annotated[bool, typer.Option("--json", help=(
            "Print the report as JSON: every figure has its 95% bootstrap interval as "
            "<figure>_ci95 (low, high; null over fewer than 5 held-out sequences), except "
            "oracle_gap, the oracle ILP's relative MIP gap (a solver figure, not a statistical "
            "estimate)."))] = False,
    ) -> None:
        """Replay held-out traffic against a placement as deployed (pinned pages and its cache
        of staged experts) and, at the same VRAM budget, layer offload, uniform, the static
        oracle (the best pinned set for this very traffic, no cache), lru and lfuda (the
        whole budget as per-layer LRU or LFUDA caches, nothing pinned: llama.cpp PR
        #27861's and BigRig 0.9.1's engine caches) and belady (the plan's pinned set and slots under
        Belady's offline-optimal replacement: the limit of any cache policy for that split);
        warn where the placement is predicted worse than layer offload or than lru.

        Every held-out token is replayed in order (at B > 1 in steps of B distinct
        sequences, continuous batching over 4 seeded orders); each figure has a 95%
        bootstrap interval over sequences, and the verdict against layer offload (better,
        worse or within noise) reads the interval of the stall ratio; fewer than 5 held-out
        sequences give no interval and the verdict too little traffic.

        A plan solved with --engine llamacpp is replayed as llama.cpp runs it (its host
        layers on the CPU or through its --moe-cache-mib cache): layer offload is then
        -ncmoe N alone at the same VRAM, and "no cache" its host layers without the cache."""
        from placer.plan.engine import for_build
        from placer.plan.placement import read_plan
        from placer.predict.curve import calibration_curve
        from placer.predict.evaluate import EvalOptions, evaluate
        from placer.predict.plots import plot_evaluation

        if plot is not None and plot.suffix.lower() != ".png":
            raise PlacerError(f"--plot writes a PNG: give a path ending in .png, not {plot}")
        if plot is not None:
            check_target(plot, what="--plot")
        plan = read_plan(plan_path)
        if llamacpp_version is not None:
            plan = for_build(plan, llamacpp_version)
        trace_dirs = list(traces or [])
        opts = EvalOptions(
            concurrency=tuple(parse_list(concurrency, int, "--concurrency"))
            if concurrency is not None else None, num_steps=steps, seed=seed,
            oracle_time_limit=oracle_time_limit, cache_slots=cache_slots, execution=execution)
        report = evaluate(plan, trace_dirs, opts,
                          progress=not json_out and sys.stderr.isatty())
        if curve:
            report["curve"] = calibration_curve(plan, folds=folds, seed=seed, num_steps=steps)
        if plot:
            report["plot"] = str(plot_evaluation(plan, report, trace_dirs, plot))
        if json_out:
            print_json({k: v for k, v in report.items() if k != "per_layer"})
        else:
            print_report(report)


def print_report(report: dict) -> None:
    """Every row reads: placement X, layer offload Y, uniform U, oracle Z, each figure with
    the half-width of its 95% interval; then each row's ratios and verdict."""
    console = rich_console()
    how = ("every held-out token (B>1: continuous batching, "
           f"{report['groupings']} orders)" if report["steps"] is None else report["replay"])
    table = Table(title=f"predicted on {how}, seed {report['seed']}; ± 95% bootstrap "
                        f"interval ({report['replicates']} replicates)")
    for col in ("line", "hit rate", "cold bytes/token", "cold experts/token", "stall ms/step",
                "tok/s"):
        table.add_column(col, justify="right")
    for r in report["results"]:
        table.add_row(f"[bold]{r['traces']}[/bold] B={r['concurrency']} {r['execution']}",
                      end_section=True)
        lines = [line for line in LINE_NAMES if line in r]
        for i, line in enumerate(lines):
            f = r[line]
            table.add_row(line_name(r, line), plus_minus(f, "hit_rate", "{:.3f}"),
                          bytes_plus_minus(f, "staged_bytes_per_token"),
                          plus_minus(f, "transfers_per_token", "{:.2f}"),
                          plus_minus(f, "stall_ms_per_step", "{:.4f}"),
                          plus_minus(f, "tokens_per_s", "{:.2f}"), end_section=i == len(lines) - 1)
    print_table(table, console)
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
                    "stall ms/step"):
            curve.add_column(col, justify="right")
        for row in report["curve"]:
            curve.add_row(row["line"], "" if row["fraction"] is None else f"{row['fraction']:g}",
                          f"{row['tokens']:.0f}" if "tokens" in row else "",
                          plus_minus(row, "hit_rate", "{:.3f}"),
                          plus_minus(row, "stall_ms_per_step", "{:.4f}"))
        print_table(curve, console)
    for v in report["verdicts"]:
        console.print(v["message"], style="bold red" if not v["ok"] and "WARNING" in v[
            "message"] else {"better": "green"}.get(v["verdict"], "yellow"))
    if "plot" in report:
        console.print(f"plot written to {report['plot']}")


LINE_NAMES = {"placement": "placement", "layer": "layer offload", "uniform": "uniform",
              "oracle": "static oracle", "lru": "lru", "lfuda": "lfuda", "belady": "belady",
              "nocache": "no cache"}  # nocache: a llama.cpp plan's host layers, no cache


def ratio_text(row: dict, line: str) -> str:
    """The placement's stall over `line`'s, "1.234 [1.1, 1.3]"; where `line` never stalls
    (the ratio is infinite, JSON's null) it says so instead of "inf"."""
    ratio, ci = row[f"ratio_to_{line}"], row[f"ratio_to_{line}_ci95"]
    if ratio is None or not math.isfinite(ratio):
        return (f"n/a ({LINE_NAMES[line]} stalls 0 ms/step; the placement "
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
