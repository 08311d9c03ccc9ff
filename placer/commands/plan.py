"""`placer plan`: collect, split, solve, evaluate and export in one go, resumable
(placer.pipeline)."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import Annotated

import typer

from placer.commands import solve_options as so
from placer.commands.common import command, print_json


def register(app: typer.Typer) -> None:
    @command(app, "plan")
    def plan_command(
        model: Annotated[Path, typer.Option(
            help="Checkpoint directory (config.json, *.safetensors, tokenizer), or a GGUF "
                 "model file (run in llama.cpp itself: `make llama-env`).")],
        corpus: Annotated[list[Path], typer.Option(
            help="Traffic like yours: .txt blocks, .jsonl lines of text, messages or turns "
                 "(mixed freely) or .parquet; repeatable.")],
        hardware: Annotated[str, typer.Option(
            help="Hardware spec: a preset name (placer hardware list) or a .toml file.")],
        out: Annotated[Path, typer.Option(
            help="Directory for every stage's output (traces, split, plan.json, "
                 "evaluate.json, run.sh); a rerun resumes there.")],
        engine: so.Engine = None,
        llamacpp_version: so.LlamacppVersion = None,
        offload: so.Offload = None,
        budget: so.Budget = None,
        concurrency: so.Concurrency = "1,8",
        weights: so.Weights = None,
        fraction: Annotated[float, typer.Option(
            help="Share of the collected sequences to solve on; the rest is held out for "
                 "the evaluation.")] = 0.5,
        seed: Annotated[int, typer.Option(help="Seed of the split, the solver and torch.")
                        ] = 0,
        text_field: Annotated[str, typer.Option(
            help="Text field of .jsonl lines (a line without it is a chat: messages, else "
                 "turns) / column of .parquet corpora.")] = "text",
        mode: Annotated[str, typer.Option(
            help="collect: score (one forward pass per document) or generate (a prompt, "
                 "then greedy decoding).")] = "score",
        max_length: Annotated[int, typer.Option(
            help="collect: truncate each document to this many tokens.")] = 512,
        max_tokens: Annotated[int | None, typer.Option(
            help="collect: stop each corpus after this many recorded tokens.")] = None,
        batch_size: Annotated[int, typer.Option(help="collect: documents per forward pass.")
                              ] = 8,
        device: Annotated[str, typer.Option(
            help="collect: auto (cuda when present), cpu, cuda, cuda:N.")] = "auto",
        tokenizer: Annotated[Path | None, typer.Option(
            help="collect: tokenizer directory (default: the checkpoint's own; for a GGUF, "
                 "llama.cpp's, whose chat template may be missing: give the model's "
                 "tokenizer to template a chat corpus).")] = None,
        solver: so.Solver = "ilp",
        time_limit: so.TimeLimit = 60.0,
        ep: so.Ep = "contiguous",
        page_size: so.PageSize = None,
        robust: so.Robust = False,
        steps: so.Steps = None,
        cache: so.Cache = "auto",
        cache_policy: so.CachePolicy = "auto",
        execution: so.Execution = "stage",
        ctx: so.Ctx = None,
        kv_type: so.KvType = None,
        oracle_time_limit: Annotated[float, typer.Option(
            help="evaluate: seconds for the oracle ILP per concurrency.")] = 10.0,
        json_out: Annotated[bool, typer.Option(
            "--json", help="Print the stages, the held-out report and the command as JSON.")
        ] = False,
        verbose: Annotated[bool, typer.Option(
            "--verbose", help="Print the full tables (always written under --out: plan.txt, "
                              "evaluate.txt) before the summary.")] = False,
    ) -> None:
        """From a checkpoint (or a GGUF) and a corpus to a plan, its held-out evaluation and
        the command that runs it: collect, split, solve, evaluate, export, the functions the
        single commands run, each stage's output kept under --out.

        A rerun resumes: a stage whose output is complete and whose inputs and options are
        unchanged (OUT/stages.json records what produced each) is skipped, so changing
        --offload re-solves without collecting again. Prints a line per stage, a progress
        bar while one runs, then the held-out table and the command to run."""
        from placer.pipeline import PlanRequest, run_plan
        from placer.plan.engine import is_gguf
        from traces.collecting.runs import CollectOptions

        gguf = is_gguf(model)
        collect = CollectOptions(mode=mode, batch_size=batch_size, max_length=max_length,
                                 max_tokens=max_tokens, device=device, seed=seed,
                                 weights=not gguf, tokenizer=tokenizer)
        solve = so.solve_options(
            solver=solver, budget=budget, offload=offload, concurrency=concurrency,
            weights=weights, ep=ep, page_size=page_size, robust=robust, time_limit=time_limit,
            seed=seed, steps=steps, cache=cache, cache_policy=cache_policy, execution=execution)
        request = PlanRequest(model=model, corpora=tuple(corpus), hardware=hardware, out=out,
                              engine=engine, collect=collect, fraction=fraction, seed=seed,
                              solve=solve, oracle_time_limit=oracle_time_limit,
                              text_field=text_field, llamacpp_version=llamacpp_version,
                              verbose=verbose, ctx=ctx, kv_type=kv_type)
        with contextlib.redirect_stdout(sys.stderr) if json_out else contextlib.nullcontext():
            result = run_plan(request, progress=not json_out and sys.stderr.isatty(),
                              say=typer.echo)
        if json_out:
            print_json({"out": result["out"], "command": result["command"],
                        "followups": result["followups"],
                        "stages": {name: {"skipped": s.skipped, "key": s.key}
                                   for name, s in result["stages"].items()},
                        "report": result["report"], "estimated": result["estimated"]})
