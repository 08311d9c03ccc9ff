"""`placer emit`: a plan and its checkpoint to the placed directory a serving host loads."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from placer.commands.common import command, print_json
from placer.files import check_outputs
from placer.units import format_bytes


def register(app: typer.Typer) -> None:
    @command(app, "emit")
    def emit(
        plan: Annotated[Path, typer.Option(help="plan.json written by `placer solve`.")],
        model: Annotated[Path, typer.Option(help="The checkpoint directory it was solved for.")],
        out: Annotated[Path, typer.Option(
            help="Placed directory to write: new, or empty (or --force); never inside, equal to "
                 "or holding --model.")],
        align: Annotated[int, typer.Option(
            help="Every output tensor (each expert's cold part) starts at a multiple of this "
                 "absolute byte offset.")] = 4096,
        force: Annotated[bool, typer.Option(
            help="Replace the placement in --out (only a placement: a manifest.json and the "
                 "files it names, nothing else): the new one is written beside it and swapped "
                 "in once complete, so the old one stays valid until then (room for both is "
                 "needed).")] = False,
        json_out: Annotated[bool, typer.Option("--json", help="Print the output files as JSON.")
                            ] = False,
    ) -> None:
        """Write card<N>.safetensors (resident pages), host<G>.safetensors (cold parts, one
        aligned range per expert) and manifest.json (last) for PLAN, streaming bytes from
        MODEL. Nothing is left behind on failure, SIGINT or SIGTERM; a second emit into the
        same --out while one runs is refused."""
        from placer.placed.emit import emit_placement
        from placer.plan.placement import read_plan

        check_outputs([("--out", out)], [("the plan", plan), ("the checkpoint", model)],
                      directory=True)
        manifest = emit_placement(read_plan(plan), model, out, align=align, force=force,
                                  progress=not json_out and sys.stderr.isatty())
        if json_out:
            print_json({"out": str(out), "files": manifest["files"]})
            return
        for f in manifest["files"]:
            typer.echo(f"{f['name']:>20}  {format_bytes(f['size']):>12}  sha256 {f['sha256'][:16]}")
        typer.echo(f"manifest written to {out / 'manifest.json'}")
