"""What every command shares: the domain-error boundary, option values checked, JSON printing
(the tables and figures are placer.report's)."""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer

from placer.errors import PlacerError, error_text, interrupted_by
from placer.files import NAME_MAX, dumps_json
from placer.progress import printable_output
from solvers.errors import SolverError
from traces.errors import TraceError
from traces.options import check_rules

try:  # typer 0.2x carries its own copy of click (see placer.commands.app)
    from typer._click.globals import get_current_context
except ImportError:  # pragma: no cover - a typer that uses click itself
    from click import get_current_context

# The filesystem's refusals (a missing, unreadable or read-only path, a full disk, a name
# too long) are the user's to fix, worded as the OS words them: "permission denied: PATH".
DOMAIN_ERRORS = (PlacerError, TraceError, SolverError, OSError)
PATH_MAX = 4096  # bytes in a path on Linux, its terminating NUL included
MAX_INT = 2**63 - 1  # no option counts past an int64


def command(app: typer.Typer, name: str, **kwargs: Any) -> Callable[[Callable], Callable]:
    """Register `fn` as `placer NAME`: its option values checked first (check_values, then
    the table of option rules, traces.options); a domain error becomes one line on stderr
    and exit 1; an interrupt (SIGINT, or SIGTERM: `placer.commands.app` raises it as one)
    one line and exit 130 (143 for SIGTERM, the shell's 128 + signal number), after the
    command has cleaned up."""

    def decorate(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kw: Any) -> Any:
            try:
                check_values(kw)
                check_repeats(kw)
                check_rules(kw, name, name_of=option_name, error=PlacerError)
                with printable_output():  # what the command prints, shown printable
                    return fn(*args, **kw)
            except DOMAIN_ERRORS as exc:
                fail(error_line(exc, kw), exc)
            except KeyboardInterrupt as exc:
                signal_name, status = interrupted_by(exc)
                fail(f"interrupted by {signal_name}; nothing partial was left behind", exc,
                     status)

        app.command(name, **kwargs)(wrapper)
        return fn

    return decorate


def fail(message: str, cause: BaseException, code: int = 1) -> None:
    """Print `error: message` on stderr and exit with `code` (1: a domain error)."""
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code) from cause


def error_line(exc: Exception, values: dict[str, Any] | None = None) -> str:
    """A domain error as one line (placer.errors.error_text: what it quotes of `values` cut,
    control characters escaped); an OSError as the OS words it, naming its path."""
    if isinstance(exc, OSError):
        reason = (exc.strerror or str(exc) or type(exc).__name__).lower()
        return error_text(f"{reason}: {exc.filename}" if exc.filename else reason, values or {})
    return error_text(" ".join(str(exc).split()) or type(exc).__name__, values or {})


def check_values(values: dict[str, Any]) -> None:
    """Refuse what no option means, before any command runs: an integer past int64, a float
    that is not finite (NaN, inf), a path longer than PATH_MAX or with a component longer than
    NAME_MAX. Each is named by its option."""
    for name, value in values.items():
        for item in value if isinstance(value, list | tuple) else [value]:
            problem = _value_problem(item)
            if problem:
                raise PlacerError(f"{option_name(name)}: {problem}")


def check_repeats(values: dict[str, Any]) -> None:
    """Refuse a trace directory given twice to --traces (by any path to it): its sequences
    would count twice in a solve or an evaluation (and in its folds)."""
    seen: dict[str, Path] = {}
    for path in values.get("traces") or ():
        key = os.path.realpath(path)
        if key in seen:
            raise PlacerError(f"{option_name('traces')} {path}: given twice (as {seen[key]} "
                              "too): its sequences would count twice; give each trace "
                              "directory once")
        seen[key] = path


def _value_problem(value: Any) -> str | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int) and abs(value) > MAX_INT:
        return f"expected an integer of at most {MAX_INT}, got {value}"
    if isinstance(value, float) and not math.isfinite(value):
        return f"expected a finite number, got {value}"
    if isinstance(value, Path):
        raw = os.fsencode(value)
        if len(raw) >= PATH_MAX or any(len(part) > NAME_MAX for part in raw.split(b"/")):
            return (f"a path of {len(raw)} bytes (at most {PATH_MAX - 1}, {NAME_MAX} per name): "
                    f"{str(value)[:60]}...")
    return None


def option_name(name: str) -> str:
    """How the user typed the parameter `name` of the running command (--out, PLACED)."""
    ctx = get_current_context(silent=True)
    for param in ctx.command.params if ctx is not None else ():
        if param.name == name:
            return (param.opts[0] if param.param_type_name == "option"
                    else (getattr(param, "metavar", None) or param.name.upper()))
    return f"--{name.replace('_', '-')}"


def print_json(obj: Any) -> None:
    """Print `obj` as indented strict JSON on stdout (the `--json` contract for scripts:
    NaN and inf print as null)."""
    typer.echo(dumps_json(obj, indent=2))


def parse_list(text: str, kind: type, what: str) -> list:
    """A comma-separated option value ("1,8") as a list of `kind`."""
    try:
        values = [kind(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise PlacerError(f"{what}: cannot read {text!r} as a comma-separated list") from None
    if not values:
        raise PlacerError(f"{what}: empty list")
    return values
