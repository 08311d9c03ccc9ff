"""`placer verify`: prove a placed directory byte for byte against its checkpoint."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from placer.commands.common import command, print_json
from placer.commands.placed_dir import MODEL_HELP, source_model
from placer.units import format_bytes


def register(app: typer.Typer) -> None:
    @command(app, "verify")
    def verify(
        placed: Annotated[Path, typer.Argument(help="Placed directory written by `placer emit`.")],
        model: Annotated[Path | None, typer.Option(help=MODEL_HELP)] = None,
        json_out: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")
                            ] = False,
    ) -> None:
        """Re-read every source and output range and compare them, check sha256s, that every
        routed expert is placed exactly once, that no card exceeds its budget, and that the
        manifest validates. Exit 1 on any difference, naming the tensor, expert and file."""
        from placer.placed.verify import verify_placed

        report = verify_placed(placed, source_model(placed, model))
        if json_out:
            print_json(report.to_json())
        else:
            for problem in report.problems:
                typer.echo(f"FAIL {problem}", err=True)
            if report.ok:
                typer.echo(f"ok: {placed}: {report.files} files, {report.pieces} pieces, "
                           f"{format_bytes(report.bytes_compared)} compared with the source")
        if not report.ok:
            raise typer.Exit(1)
