"""The `placer` command line: thin typer commands (the console entry point, placer/cli.py,
imports this module inside its interrupt handler).

Each command module in `placer.commands` defines `register(app)`; a command parses its
options, calls one function, and prints. Domain errors are turned into one line and exit 1
by `placer.commands.common.command` (the one CLI boundary); click's usage errors (unknown
option, missing argument, a value of the wrong type) into one line and exit 2 by
`PlacerGroup.main`, which both the console entry point and typer's CliRunner call.

Start-up is kept short (`benchmarks/bench_startup.py` times it; tests/test_layering.py checks
what it imports): the command modules import at their top only what their options need, and
each command imports the heavy packages (torch, pyarrow, numpy, the solvers) in its body.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from typing import Any

import typer
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
    probe,
    run,
    schema,
    serve,
    solve,
    traces,
    verify,
)
from placer.commands.common import INTERRUPTED

HELP_WIDTH = 120  # --help when stdout is not a terminal (typer's rich default is 80 there)


class PlacerGroup(TyperGroup):
    """The top `placer` group: every usage error is one line on stderr, exit status 2. While a
    command runs, SIGTERM is raised in it as SIGINT is (Signals: an Interrupted, once), so
    that whatever it was writing is cleaned up as on Ctrl-C, never left half-written."""

    def main(self, args: Any = None, prog_name: str | None = None,
             complete_var: str | None = None, standalone_mode: bool = True, **extra: Any
             ) -> Any:
        argv = sys.argv[1:] if args is None else list(args)
        help_only = shows_help(argv)
        if help_only and not sys.stdout.isatty() and not os.environ.get("TERMINAL_WIDTH"):
            from typer import rich_utils  # 0.3 s: only where help is printed (a plain
            # `import typer.rich_utils` here would make `typer` local to main and unbound
            # at `except typer.Abort` below)

            rich_utils.MAX_WIDTH = HELP_WIDTH
        try:
            with contextlib.nullcontext() if help_only or "--version" in argv else signals():
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

    def make_context(self, *args: Any, **kwargs: Any) -> Any:
        with interrupt_line():  # parsing, and printing help (which imports rich)
            return super().make_context(*args, **kwargs)

    def invoke(self, ctx: Any) -> Any:
        with interrupt_line():  # a command handles its own (placer.commands.common.command)
            return super().invoke(ctx)


@contextlib.contextmanager
def interrupt_line() -> Iterator[None]:
    """Ctrl-C outside a command (typer would exit 130 silently): one line, exit 130."""
    try:
        yield
    except KeyboardInterrupt:
        echo("error: interrupted by SIGINT; nothing was done", err=True)
        raise typer.Exit(INTERRUPTED) from None


def shows_help(argv: list[str]) -> bool:
    """Whether `argv` only prints help: --help anywhere, nothing, or a group's name alone (a
    group given no command prints its help). Such a run (and --version) writes nothing, so
    it skips `signals` (which imports numpy: a tenth of a second)."""
    groups = {info.name for info in app.registered_groups}
    return (not argv or any(a in ("--help", "-h") for a in argv)
            or (len(argv) == 1 and argv[0] in groups))


def signals() -> contextlib.AbstractContextManager:
    """placer.placed.commit.Signals, imported when a command is to run."""
    from placer.placed.commit import Signals

    return Signals()


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


for module in (inspect, hardware, probe, plan, collect, traces, solve, emit, verify, evaluate, run,
               serve, bench, export, schema):
    module.register(app)

