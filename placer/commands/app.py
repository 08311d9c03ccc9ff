"""The `placer` command line: thin typer commands (the console entry point, placer/cli.py,
imports this module inside its interrupt handler).

Each command module in `placer.commands` defines `register(app)`; a command parses its
options, calls one function, and prints. Domain errors are turned into one line and exit 1
by `placer.commands.common.command` (the one CLI boundary); click's usage errors (unknown
option, missing argument, a value of the wrong type) into one line and exit 2 by
`PlacerGroup.main`, which both the console entry point and typer's CliRunner call.

Start-up is kept short (`benchmarks/bench_startup.py` times it; tests/test_layering.py and
tests/test_startup.py check what it imports): the top group builds a command (imports its
module, reads its options) only when that command is looked up, so `placer solve --help`
imports `placer.commands.solve` and no other command, and `placer --help` and `--version`
none (the listing comes from `placer.commands.index`); help imports typer's rich renderer
without the two modules it loads for what placer does not use (help_renderer). The command
modules import at their top only what their options need, and each command imports the
heavy packages (torch, pyarrow, numpy, the solvers) in its body.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
from collections.abc import Iterator, Mapping
from types import ModuleType
from typing import Any

import typer
from typer.core import TyperCommand, TyperGroup
from typer.main import get_group

try:  # typer 0.2x carries its own copy of click; its commands raise that copy's exceptions
    from typer._click import exceptions as click_errors
    from typer._click.utils import echo
except ImportError:  # pragma: no cover - a typer that uses click itself
    from click import echo
    from click import exceptions as click_errors

from placer.commands.index import COMMANDS, GROUPS
from placer.errors import error_text, interrupted_by

HELP_WIDTH = 120  # --help when stdout is not a terminal (typer's rich default is 80 there)
SETTINGS: dict[str, Any] = {"pretty_exceptions_enable": False, "add_completion": False}
# typer.rich_utils imports these at its top for markup mode "markdown" and for pretty
# tracebacks, neither of which placer uses (markup mode "rich", SETTINGS): markdown_it and
# pygments, about 0.07 s of its import. help_renderer imports it without them.
UNUSED_BY_HELP = {"rich.markdown": "Markdown", "rich.traceback": "Traceback"}


class Commands(Mapping):
    """The top group's commands by name, in the listing's order (placer.commands.index):
    each is built, its module imported, the first time it is looked up."""

    def __init__(self) -> None:
        self.built: dict[str, Any] = {}

    def __getitem__(self, name: str) -> Any:
        if name not in self.built:
            if name not in COMMANDS:
                raise KeyError(name)
            self.built[name] = build(name)
        return self.built[name]

    def __contains__(self, name: object) -> bool:
        return name in COMMANDS

    def __iter__(self) -> Iterator[str]:
        return iter(COMMANDS)

    def __len__(self) -> int:
        return len(COMMANDS)

    def summary(self, name: str) -> Any:
        """`name` as the listing shows it: the command where it is built, else a stand-in
        carrying the first paragraph of its help (all the listing prints of it)."""
        return self.built.get(name) or TyperCommand(name=name, help=COMMANDS[name])


def build(name: str) -> Any:
    """The click command of `placer NAME`: its module's `register` on an app of its own."""
    holder = typer.Typer(**SETTINGS)
    importlib.import_module(f"placer.commands.{name}").register(holder)
    return get_group(holder).commands[name]


