"""`placer collect`: run a real MoE checkpoint over sample traffic (or send the traffic to a
running server that returns routed experts) and record its routing."""

from __future__ import annotations

import sys
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from placer.commands.common import command, print_json
from placer.errors import PlacerError
from placer.files import check_outputs, removed_on_failure
from placer.hardware.devices import check_device
from traces.choices import DTYPES, ENDPOINTS, ENGINES, MODES

if TYPE_CHECKING:
    from placer.checkpoint.inventory import Inventory
    from traces.collecting.collect import CollectResult
    from traces.collecting.server import ServerOptions


def register(app: typer.Typer) -> None:
    @command(app, "collect")
    def collect_command(
        out: Annotated[Path, typer.Option(help="Trace directory to write into.")],
        model: Annotated[Path | None, typer.Option(
            help="Checkpoint directory (config.json, *.safetensors, tokenizer).")] = None,
        gguf: Annotated[Path | None, typer.Option(
            help="Run this GGUF in llama.cpp itself instead (`make llama-env` installs it); "
                 "tokenized by llama.cpp unless --tokenizer is given.")] = None,
        corpus: Annotated[list[Path] | None, typer.Option(
            help="Corpus file (.txt blocks, .jsonl lines of text, messages or turns, mixed "
                 "freely, .parquet); repeatable.")
        ] = None,
        tag: Annotated[list[str] | None, typer.Option(
            help="Tag of each --corpus, in order (default: the file stem).")] = None,
        text_field: Annotated[str, typer.Option(
            help="Text field of .jsonl lines (a line without it is a chat: messages, else "
                 "turns) / column of .parquet corpora.")] = "text",
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
            help="Record at most this many tokens of each corpus, prompt and generated "
                 "tokens alike (the last sequence is cut to it).")] = None,
        device: Annotated[str, typer.Option(help="auto (cuda when present), cpu, cuda, cuda:N.")
                          ] = "auto",
        dtype: Annotated[str, typer.Option(
            help=f"{' | '.join(DTYPES)} (auto: as stored in the checkpoint).")] = "auto",
        seed: Annotated[int, typer.Option(help="Seed for random tokens and torch.")] = 0,
        tokenizer: Annotated[Path | None, typer.Option(
            help="Tokenizer directory (default: the checkpoint's own).")] = None,
        weights: Annotated[bool, typer.Option(
            help="Record the gate weights of the selected experts.")] = True,
        server: Annotated[str | None, typer.Option(
            help="Send the corpora to this running server (http://HOST:PORT) instead of "
                 "running the model here; it must return routed experts.")] = None,
        engine: Annotated[str | None, typer.Option(
            help=f"With --server: the server's engine, {' | '.join(ENGINES)} (started with "
                 "--enable-return-routed-experts).")] = None,
        config: Annotated[Path | None, typer.Option(
            help="With --server: the model's config.json instead of a checkpoint (give "
                 "--tokenizer unless its directory holds the tokenizer).")] = None,
        endpoint: Annotated[str, typer.Option(
            help=f"With --server --engine vllm: {' | '.join(ENDPOINTS)}, the API the documents "
                 "go through (/v1/completions as token ids, or /v1/chat/completions as "
                 "messages the server templates).")] = "completions",
        concurrency: Annotated[int, typer.Option(
            help="With --server: requests in flight at once.")] = 4,
        request_timeout: Annotated[float, typer.Option(
            help="With --server: seconds for the whole of one reply, however slowly it comes "
                 "(then retried, 3 times at most, as after a connection error or a 5xx).")
        ] = 600.0,
        progress: Annotated[bool, typer.Option(
            help="Show a progress bar on stderr (only where it is a terminal).")] = True,
        json_out: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")
                            ] = False,
    ) -> None:
        """Record the routing of a real MoE checkpoint over sample traffic.

        Runs the checkpoint with transformers (local files only) over the corpora and writes,
        for every token and MoE layer, the experts its router selected and their gate weights
        (Parquet traces in --out, one file per corpus).

        With --gguf FILE, runs the GGUF in llama.cpp itself (CPU backend, the side environment
        `make llama-env` builds) and records the selection its graph computes for every token
        and MoE layer (no gate weights).

        With --server URL --engine sglang|vllm, sends each document as a request to a
        running server started with --enable-return-routed-experts instead, decoding greedily up to
        --max-new-tokens, and records the routing the server returns: prompt tokens prefill,
        generated tokens decode, one sequence per request (no gate weights)."""
        from placer.checkpoint.inventory import read_inventory
        from traces.collecting.collect import CollectOptions, check_options, collect
        from traces.collecting.corpora import open_corpus
        from traces.collecting.server import ServerOptions
        from traces.llamacpp.collect import collect_gguf

        corpus, tag = corpus or [], tag or []
        progress = progress and sys.stderr.isatty()  # a bar only on a terminal (docs/cli.md)
        check_outputs([("--out", out)], [("the checkpoint", model), ("the config", config),
                                         ("the tokenizer", tokenizer), ("the GGUF", gguf),
                                         *(("the corpus", c) for c in corpus)], directory=True)
        if tag and len(tag) != len(corpus):
            raise PlacerError(f"give one --tag per --corpus ({len(tag)} tags, "
                              f"{len(corpus)} corpora)")
        corpora = [open_corpus(path, tag=tag[i] if tag else None, text_field=text_field)
                   for i, path in enumerate(corpus)]
        if server is not None:
            if engine is None:
                raise PlacerError(f"--server needs --engine ({' | '.join(ENGINES)})")
            if random_tokens:
                raise PlacerError("--random-tokens runs only locally; give --corpus with "
                                  "--server")
            options = ServerOptions(max_new_tokens=max_new_tokens, max_length=max_length,
                                    max_tokens=max_tokens, concurrency=concurrency,
                                    timeout_s=request_timeout, progress=progress,
                                    tokenizer=tokenizer, endpoint=endpoint)
            with removed_on_failure(out):
                results = _collect_server(server, engine, model, config, corpora, out, options)
        else:
            if engine is not None or config is not None or endpoint != "completions":
                raise PlacerError("--engine, --endpoint and --config go with --server URL")
            if (model is None) == (gguf is None):
                raise PlacerError("give --model CKPT or --gguf FILE (or --server URL to "
                                  "collect through a running server)")
            options = CollectOptions(mode=mode, batch_size=batch_size, max_length=max_length,
                                     max_new_tokens=max_new_tokens, max_tokens=max_tokens,
                                     device=device, dtype=dtype, seed=seed, weights=weights,
                                     tokenizer=tokenizer, progress=progress)
            check_options(options)
            if not 0 <= seed < 2**63:
                raise PlacerError(f"--seed: expected an integer in 0..2**63-1, got {seed}")
            if gguf is not None:
                if device != "auto" or dtype != "auto":
                    raise PlacerError("--device and --dtype go with --model (llama.cpp runs the "
                                      "GGUF's own types on the CPU)")
                identity = read_inventory(gguf).identity()
                with removed_on_failure(out):
                    results = collect_gguf(gguf, corpora, out, identity, options,
                                           random_tokens=random_tokens)
            else:
                check_device(device)
                identity = read_inventory(model).identity()
                with removed_on_failure(out):
                    results = collect(model, corpora, out, identity, options,
                                      random_tokens=random_tokens)
        if json_out:
            print_json([{**asdict(r), "path": str(r.path)} for r in results])
            return
        for r in results:
            typer.echo(f"{r.tag}: {r.tokens} tokens, {r.sequences} sequences, {r.rows} rows "
                       f"-> {r.path}")


def _collect_server(url: str, engine: str, model: Path | None, config: Path | None,
                    corpora: list, out: Path, options: ServerOptions) -> list[CollectResult]:
    """`collect --server`: the model's shape from the checkpoint or its config.json."""
    from placer.checkpoint.estimate import estimate_inventory
    from placer.checkpoint.inventory import read_inventory
    from traces.collecting.server import collect_from_server

    if (model is None) == (config is None):
        raise PlacerError("--server needs --model CKPT or --config config.json (not both): "
                          "the server's routing is checked against that model")
    inv: Inventory = read_inventory(model) if model is not None else estimate_inventory(config)
    return collect_from_server(url, engine, model if model is not None else config.parent,
                               corpora, out, inv.identity(), options,
                               shared_experts=inv.shared_experts, estimated=inv.estimated)
