"""The `placer` console entry point, cheap to import on purpose.

The console script runs `from placer.cli import main; main()`. This module imports nothing
at its top, so the script reaches `main` at once; `main` makes SIGINT and SIGTERM raise a
KeyboardInterrupt naming the signal, then imports the
command line (`placer.commands.app`: typer; the one command asked for is imported as it is
looked up) inside its own handler, so
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


def _interrupted(signum: int, frame: object) -> None:
    """SIGINT or SIGTERM as a KeyboardInterrupt naming it (placer.errors.interrupted_by), at
    once: while the command line is imported nothing has been done, and a signal held until
    the import ends (as a running command holds one: placer.errors.held_for_import) would
    land while help is being printed, half of it out."""
    import signal

    raise KeyboardInterrupt("SIGTERM" if signum == signal.SIGTERM else "")


def main() -> None:
    """Console entry point: the command line, imported and run under one interrupt handler."""
    import signal

    try:
        for signum, default in ((signal.SIGINT, signal.default_int_handler),
                                (signal.SIGTERM, signal.SIG_DFL)):
            if signal.getsignal(signum) is default:  # not where one is set or ignored
                signal.signal(signum, _interrupted)
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
    sends again, arriving now would end the process by the signal (status -2 or -15).

    Then clear CPython's record of an unhandled KeyboardInterrupt. A KeyboardInterrupt raised
    inside code run by `exec` of a string (dataclasses and namedtuple make their methods so,
    as placer's imports run) sets it even where it is caught, and `python -m placer` then
    ends by SIGINT (status -2) whatever status placer exits with (CPython 3.8-3.13,
    Python/pythonrun.c run_eval_code_obj, Modules/main.c Py_RunMain). Each such `exec`
    clears it first: an empty one does nothing else."""
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_IGN)
    exec("")  # noqa: S102 - see the docstring


def __getattr__(name: str) -> object:
    if name in APP_NAMES:
        from placer.commands import app as module

        return getattr(module, name)
    raise AttributeError(f"module 'placer.cli' has no attribute {name!r}")
