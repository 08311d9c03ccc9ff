"""The user-facing error, and the one line it is shown as."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

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
