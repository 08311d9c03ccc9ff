"""How a figure, an interval, a table and a summary line are shown: rich tables at most
TABLE_WIDTH columns wide, figures with the half-width of their 95% interval, plain aligned
columns for the summaries (which never wrap: each line fits TABLE_WIDTH)."""

from __future__ import annotations

import contextlib
import io
import sys
import textwrap
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table
from rich.text import Text

from placer.files import write_text_atomic
from placer.progress import console as printable_console
from placer.progress import printable
from placer.units import BYTE_UNITS

if TYPE_CHECKING:
    from placer.files import Inputs

PIPE_WIDTH = 1000  # columns of text when stdout is not a terminal: never cut
TABLE_WIDTH = 100  # columns a table or a summary line takes at most: cells wrap, never cut
SUMMARY_LINES = 25  # lines a command's closing summary takes, about
LABEL_WIDTH = 20  # a row label of a summary at most (a longer name is cut at its start)
MOST_ROWS = 12  # rows of a summary's table; the rest are in the full tables


def console() -> Console:
    """A rich Console on stdout: the terminal's width there, and wide enough that no table
    column or name is cut when the output goes to a file or a pipe (rich's default is 80)."""
    return printable_console() if sys.stdout.isatty() else printable_console(width=PIPE_WIDTH)


def bold(text: str) -> Text:
    """`text` in bold, printable and read as written (the consoles read no markup:
    placer.progress; a Text skips the console's printable filter, so it is applied here)."""
    return Text(printable(text, lines=True), style="bold")


def print_table(table: Table, out: Console | None = None) -> None:
    """Print `table` at most TABLE_WIDTH columns wide (the terminal's width if narrower): a
    cell too long for its column wraps onto further lines (folded inside a long path or
    number), nothing is cut."""
    out = out or console()
    for column in table.columns:
        column.overflow = "fold"
    out.print(table, width=min(out.width, TABLE_WIDTH))


def printed(show: Callable[[], None]) -> str:
    """What `show` prints on stdout, as a file gets it (no colour, lines up to PIPE_WIDTH)."""
    text = io.StringIO()
    with contextlib.redirect_stdout(text):
        show()
    return text.getvalue()


def finish(show: Callable[[], None], summary: Callable[[Path | None], list[str]],
           full: Path | None, *, verbose: bool = False, quiet: bool = False,
           inputs: Inputs = ()) -> None:
    """How solve and evaluate end: what `show` prints (the full tables) written to `full`
    (None: nowhere); then on stdout the `summary(full)` lines, or with `verbose` the full
    tables, or with `quiet` nothing (--json prints instead)."""
    if full is not None:
        write_text_atomic(printed(show), full, inputs)
    if verbose and not quiet:
        show()
    elif not quiet:
        console().print("\n".join(summary(full)), highlight=False, markup=False)


def beside(out: Path) -> Path | None:
    """The text file of the full tables beside the output `out`: plan.json -> plan.txt (a
    .txt output gets .txt.txt, never itself); None where `out` is no regular file
    (/dev/null, a pipe: nothing is written beside it)."""
    if not Path(out).is_file():
        return None
    return out.with_name(out.name + ".txt") if out.suffix == ".txt" else out.with_suffix(".txt")


def plus_minus(figures: dict, key: str, fmt: str = "{:.3f}", scale: float = 1.0) -> str:
    """"value ± half-width" of figure `key` and its 95% interval `<key>_ci95`, each times
    `scale`, in `fmt` ("value ± ?" where the interval is null: too little traffic)."""
    value, ci = fmt.format(figures[key] * scale), figures[f"{key}_ci95"]
    if ci is None:
        return f"{value} ± ?"
    low, high = ci
    return f"{value} ± {fmt.format((high - low) / 2 * scale)}"


def bytes_plus_minus(figures: dict, key: str) -> str:
    """A byte figure and the half-width of its 95% interval in one binary unit, chosen by the
    figure ("313.54 ± 2.10 MiB"; "± ?" where the interval is null)."""
    value = figures[key]
    unit, scale = next(((u, s) for u, s in BYTE_UNITS if abs(value) >= s), ("B", 1))
    ci = figures[f"{key}_ci95"]
    half = "?" if ci is None else f"{(ci[1] - ci[0]) / 2 / scale:.2f}"
    return f"{value / scale:.2f} ± {half} {unit}"


def span(ci: list[float] | None, fmt: str = "{:.3f}") -> str:
    """An interval [low, high] as "[low, high]" in `fmt`; "(no interval)" for null (in
    brackets rich would read it as markup and print nothing)."""
    if ci is None:
        return "(no interval)"
    return f"[{fmt.format(ci[0])}, {fmt.format(ci[1])}]"


def label(name: str, width: int = LABEL_WIDTH) -> str:
    """`name` in at most `width` columns: a longer one keeps its end ("…split/heldout")."""
    return name if len(name) <= width else "…" + name[-(width - 1):]


def columns(rows: Sequence[Sequence[str]], indent: str = "  ") -> list[str]:
    """Rows of cells as aligned lines: the first column left, the others right-aligned to
    their widest cell, two spaces apart."""
    if not rows:
        return []
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return [(indent + "  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                                for i, (c, w) in enumerate(zip(r, widths, strict=True)))
             ).rstrip() for r in rows]


def capped(rows: list[str], most: int = MOST_ROWS) -> list[str]:
    """The first `most` rows of a summary's table, and a line saying how many more there are
    in the full tables."""
    more = len(rows) - most
    return rows if more <= 0 else [*rows[:most], f"  ... {more} more rows in the full tables"]


def wrapped(text: str, indent: str = "  ") -> list[str]:
    """`text` as lines of at most TABLE_WIDTH columns, the continuations indented."""
    return textwrap.wrap(text, TABLE_WIDTH, subsequent_indent=indent,
                         break_long_words=True, break_on_hyphens=False) or [""]


def shell_lines(command: str) -> list[str]:
    """A shell command as lines of at most TABLE_WIDTH columns, continued with " \\": a line
    ends after each "&&" and wherever a word would pass the width (never inside quotes);
    pasted, it runs as the one line it was."""
    words, word, quote = [], "", None
    for ch in command:
        if quote is None and ch == " ":
            words.append(word)
            word = ""
            continue
        if ch in "'\"" and quote in (None, ch):
            quote = None if quote == ch else ch
        word += ch
    words.append(word)
    lines, line = [], ""
    for w in words:
        if line and (len(line) + 1 + len(w) > TABLE_WIDTH - 2 or line.endswith(" &&")):
            lines.append(line + " \\")
            line = "  " + w
        else:
            line = f"{line} {w}" if line else w
    return [*lines, line]
