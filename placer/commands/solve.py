"""`placer solve`: which expert pages stay resident on each card."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from placer.checkpoint.config import DTYPE_HELP
from placer.commands.common import command, parse_list, print_json
from placer.errors import PlacerError
from placer.files import check_target, write_json_atomic
from placer.hardware.spec import load_spec
from placer.plan.options import CACHE_POLICIES, EXECUTIONS, SOLVERS, SolveOptions
from placer.progress import StageSpinner
from placer.report.llamacpp import print_llamacpp  # noqa: F401 - placer.commands.pipeline's
from placer.report.solve import print_plan  # noqa: F401 - placer.commands.pipeline's
from placer.report.solve_summary import report_solve
from placer.units import parse_bytes


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
        expert_dtype: Annotated[str | None, typer.Option(
            help=f"With --config: expert dtype ({DTYPE_HELP}; default: the "
                 "config's quantization method, else its torch_dtype, else bf16).")] = None,
        dense_dtype: Annotated[str | None, typer.Option(
            help=f"With --config: dense dtype ({DTYPE_HELP}; default: the "
                 "config's torch_dtype, else bf16).")] = None,
        traces: Annotated[list[Path] | None, typer.Option(
            help="Trace directory to learn from (repeat for several profiles).")] = None,
        solver: Annotated[str, typer.Option(help=f"One of {', '.join(SOLVERS)}.")] = "ilp",
        budget: Annotated[str | None, typer.Option(
            help="VRAM per card for expert pages and the staging buffer, e.g. 20GiB.")] = None,
        offload: Annotated[float | None, typer.Option(
            help="Share of each card's expert bytes that stays on the host, e.g. 0.3.")
        ] = None,
        concurrency: Annotated[str, typer.Option(
            help="Concurrent sequences to optimize for, e.g. 1,8.")] = "1",
        weights: Annotated[str | None, typer.Option(
            help="Weight of each concurrency in the objective, e.g. 0.5,0.5.")] = None,
        ep: Annotated[str, typer.Option(
            help="Expert-parallel homes: contiguous (vLLM/SGLang default) or balanced.")
        ] = "contiguous",
        page_size: Annotated[str | None, typer.Option(
            help="Cut experts into pages of this size (default: one page per expert).")
        ] = None,
        robust: Annotated[bool, typer.Option(
            help="Hold up on traffic the plan was not solved on: minimize the mean regret "
                 "(stall over that traffic's own best) across the --traces sets and "
                 "--concurrency values, never worse than layer offload on any of them; a "
                 "cache split also counts each set's held-out folds with their experts "
                 "renamed (traffic unlike the calibration, e.g. another task).")
        ] = False,
        time_limit: Annotated[float, typer.Option(help="ILP time limit in seconds.")] = 60.0,
        seed: Annotated[int, typer.Option(help="Seed for step sampling and solvers.")] = 0,
        steps: Annotated[int | None, typer.Option(
            help="Sample this many decode steps per profile and concurrency instead of "
                 "using every calibration token (imported counts are always sampled: 256 "
                 "by default).")] = None,
        cache: Annotated[str, typer.Option(
            help="Cache slots per card for staged experts, beside the pinned ones: auto "
                 "(split each card's budget between pins and per-layer slots, judged on "
                 "held-out folds of the calibration sequences), N (N slots per card, the "
                 "rest pinned) or 0 (a static placement by --solver).")] = "auto",
        cache_policy: Annotated[str, typer.Option(
            help=f"Which staged expert a full cache evicts: auto | {' | '.join(CACHE_POLICIES)}"
                 ". auto: each policy, per layer and pooled, serves the chosen split (and "
                 "the plain cache) on its held-out folds, and the least stall serves unless "
                 "(a guard) it stalls more than the better of plain lru and lfuda on the same "
                 "folds with experts renamed, beyond their interval, or, not being one of "
                 "them, it is under 5% below them on its own folds or the renamed folds "
                 "leave room for a loss over 5%: that engine serves "
                 "then. learned: a linear score whose "
                 "weights are fitted on the calibration folds and stored in the plan. lfru: "
                 "fewest hits since admission over accesses since the last one (vLLM PR "
                 "#37190); lru: least recently used (llama.cpp PR #27861); lfuda: BigRig "
                 "0.9.1's; classlru: llama.cpp b12170's.")
        ] = "auto",
        execution: Annotated[str, typer.Option(
            help=f"How a cold expert runs: {' | '.join(EXECUTIONS)}. stage: its cold bytes "
                 "are copied to its GPU, which computes it (placer's runtime); cpu: the host "
                 "CPU computes it from host RAM (llama.cpp -ot / --n-cpu-moe, KTransformers; "
                 "needs the spec's \\[host] table).")] = "stage",
        engine: Annotated[str, typer.Option(
            help="Whose runtime the plan is for: placer (pinned experts, staging and "
                 "placer's cache) or llamacpp (which MoE layers llama.cpp keeps in host "
                 "memory, -ot / -ncmoe, and how big its --moe-cache-mib cache is; several "
                 "cards by -ts; needs the spec's \\[host] table; docs/llamacpp.md).")] = "placer",
        llamacpp_version: Annotated[str | None, typer.Option(
            help="With --engine llamacpp: the llama.cpp build to plan for (bNNNNN, vX.Y.Z or "
                 "the first line of `llama-server --version`): its cache policy and flags "
                 "(default: the newest policy known, said in the output).")] = None,
        json_out: Annotated[bool, typer.Option("--json", help="Print the plan as JSON.")
                            ] = False,
        verbose: Annotated[bool, typer.Option(
            "--verbose", help="Print the full tables (always written beside --out: "
                              "plan.json -> plan.txt), not the summary.")] = False,
    ) -> None:
        """Solve which experts stay pinned on each GPU and how many cache slots each layer
        keeps for staged ones, within a VRAM budget, from routing traces; the rest stay in
        pinned host memory and are staged when selected."""
        from placer.checkpoint.estimate import estimate_inventory
        from placer.checkpoint.inventory import read_inventory
        from placer.plan.solve import solve_plan
        from traces.storing.stats import dropped_prefill

        if (model is None) == (config is None):
            raise PlacerError("give --model CHECKPOINT_DIR (or MODEL.gguf) or --config config.json "
                              "(not both)")
        inputs = [("the checkpoint", model), ("the config", config),
                  ("the hardware spec", Path(hardware) if os.path.isfile(hardware) else None)]
        check_target(out, inputs)
        inv = (read_inventory(model) if model is not None
               else estimate_inventory(config, expert_dtype, dense_dtype))
        opts = SolveOptions(
            solver=solver, budget=parse_bytes(budget, "--budget") if budget is not None else None,
            offload=offload, concurrency=tuple(parse_list(concurrency, int, "--concurrency")),
            weights=tuple(parse_list(weights, float, "--weights"))
            if weights is not None else None,
            ep=ep, page_size=parse_bytes(page_size, "--page-size")
            if page_size is not None else None,
            robust=robust, time_limit=time_limit, seed=seed, num_steps=steps,
            execution=execution, cache=parse_cache(cache), cache_policy=cache_policy)
        if engine not in ENGINES:
            raise PlacerError(f"--engine must be one of {', '.join(ENGINES)}, not {engine!r}")
        if llamacpp_version is not None and engine != "llamacpp":
            raise PlacerError("--llamacpp-version is for --engine llamacpp")
        spec = load_spec(hardware)
        if engine == "llamacpp":
            from placer.plan.llamacpp import solve_llamacpp
            from solvers.errors import SolverError
            from solvers.llamacpp.builds import parse_build
            try:
                build = parse_build(llamacpp_version)
            except SolverError as exc:
                raise PlacerError(str(exc)) from None
            gguf = str(model) if model is not None and model.suffix.lower() == ".gguf" else None
            plan = solve_llamacpp(inv, spec, list(traces or []), opts, build, gguf)
        else:
            with StageSpinner("solve:", opts.time_limit if opts.solver == "ilp" or robust
                              else None, enabled=not json_out and sys.stderr.isatty()) as spinner:
                plan = solve_plan(inv, spec, list(traces or []), opts, spinner.stage)
        write_json_atomic(plan.to_json(), out, inputs)
        notes = [] if plan.engine is not None else [
            note for trace_dir in traces or [] if (note := dropped_prefill(trace_dir))]
        report_solve(plan, out, notes, verbose=verbose, quiet=json_out, inputs=inputs)
        if json_out:
            print_json(plan.to_json())


ENGINES = ("placer", "llamacpp")


def parse_cache(value: str) -> int | None:
    """--cache: auto (None) or a slot count."""
    if value.strip().lower() == "auto":
        return None
    try:
        return int(value)
    except ValueError:
        raise PlacerError(f"--cache: expected auto or a number of slots per card, not "
                          f"{value!r}") from None
