"""`placer serve`: an OpenAI-compatible server for a placed model."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from placer.commands.common import command
from placer.commands.placed_dir import MODEL_HELP, check_placed, source_model
from placer.errors import PlacerError
from placer.hardware.devices import check_device

BATCHING_HELP = (
    "auto: transformers' continuous batching, checked at start on a short greedy probe "
    "against model.generate; where it cannot run the model (or generates other tokens) one "
    "request at a time through model.generate (serial). Continuous batching ran qwen3_moe, "
    "mixtral, olmoe and deepseek_v3 with sdpa or eager attention, and gpt_oss with eager "
    "attention. continuous: fail instead of falling back. serial: never batch.")

PROMPT_HELP = ("The most tokens a prompt may hold (default: the model's context, "
               "max_position_embeddings, or --kv-tokens on a CPU if fewer); a longer one is a "
               "400, refused after tokenizing about this many tokens of it.")


def register(app: typer.Typer) -> None:
    @command(app, "serve")
    def serve_cmd(
        placed: Annotated[Path, typer.Argument(
            help="Placed directory written by `placer emit` (manifest.json + shards).")],
        model: Annotated[Path | None, typer.Option(help=MODEL_HELP)] = None,
        host: Annotated[str, typer.Option(
            help="Address to listen on (127.0.0.1: this machine only; 0.0.0.0: every "
                 "interface).")] = "127.0.0.1",
        port: Annotated[int, typer.Option(help="TCP port (0: any free port).")] = 8000,
        device: Annotated[str, typer.Option(
            help="torch device for the model and every card: auto, cpu, cuda, cuda:N.")
        ] = "auto",
        cache_slots: Annotated[int | None, typer.Option(
            help="Cache slots per card for staged experts, instead of the manifest's (default: "
                 "each card's slots per layer and policy as placed).")] = None,
        batching: Annotated[str, typer.Option(help=BATCHING_HELP)] = "auto",
        kv_tokens: Annotated[int, typer.Option(
            help="KV cache tokens on a CPU device (on a GPU transformers sizes the cache "
                 "from free memory); also the longest prompt + completion there.")] = 16384,
        max_prompt_tokens: Annotated[int | None, typer.Option(help=PROMPT_HELP)] = None,
        prefetch: Annotated[bool | None, typer.Option(
            "--prefetch/--no-prefetch",
            help="Prefetch the next MoE layer's experts as `placer run --prefetch` does "
                 "(one-token forwards only; /metrics adds placer_prefetched and the "
                 "useful, late, wasted and bytes counters). Default: as the plan decided.")
        ] = None,
    ) -> None:
        """Serve PLACED over HTTP with the OpenAI API: POST /v1/completions and
        /v1/chat/completions (stream: true for server-sent events ending in
        `data: [DONE]`), GET /v1/models, /health and /metrics (Prometheus: placer_staged_bytes
        and the other staging counters by card, generated tokens, requests).

        Greedy by default (what `placer run` prints for the same prompt); temperature,
        top_p and seed sample through transformers' generation, the same seed giving the
        same text; temperature 0 is greedy. A completion's prompt may be a list (a choice
        each); n must be 1; stop strings are honoured. A bad request gets a 4xx with an
        OpenAI error body. SIGTERM or Ctrl-C stop taking connections, finish the
        requests in flight (at most 120 s), saying how many, and exit 0: within a second
        when none is in flight."""
        from placer.serve.engine import BATCHING
        from placer.serve.server import serve

        check_placed(placed)
        if batching not in BATCHING:
            raise PlacerError(f"--batching must be one of {', '.join(BATCHING)}, got "
                              f"{batching!r}")
        check_device(device)
        serve(placed, source_model(placed, model), host=host, port=port, device=device,
              cache_slots=cache_slots,
              batching=batching, kv_tokens=kv_tokens, max_prompt_tokens=max_prompt_tokens,
              prefetch=prefetch, announce=lambda line: typer.echo(line))
        exit_now()


def exit_now() -> None:
    """Exit 0 at once, once the server has drained and its engine stopped: the interpreter's
    own teardown of torch and transformers takes 1-4 s (more on a busy machine), which would
    keep a stopped server's process alive well past the second a supervisor allows."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
