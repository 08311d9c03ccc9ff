"""`placer solve`: which expert pages stay resident on each card."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from placer.commands import solve_options as so
from placer.commands.common import command, print_json
from placer.errors import PlacerError
from placer.files import check_outputs, write_json_atomic
from placer.hardware.context import with_context
from placer.hardware.spec import load_spec
from placer.progress import StageSpinner
from placer.report.figures import to_be_beside
from placer.report.solve_summary import report_solve


def register(app: typer.Typer) -> None:
    @command(app, "solve")
    def solve(
        hardware: Annotated[str, typer.Option(
            help="Hardware spec: a preset name (placer hardware list) or a .toml file.")],
        out: Annotated[Path, typer.Option(help="Where to write the plan (plan.json).")],
        model: Annotated[Path | None, typer.Option(
            help="Checkpoint directory, or a GGUF model file (reads its headers only).")
        ] = None,
        config: Annotated[Path | None, typer.Option(
            help="Plan from a config.json alone, before downloading the weights.")] = None,
        expert_dtype: so.ExpertDtype = None,
        dense_dtype: so.DenseDtype = None,
        traces: Annotated[list[Path] | None, typer.Option(
            help="Trace directory to learn from (repeat for several profiles).")] = None,
        solver: so.Solver = "ilp",
        budget: so.Budget = None,
        offload: so.Offload = None,
        concurrency: so.Concurrency = "1",
        weights: so.Weights = None,
        ep: so.Ep = "contiguous",
        page_size: so.PageSize = None,
        robust: so.Robust = False,
        time_limit: so.TimeLimit = 60.0,
        seed: Annotated[int, typer.Option(help="Seed for step sampling and solvers.")] = 0,
        steps: so.Steps = None,
        cache: so.Cache = "auto",
        cache_policy: so.CachePolicy = "auto",
        execution: so.Execution = "stage",
        engine: so.Engine = "placer",
        llamacpp_version: so.LlamacppVersion = None,
        ctx: so.Ctx = None,
        kv_type: so.KvType = None,
        json_out: Annotated[bool, typer.Option("--json", help="Print the plan as JSON.")
                            ] = False,
        verbose: Annotated[bool, typer.Option(
            "--verbose", help="Print the full tables (always written beside --out: "
                              "plan.json -> plan.txt), not the summary.")] = False,
    ) -> None:
        """Solve which experts stay pinned on each GPU and how many cache slots each layer
        keeps for staged ones, within a VRAM budget, from routing traces; the rest stay in
        pinned host memory and are staged when selected."""
        from placer.checkpoint.source import model_inventory
        from placer.plan import engine as dispatch
        from placer.plan.estimates import estimated_json
        from placer.plan.traffic import sample_notes
        from traces.storing.stats import dropped_prefill

        if (model is None) == (config is None):
            raise PlacerError("give --model CHECKPOINT_DIR (or MODEL.gguf) or --config config.json "
                              "(not both)")
        inputs = [("the checkpoint", model), ("the config", config),
                  ("the hardware spec", Path(hardware) if os.path.isfile(hardware) else None),
                  *(("the traces", t) for t in traces or [])]
        check_outputs([("--out", out), ("the tables beside --out", to_be_beside(out))], inputs)
        opts = so.solve_options(
            solver=solver, budget=budget, offload=offload, concurrency=concurrency,
            weights=weights, ep=ep, page_size=page_size, robust=robust, time_limit=time_limit,
            seed=seed, steps=steps, cache=cache, cache_policy=cache_policy, execution=execution)
        target = dispatch.target_of(engine, llamacpp_version, model)
        inv = model_inventory(model, config, expert_dtype, dense_dtype)
        spec, ctx_note = with_context(load_spec(hardware), inv.config, ctx, kv_type)
        with StageSpinner("solve:", opts.time_limit if opts.solver == "ilp" or robust
                          else None, enabled=not json_out and sys.stderr.isatty()) as spinner:
            plan = dispatch.solve(inv, spec, list(traces or []), opts, target, spinner.stage)
        write_json_atomic(plan.to_json(), out, inputs)
        if ctx_note and not json_out:
            typer.echo(ctx_note)
        notes = [] if plan.engine is not None else [
            note for trace_dir in traces or [] if (note := dropped_prefill(trace_dir))
        ] + sample_notes(plan.calibration)
        report_solve(plan, out, notes, verbose=verbose, quiet=json_out, inputs=inputs)
        if json_out:  # the plan, and what its predictions rest on (as every --json says it)
            print_json({**plan.to_json(), "estimated": estimated_json(plan.hardware)})
