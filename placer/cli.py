"""The `placer` command line: thin typer commands.

Each command module in `placer.commands` defines `register(app)`; a command parses its
options, calls one function, and prints. Domain errors are turned into one line and exit 1
by `placer.commands.common.command` (the one CLI boundary).
"""

from __future__ import annotations

import typer

from placer.commands import (
    collect,
    emit,
    evaluate,
    export,
    hardware,
    inspect,
    run,
    schema,
    solve,
    traces,
    verify,
)

app = typer.Typer(
    name="placer",
    help="Offline expert-placement optimizer for MoE models on boxes of consumer GPUs.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
for module in (inspect, hardware, collect, traces, solve, emit, verify, evaluate, run, export,
               schema):
    module.register(app)


def main() -> None:
    """Console entry point."""
    app()
