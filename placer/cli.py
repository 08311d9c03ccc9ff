"""The `placer` command line: thin typer commands.

Each command module in `placer.commands` defines `register(app)`; a command parses its
options, calls one function, and prints. Domain errors are turned into one line and exit 1
by `placer.commands.common.command` (the one CLI boundary); click's usage errors (unknown
option, missing argument, a value of the wrong type) into one line and exit 2 by
`PlacerGroup.main`, which both the console entry point and typer's CliRunner call.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import typer
import typer.rich_utils
from typer.core import TyperGroup

try:  # typer 0.2x carries its own copy of click; its commands raise that copy's exceptions
    from typer._click import exceptions as click_errors
    from typer._click.utils import echo
except ImportError:  # pragma: no cover - a typer that uses click itself
    from click import echo
    from click import exceptions as click_errors

from placer.commands import (
    bench,
    collect,
    emit,
    evaluate,
    export,
    hardware,
    inspect,
    plan,
    run,
    schema,
    serve,
    solve,
    traces,
    verify,
)
from placer.placed.commit import Signals

HELP_WIDTH = 120  # --help when stdout is not a terminal (typer's rich default is 80 there)


class PlacerGroup(TyperGroup):
    """The top `placer` group: every usage error is one line on stderr, exit status 2. While a
    command runs, SIGTERM is raised in it as SIGINT is (Signals: an Interrupted, once), so
    that whatever it was writing is cleaned up as on Ctrl-C, never left half-written."""

    def main(self, args: Any = None, prog_name: str | None = None,
             complete_var: str | None = None, standalone_mode: bool = True, **extra: Any
             ) -> Any:
        if not sys.stdout.isatty() and not os.environ.get("TERMINAL_WIDTH"):
            typer.rich_utils.MAX_WIDTH = HELP_WIDTH
        try:
            with Signals():
                rv = super().main(args, prog_name, complete_var, standalone_mode=False,
                                  **extra)
            code = rv if isinstance(rv, int) and not isinstance(rv, bool) else 0
        except click_errors.NoArgsIsHelpError as exc:  # bare `placer`: typer printed the help
            code = exc.exit_code
        except click_errors.ClickException as exc:
            echo(f"error: {usage_message(exc)}", err=True)
            code = exc.exit_code
        except typer.Abort:
            echo("error: aborted", err=True)
            code = 1
        if not standalone_mode:
            return code
        sys.exit(code)


def usage_message(exc: click_errors.ClickException) -> str:
    """One line: click's message, and where to look for help."""
    message = " ".join(exc.format_message().split())
    ctx = getattr(exc, "ctx", None)
    if isinstance(exc, click_errors.UsageError) and ctx is not None:
        message += f" (see '{ctx.command_path} --help')"
    return message


app = typer.Typer(
    name="placer",
    cls=PlacerGroup,
    help="Offline expert-placement optimizer for MoE models on boxes of consumer GPUs.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


def version_text() -> str:
    """"placer VERSION" from the installed package's metadata (pyproject.toml's version)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"placer {version('placer')}"
    except PackageNotFoundError:
        return "placer (not installed: no package metadata; pip install -e . records it)"


def show_version(value: bool) -> None:
    if value:
        typer.echo(version_text())
        raise typer.Exit()


@app.callback()
def placer_main(
    version: bool = typer.Option(False, "--version", is_eager=True, callback=show_version,
                                 help="Print placer's version and exit."),
) -> None:
    """Offline expert-placement optimizer for MoE models on boxes of consumer GPUs."""


for module in (inspect, hardware, plan, collect, traces, solve, emit, verify, evaluate, run,
               serve, bench, export, schema):
    module.register(app)


def main() -> None:
    """Console entry point."""
    app()
