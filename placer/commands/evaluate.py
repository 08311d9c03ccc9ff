"""`placer evaluate`: what a placement costs on held-out traffic, before deployment."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from placer.commands import solve_options as so
from placer.commands.common import command, parse_list, print_json
from placer.errors import PlacerError
from placer.files import check_outputs
from placer.report.evaluate import report_evaluate
from placer.report.figures import to_be_beside


def register(app: typer.Typer) -> None:
    @command(app, "evaluate")
    def evaluate_cmd(
        plan_path: Annotated[Path | None, typer.Argument(
            metavar="[PLAN_OR_MANIFEST]", help="plan.json, manifest.json or a placed directory "
                                               "(with --flags: optional).")] = None,
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
        flags: Annotated[list[str] | None, typer.Option(
            "--flags", help="A llama-server command line to predict (with --model or "
                            "--config and --hardware, or beside a llama.cpp plan's choice; "
                            "repeat to compare several side by side), e.g. '-ngl all "
                            "-ncmoe 20 --moe-cache-mib 4096'. Without --traces: uniform "
                            "routing.")] = None,
        engine: Annotated[str | None, typer.Option(
            help="With --flags: llamacpp (the default: --flags are llama-server's).")] = None,
        model: Annotated[Path | None, typer.Option(
            help="With --flags: the GGUF (or checkpoint) the command line runs.")] = None,
        config: Annotated[Path | None, typer.Option(
            help="With --flags: the model's config.json, instead of --model.")] = None,
        expert_dtype: so.ExpertDtype = None,
        dense_dtype: so.DenseDtype = None,
        hardware: Annotated[str | None, typer.Option(
            help="With --flags: the hardware spec (a preset name or a .toml file).")] = None,
        out: Annotated[Path | None, typer.Option(
            help="Write the report there as JSON (what --json prints), and its full tables "
                 "beside it (report.json -> report.txt).")] = None,
        verbose: Annotated[bool, typer.Option(
            "--verbose", help="Print the full tables, not the summary.")] = False,
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
        -ncmoe N alone at the same VRAM, and "no cache" its host layers without the cache.

        --flags '<llama-server flags>' predicts that command line instead (repeat it to
        compare several), from --model or --config and --hardware, or beside a llama.cpp
        plan's choice; every flag placer does not model is named (docs/llamacpp.md)."""
        from placer.plan.engine import for_build
        from placer.plan.placement import read_plan
        from placer.predict.curve import calibration_curve
        from placer.predict.evaluate import EvalOptions, evaluate
        from placer.predict.plots import plot_evaluation

        if plot is not None and plot.suffix.lower() != ".png":
            raise PlacerError(f"--plot writes a PNG: give a path ending in .png, not {plot}")
        spec = Path(hardware) if hardware and os.path.isfile(hardware) else None
        check_outputs([("--out", out), ("the tables beside --out", to_be_beside(out)),
                       ("--plot", plot)],
                      [("the plan", plan_path), *(("the traces", t) for t in traces or []),
                       ("--model", model), ("--config", config), ("--hardware", spec)])
        trace_dirs = list(traces or [])
        opts = EvalOptions(
            concurrency=tuple(parse_list(concurrency, int, "--concurrency"))
            if concurrency is not None else None, num_steps=steps, seed=seed,
            oracle_time_limit=oracle_time_limit, cache_slots=cache_slots, execution=execution)
        dtypes = (expert_dtype, dense_dtype)
        if flags or plan_path is None or any(x is not None for x in (engine, model, config,
                                                                       hardware, *dtypes)):
            from placer.predict.llamacpp_flags import FlagsRequest, evaluate_flags
            from placer.report.llamacpp_flags import report_flags

            report = evaluate_flags(FlagsRequest(
                list(flags or []), plan_path, engine, llamacpp_version, model, config, hardware,
                trace_dirs, opts, [n for n, given in (("--curve", curve), ("--plot", plot),
                                                      ("--verbose", verbose)) if given],
                dtypes))
            report_flags(report, out, quiet=json_out)
            if json_out:
                print_json(report)
            return
        plan = read_plan(plan_path)
        if llamacpp_version is not None:
            plan = for_build(plan, llamacpp_version)
        report = evaluate(plan, trace_dirs, opts,
                          progress=not json_out and sys.stderr.isatty())
        if curve:
            report["curve"], note = calibration_curve(plan, folds=folds, seed=seed,
                                                      num_steps=steps)
            report["notes"] += [note] if note else []
        if plot:
            report["plot"] = str(plot_evaluation(plan, report, trace_dirs, plot))
        report_evaluate(report, out, verbose=verbose, quiet=json_out)
        if json_out:
            print_json({k: v for k, v in report.items() if k != "per_layer"})
