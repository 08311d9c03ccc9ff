"""`placer run`: generate through the reference staging runtime and show what it staged."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from placer.commands.common import command, print_json
from placer.commands.placed_dir import MODEL_HELP, check_placed, source_model
from placer.errors import PlacerError
from placer.hardware.devices import check_device
from placer.report.serving import print_result


def register(app: typer.Typer) -> None:
    @command(app, "run")
    def run(
        placed: Annotated[Path, typer.Argument(
            help="Placed directory written by `placer emit` (manifest.json + shards).")],
        prompt: Annotated[str, typer.Option(help="Text to continue.")],
        model: Annotated[Path | None, typer.Option(help=MODEL_HELP)] = None,
        max_new_tokens: Annotated[int, typer.Option(help="Tokens to generate (greedy).")] = 32,
        cache_slots: Annotated[int | None, typer.Option(
            help="Cache slots per card for staged experts, instead of the manifest's "
                 "(0: pinned pages only). Default: each card's slots and policy as placed.")
        ] = None,
        device: Annotated[str, typer.Option(
            help="torch device for the model and every card: auto, cpu, cuda, cuda:N.")
        ] = "auto",
        prefetch: Annotated[bool | None, typer.Option(
            "--prefetch/--no-prefetch",
            help="Prefetch: at each MoE layer, apply the next MoE layer's router to this "
                 "layer's input and copy its top-k cold experts ahead (cache under LRU, "
                 "whatever the plan's policy; the plan's parameters, or defaults). Counts "
                 "prefetched, useful, late and wasted experts; late on the model clock. "
                 "Default: as the plan decided (`placer solve`; off for an older plan).")
        ] = None,
        json_out: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")
                            ] = False,
    ) -> None:
        """Load the model with its routed experts taken from PLACED (resident pages on the
        device, cold pages in host memory, staged exactly when selected), generate
        greedily, and print the text and the staging counters."""
        from placer.runtime.generate import run_prompt

        check_run_options(placed, prompt, cache_slots, device)
        result = run_prompt(placed, source_model(placed, model), prompt,
                            max_new_tokens=max_new_tokens,
                            cache_slots=cache_slots, device=device, prefetch=prefetch)
        if json_out:
            print_json(result)
        else:
            print_result(result)


def check_text(value: str, option: str) -> None:
    """A PlacerError naming the first byte of `value` that is not UTF-8: Python hands argv's
    undecodable bytes over as lone surrogates (surrogateescape), which no tokenizer takes."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raw = os.fsencode(value)
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise PlacerError(f"{option}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at byte "
                              f"offset {exc.start})") from None
        raise PlacerError(f"{option}: not UTF-8 text (a lone surrogate)") from None


def check_run_options(placed: Path, prompt: str, cache_slots: int | None, device: str) -> None:
    """One line for a value `placer run` cannot use, before the model is loaded."""
    check_text(prompt, "--prompt")
    check_placed(placed)
    if not prompt.strip():
        raise PlacerError("--prompt: expected some text to continue, got an empty prompt")
    check_device(device)
