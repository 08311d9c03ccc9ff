"""The user-facing error, and the one line it is shown as; how an interrupt ends placer."""

from __future__ import annotations

import signal
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from traces.errors import printable, shown

LONG_VALUE = 200   # an option's text echoed whole up to this many characters, else cut
MAX_LINE = 1000    # characters of an error line, whatever it quotes


class PlacerError(ValueError):
    """A user-facing error: caught once at the CLI boundary, printed as one line, exit 1."""


def error_text(message: str, values: Mapping[str, object] = {}) -> str:
    """`message` as the one error line shows it: every text option of `values` (the command's
    {parameter: value}) longer than LONG_VALUE that it quotes cut (`shown`: what the user
    typed is never echoed whole), control characters escaped, at most MAX_LINE characters.
    Paths are left whole: PATH_MAX bounds them and their end names the file."""
    for value in values.values():
        for item in value if isinstance(value, list | tuple) else [value]:
            if not isinstance(item, str) or isinstance(item, Path):
                continue
            for form in dict.fromkeys((item, repr(item)[1:-1])):
                if len(form) > LONG_VALUE and form in message:
                    message = message.replace(form, shown(form))
    message = printable(message)
    return message if len(message) <= MAX_LINE else shown(message, MAX_LINE)


INTERRUPTED = 130  # 128 + SIGINT, the shell's status for a command ended by Ctrl-C
EXIT_STATUS = {"SIGINT": INTERRUPTED, "SIGTERM": 128 + 15}  # 128 + the signal, as a shell says


def interrupted_by(exc: BaseException) -> tuple[str, int]:
    """The signal a KeyboardInterrupt stands for (its text names SIGTERM where placer raised
    it for one; Python's own, from SIGINT, has none) and the exit status for it."""
    name = str(exc) if str(exc) in EXIT_STATUS else "SIGINT"
    return name, EXIT_STATUS[name]


IMPORT_POLL_S = 0.002  # how often a held signal's thread looks whether the import has ended
_held: set[int] = set()  # the signals a thread holds until an import ends


def importing(frame: Any) -> bool:
    """Whether `frame` (a frame of the main thread) runs within an import: one of its callers
    is importlib's bootstrap, which every import statement goes through."""
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib._bootstrap"):
            return True
        frame = frame.f_back
    return False


def held_for_import(signum: int, frame: Any) -> bool:
    """Whether a signal whose handler runs at `frame` must wait: the main thread is importing
    a module. An exception raised there can abort the process: a compiled extension's
    initialisation runs Python code from C++ (torch's `_c10d_init`), which an exception
    cannot cross (status -6; 1 SIGTERM in 150 to `collect` as it imported torch), and one
    raised in a class body's `__set_name__` comes out as a RuntimeError (a traceback). Where
    it must, a thread sends `signum` to the main thread again once no import is on its stack,
    to whichever handler stands then (none where placer has begun to exit and ignores it),
    one such thread per signal."""
    if not importing(frame):
        return False
    if signum not in _held:
        _held.add(signum)
        threading.Thread(target=_send_after_import, args=(signum,), daemon=True,
                         name="placer-signal-after-import").start()
    return True


def _send_after_import(signum: int) -> None:
    """Send `signum` to the main thread once it imports nothing. The signal leaves `_held`
    before it is sent: its handler may run (and find another import under way) before this
    thread runs again, and must then start a thread of its own, not count on this one."""
    main = threading.main_thread().ident
    try:
        while callable(signal.getsignal(signum)):
            frame = sys._current_frames().get(main)
            if frame is None or not importing(frame):
                _held.discard(signum)
                signal.pthread_kill(main, signum)
                return
            time.sleep(IMPORT_POLL_S)
    finally:
        _held.discard(signum)