class PlacerGroup(TyperGroup):
    """The top `placer` group: every usage error is one line on stderr, exit status 2. While a
    command runs, SIGTERM is raised in it as SIGINT is (Signals: an Interrupted, once), so
    that whatever it was writing is cleaned up as on Ctrl-C, never left half-written. Its
    commands are built on first use (Commands); its help lists them from the index."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if self.commands:  # registered on `app` itself: they would be lost
            raise TypeError(f"{sorted(self.commands)}: a command of placer is listed in "
                            "placer.commands.index and registered by its own module")
        self.commands = Commands()
        self.listing = False

    def format_help(self, ctx: Any, formatter: Any) -> None:
        self.listing = True
        try:
            super().format_help(ctx, formatter)
        finally:
            self.listing = False

    def list_commands(self, ctx: Any) -> list[str]:
        return list(self.commands)  # typer's reads .items(): every command built

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        if self.listing:
            return self.commands.summary(cmd_name)
        return super().get_command(ctx, cmd_name)

    def main(self, args: Any = None, prog_name: str | None = None,
             complete_var: str | None = None, standalone_mode: bool = True, **extra: Any
             ) -> Any:
        argv = sys.argv[1:] if args is None else list(args)
        help_only = shows_help(argv)
        if help_only:
            rich_utils = help_renderer()
            if not sys.stdout.isatty() and not os.environ.get("TERMINAL_WIDTH"):
                rich_utils.MAX_WIDTH = HELP_WIDTH
        try:
            with contextlib.nullcontext() if help_only or "--version" in argv else signals():
                rv = super().main(args, prog_name, complete_var, standalone_mode=False,
                                  **extra)
            code = rv if isinstance(rv, int) and not isinstance(rv, bool) else 0
        except click_errors.NoArgsIsHelpError as exc:  # bare `placer`: typer printed the help
            code = exc.exit_code
        except click_errors.ClickException as exc:
            echo(f"error: {error_text(usage_message(exc), {'argv': argv})}", err=True)
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
    """Ctrl-C or SIGTERM outside a command (typer would exit 130 silently): one line, exit
    130 (143 after SIGTERM)."""
    try:
        yield
    except KeyboardInterrupt as exc:
        name, status = interrupted_by(exc)
        echo(f"error: interrupted by {name}; nothing was done", err=True)
        raise typer.Exit(status) from None


def shows_help(argv: list[str]) -> bool:
    """Whether `argv` only prints help: --help anywhere, nothing, or a group's name alone (a
    group given no command prints its help). Such a run (and --version) writes nothing, so
    it skips `signals` (which imports numpy: a tenth of a second)."""
    return (not argv or any(a in ("--help", "-h") for a in argv)
            or (len(argv) == 1 and argv[0] in GROUPS))


def help_renderer() -> ModuleType:
    """typer.rich_utils, which renders help, imported without the modules of UNUSED_BY_HELP:
    stand-ins take their place in sys.modules while it imports, and leave it right after,
    so that whatever imports them later gets rich's own. (A typer whose rich_utils wants
    more of them than the stand-ins give gets them: it is imported again, plainly;
    tests/test_startup.py checks that the stand-ins are used and change no help text.)"""
    if "typer.rich_utils" in sys.modules:
        return sys.modules["typer.rich_utils"]
    stand_ins = {name: stand_in(name, attr) for name, attr in UNUSED_BY_HELP.items()
                 if name not in sys.modules}
    sys.modules.update(stand_ins)
    try:
        return importlib.import_module("typer.rich_utils")
    except Exception:  # noqa: BLE001 - any failure with the stand-ins: import it plainly
        for name in stand_ins:
            del sys.modules[name]
        stand_ins = {}
        return importlib.import_module("typer.rich_utils")
    finally:
        for name, module in stand_ins.items():
            if sys.modules.get(name) is module:
                del sys.modules[name]


def stand_in(name: str, attr: str) -> ModuleType:
    """A module `name` whose class `attr` refuses to be made (placer's help never does)."""

    class Unused:
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            raise RuntimeError(f"{name}.{attr}: not loaded for placer's help "
                               "(placer.commands.app.help_renderer)")

    Unused.__name__ = Unused.__qualname__ = attr
    module = ModuleType(name, "placer's stand-in while typer.rich_utils is imported")
    setattr(module, attr, Unused)
    return module


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
    **SETTINGS,
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

