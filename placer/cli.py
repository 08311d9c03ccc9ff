"""The `placer` console entry point, cheap to import on purpose.

The console script runs `from placer.cli import main; main()`. This module imports nothing
at its top, so the script reaches `main` at once; `main` then imports the command line
(`placer.commands.app`: typer; the one command asked for is imported as it is looked up)
inside its own handler, so that Ctrl-C at any moment, while importing too, is one line on
stderr and exit status 130, never a KeyboardInterrupt traceback. Once a command runs,
`placer.commands.common.command` handles an interrupt (cleaning up what the command was
writing) the same way.

What no handler can cover is Python's own start (the interpreter, site) and the import of
this module itself, which imports only `sys` (loaded already): a signal in that first
instant is the interpreter's to report.

`from placer.cli import app` still gives the typer app (tests and scripts use it): the name
is looked up in `placer.commands.app` on first use (PEP 562's module `__getattr__`).
"""

from __future__ import annotations

import sys

INTERRUPTED = 130  # 128 + SIGINT, the shell's status for a command ended by Ctrl-C
APP_NAMES = ("app", "PlacerGroup", "usage_message", "version_text", "HELP_WIDTH")


def main() -> None:
    """Console entry point: the command line, imported and run under one interrupt handler."""
    try:
        from placer.commands.app import app

        app()
    except KeyboardInterrupt:
        sys.stderr.write("error: interrupted by SIGINT; nothing was done\n")
        sys.stderr.flush()
        sys.exit(INTERRUPTED)


def __getattr__(name: str) -> object:
    if name in APP_NAMES:
        from placer.commands import app as module

        return getattr(module, name)
    raise AttributeError(f"module 'placer.cli' has no attribute {name!r}")
