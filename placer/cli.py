"""The `placer` console entry point, cheap to import on purpose.

The console script runs `from placer.cli import main; main()`. This module imports nothing
at its top, so the script reaches `main` at once; `main` makes SIGTERM raise as SIGINT does
(a KeyboardInterrupt naming it), then imports the command line (`placer.commands.app`:
typer; the one command asked for is imported as it is looked up) inside its own handler, so
that Ctrl-C or SIGTERM at any moment, while importing too, is one line on stderr and exit
status 130 (143 after SIGTERM: 128 plus the signal, as a shell reports it), never a
KeyboardInterrupt traceback. Once a command runs, `placer.commands.common.command` handles
an interrupt (cleaning up what the command was writing) the same way, with the same
statuses (`placer.errors.interrupted_by`), and placer.placed.commit.Signals makes sure none is lost.

What no handler can cover is Python's own start (the interpreter, site) and the import of
this module itself, which imports only `sys` (loaded already): a signal in that first
instant is the interpreter's to report (SIGTERM's default action: killed, status 143).

`from placer.cli import app` still gives the typer app (tests and scripts use it): the name
is looked up in `placer.commands.app` on first use (PEP 562's module `__getattr__`).
"""

from __future__ import annotations

import sys
from typing import Any

APP_NAMES = ("app", "PlacerGroup", "usage_message", "version_text", "HELP_WIDTH")


def _terminated(signum: int, frame: object) -> None:
    raise KeyboardInterrupt("SIGTERM")


def main() -> None:
    """Console entry point: the command line, imported and run under one interrupt handler."""
    import signal

    try:
        if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:  # not where one is set
            signal.signal(signal.SIGTERM, _terminated)
        from placer.commands.app import app

        app()
    except KeyboardInterrupt as exc:
        _exiting(signal)
        from placer.errors import interrupted_by

        name, status = interrupted_by(exc)
        sys.stderr.write(f"error: interrupted by {name}; nothing was done\n")
        sys.stderr.flush()
        sys.exit(status)
    finally:
        _exiting(signal)


def _exiting(signal: Any) -> None:
    """Ignore SIGINT and SIGTERM from here: placer is leaving with its status (130 or 143
    after an interrupt it handled), and a second signal, or one placer.placed.commit.Signals
    sends again, arriving now would end the process by the signal (status -2 or -15)."""
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_IGN)


def __getattr__(name: str) -> object:
    if name in APP_NAMES:
        from placer.commands import app as module

        return getattr(module, name)
    raise AttributeError(f"module 'placer.cli' has no attribute {name!r}")
