"""The error of trace input, and how any text a user gave or a file held is shown: escaped
where it holds control characters (`printable`), cut where it is long (`shown`)."""

from __future__ import annotations

import re
import sys
from typing import Any


class TraceError(ValueError):
    """Bad trace input: a missing or empty corpus, a trace of another model, a bad schema."""


# What a terminal acts on instead of showing: C0 controls (ESC starts colours, cursor moves,
# screen clears and title changes; BEL, BS, CR overwrite), DEL and the C1 controls (U+009B is
# a CSI of its own). Newline and tab are kept where text is several lines (`keep`).
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_CONTROL_BUT_LINES = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
SHOWN_CHARS = 80  # characters of a user's value quoted in an error line


def printable(text: str, *, lines: bool = False) -> str:
    """`text` with every control character written as its \\uXXXX escape (what JSON and TOML
    read back as the same character), newline and tab kept with `lines`."""
    pattern = _CONTROL_BUT_LINES if lines else _CONTROL
    return pattern.sub(lambda m: f"\\u{ord(m[0]):04x}", text)


def shown(text: object, limit: int = SHOWN_CHARS) -> str:
    """`text` as an error line quotes it: printable, and past `limit` characters cut, saying
    how long it was ("abc... (100000 characters)")."""
    text = str(text)
    if len(text) > limit:
        return f"{printable(text[:limit])}... ({len(text)} characters)"
    return printable(text)


def bar_stream() -> Any:
    """The stderr a rich progress bar writes to: past the filter that makes a command's
    output printable (placer.progress.PrintableStream, which escapes what it is given and
    keeps the stream it wraps as `unfiltered`), which would escape the bar's cursor moves."""
    return getattr(sys.stderr, "unfiltered", sys.stderr)


def first_line(exc: BaseException, limit: int = 120) -> str:
    """The first line of a library's message, cut to `limit` characters (never its multi-line
    explanation inside placer's one error line), or the exception's type name."""
    text = str(exc).strip()
    return (text.splitlines()[0][:limit] if text else "") or type(exc).__name__
