"""`placer collect`: run a real MoE checkpoint over sample traffic and record its routing."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Annotated

import typer

from placer.commands.common import command, model_identity, print_json
from placer.errors import PlacerError
from placer.inventory import read_inventory
from traces.collect import DTYPES, MODES, CollectOptions, check_options, collect
from traces.corpora import open_corpus


def register(app: typer.Typer) -> None:
    @command(app, "collect")
    def collect_command(
        model: Annotated[Path, typer.Option(
            help="Checkpoint directory (config.json, *.safetensors, tokenizer).")],
        out: Annotated[Path, typer.Option(help="Trace directory to write into.")],
        corpus: Annotated[list[Path] | None, typer.Option(
            help="Corpus file (.txt blocks, .jsonl text/messages/turns, .parquet); repeatable.")
        ] = None,
        tag: Annotated[list[str] | None, typer.Option(
            help="Tag of each --corpus, in order (default: the file stem).")] = None,
        text_field: Annotated[str, typer.Option(
            help="Text field of .jsonl records / column of .parquet corpora.")] = "text",
        random_tokens: Annotated[int | None, typer.Option(
            help="Also run N uniform random token ids (documents of --max-length; tag random).")
        ] = None,
        mode: Annotated[str, typer.Option(
            help=f"{' | '.join(MODES)}: one forward pass per document (rows are decode), or "
                 "a prompt then greedy decoding (prefill and decode rows).")] = "score",
        max_new_tokens: Annotated[int, typer.Option(
            help="With --mode generate: tokens to decode per prompt.")] = 32,
        batch_size: Annotated[int, typer.Option(help="Documents per forward pass.")] = 8,
        max_length: Annotated[int, typer.Option(
            help="Truncate each document / prompt to this many tokens.")] = 512,
        max_tokens: Annotated[int | None, typer.Option(
            help="Stop each corpus after this many recorded tokens.")] = None,
        device: Annotated[str, typer.Option(help="auto (cuda when present), cpu, cuda, cuda:N.")
                          ] = "auto",
        dtype: Annotated[str, typer.Option(
            help=f"{' | '.join(DTYPES)} (auto: as stored in the checkpoint).")] = "auto",
        seed: Annotated[int, typer.Option(help="Seed for random tokens and torch.")] = 0,
        tokenizer: Annotated[Path | None, typer.Option(
            help="Tokenizer directory (default: the checkpoint's own).")] = None,
        weights: Annotated[bool, typer.Option(
            help="Record the gate weights of the selected experts.")] = True,
        progress: Annotated[bool, typer.Option(help="Show a progress bar on stderr.")] = True,
        json_out: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")
                            ] = False,
    ) -> None:
        """Record the routing of a real MoE checkpoint over sample traffic.

        Runs the checkpoint with transformers (local files only) over the corpora and writes,
        for every token and MoE layer, the experts its router selected and their gate weights
        (Parquet traces in --out, one file per corpus)."""
        corpus, tag = corpus or [], tag or []
        if tag and len(tag) != len(corpus):
            raise PlacerError(f"give one --tag per --corpus ({len(tag)} tags, "
                              f"{len(corpus)} corpora)")
        options = CollectOptions(mode=mode, batch_size=batch_size, max_length=max_length,
                                 max_new_tokens=max_new_tokens, max_tokens=max_tokens,
                                 device=device, dtype=dtype, seed=seed, weights=weights,
                                 tokenizer=tokenizer, progress=progress)
        check_options(options)
        inv = read_inventory(model)
        identity = model_identity(inv)
        corpora = [open_corpus(path, tag=tag[i] if tag else None, text_field=text_field)
                   for i, path in enumerate(corpus)]
        results = collect(model, corpora, out, identity, options, random_tokens=random_tokens)
        if json_out:
            print_json([{**asdict(r), "path": str(r.path)} for r in results])
            return
        for r in results:
            typer.echo(f"{r.tag}: {r.tokens} tokens, {r.sequences} sequences, {r.rows} rows "
                       f"-> {r.path}")
