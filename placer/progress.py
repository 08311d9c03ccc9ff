"""What placer shows on a terminal: progress on stderr for commands that run long (a bar
over a known number of items, ItemsBar; a spinner naming the running stage of a solve, with
its time elapsed beside its time limit, StageSpinner: the solvers call its `stage` and never
import placer), and stdout and stderr kept free of control sequences that came from input.

A name, a description or a path that a spec, a plan, a checkpoint or the user gave may hold
control characters (ESC sequences clear the screen, move the cursor, set the window's title;
BEL, BS, CR overwrite what was shown). Whatever a command prints is shown printable
(traces.errors.printable: each such character as its \\uXXXX escape): `printable_output`
filters what is written on stdout and stderr while a command runs
(`placer.commands.common.command`), and `console()`'s rich Console escapes every string it
renders before it adds its own styles and cursor moves (progress bars), writing past the
filter. On a terminal the filter passes whole SGR sequences (colours, `ESC [ ... m`), which
libraries print there (uvicorn's access log) and which move nothing.
"""

from __future__ import annotations

import contextlib
import functools
import io
import re
import sys
import time
from collections.abc import Iterator
from typing import Any

from traces.errors import printable

_SGR = re.compile(r"(\x1b\[[0-9;]*m)")


class PrintableStream(io.TextIOBase):
    """A text stream writing what it is given to `unfiltered`, printable (module docstring)."""

    def __init__(self, unfiltered: Any) -> None:
        self.unfiltered = unfiltered

    def write(self, text: str) -> int:
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        if self.isatty():
            shown = "".join(part if i % 2 else printable(part, lines=True)
                            for i, part in enumerate(_SGR.split(text)))
        else:
            shown = printable(text, lines=True)
        self.unfiltered.write(shown)
        return len(text)

    def flush(self) -> None:
        self.unfiltered.flush()

    def isatty(self) -> bool:
        return bool(getattr(self.unfiltered, "isatty", lambda: False)())

    def fileno(self) -> int:
        return self.unfiltered.fileno()

    def writable(self) -> bool:
        return True

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self.unfiltered, "encoding", None) or "utf-8"

    @property
    def errors(self) -> str | None:  # type: ignore[override]
        return getattr(self.unfiltered, "errors", None)


@contextlib.contextmanager
def printable_output() -> Iterator[None]:
    """sys.stdout and sys.stderr each filtered by a PrintableStream while the block runs
    (rich's consoles write past the filter: `console`, `unfiltered`)."""
    before = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = (stream if isinstance(stream, PrintableStream)
                              else PrintableStream(stream) for stream in before)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = before


def unfiltered(stream: Any) -> Any:
    """The stream a PrintableStream writes to (`stream` itself if it is none): where rich,
    which escapes its own strings, writes its styles and cursor moves."""
    return getattr(stream, "unfiltered", stream)


@functools.cache
def _console_class() -> type:
    from rich.console import Console

    class PrintableConsole(Console):
        """A rich Console that renders every string it is given printable (newlines and
        tabs kept), before its markup and styles."""

        def render_str(self, text: str, **kwargs: Any) -> Any:
            return super().render_str(printable(text, lines=True), **kwargs)

    return PrintableConsole


def console(**kwargs: Any) -> Any:
    """A rich Console on stdout (stderr with `stderr=True`), past printable_output's filter,
    that shows its strings printable (module docstring) and reads no markup in them: a name,
    a prompt or a generated text holding "[/bold]" is shown as written (rich would raise
    MarkupError), and styles are given as rich Text; `kwargs` are rich's."""
    kwargs.setdefault("markup", False)
    if "file" not in kwargs:
        kwargs["file"] = unfiltered(sys.stderr if kwargs.pop("stderr", False) else sys.stdout)
    return _console_class()(**kwargs)


class _Live:
    """A rich Progress on stderr with one task, built from `columns` (a no-op when not
    `enabled`: not a terminal, or --json); it refreshes from its own thread. `show(what)`
    names what is running now."""

    def __init__(self, enabled: bool, total: int | None, columns: Any) -> None:
        self.bar = None
        if enabled:
            from rich.progress import Progress

            self.bar = Progress(*columns(), console=console(stderr=True), transient=True)
            self.task = self.bar.add_task("", total=total)

    def __enter__(self) -> Any:
        if self.bar is not None:
            self.bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.stop()

    def show(self, what: str) -> None:
        if self.bar is not None:
            self.bar.update(self.task, description=what)


class ItemsBar(_Live):
    """`label` and the current item's description, a bar, `done/total` and the time elapsed;
    `show(what)` names the item now running, `advance()` counts one done."""

    def __init__(self, label: str, total: int, enabled: bool) -> None:
        def columns() -> tuple:
            from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn

            return (TextColumn(f"{label} {{task.description}}"), BarColumn(),
                    MofNCompleteColumn(), TimeElapsedColumn())

        super().__init__(enabled, total, columns)

    def advance(self) -> None:
        if self.bar is not None:
            self.bar.advance(self.task)


NO_BAR = ItemsBar("", 0, enabled=False)  # for callers that show no progress


class ItemLines:
    """ItemsBar's calls as lines on stderr, for when stderr is not a terminal (a log file):
    each `show(what)` prints `label [done/total] what (N s)`, the seconds since the start."""

    def __init__(self, label: str, total: int) -> None:
        self.label, self.total, self.done = label, total, 0
        self.start = time.monotonic()

    def __enter__(self) -> ItemLines:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def show(self, what: str) -> None:
        print(f"{self.label} [{self.done}/{self.total}] {what} "
              f"({time.monotonic() - self.start:.0f} s)", file=sys.stderr, flush=True)

    def advance(self) -> None:
        self.done += 1


class StageSpinner(_Live):
    """`label`, the stage now running, a spinner and the time elapsed beside the time limit;
    `stage(what)` is the callback a solver is given (it keeps time while SCIP or PDLP run:
    they release the GIL)."""

    def __init__(self, label: str, limit_s: float | None, enabled: bool) -> None:
        def columns() -> tuple:
            from rich.progress import SpinnerColumn, TextColumn, TimeElapsedColumn

            limit = f"(time limit {limit_s:g} s)" if limit_s else ""
            return (SpinnerColumn(), TextColumn(f"{label} {{task.description}}"),
                    TimeElapsedColumn(), TextColumn(limit))

        super().__init__(enabled, None, columns)
        self.stage = self.show
