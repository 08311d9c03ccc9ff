"""What every command shares: the domain-error boundary, JSON printing and how a figure with
its 95% interval is shown."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

import typer
from rich.console import Console

from placer.checkpoint.inventory import Inventory
from placer.errors import PlacerError
from placer.files import dumps_json
from solvers.errors import SolverError
from traces.collect import ModelIdentity
from traces.errors import TraceError

DOMAIN_ERRORS = (PlacerError, TraceError, SolverError, FileNotFoundError, PermissionError,
                 IsADirectoryError, NotADirectoryError)  # OSErrors that name a bad path
PIPE_WIDTH = 1000  # columns of tables and text when stdout is not a terminal: never cut


def command(app: typer.Typer, name: str, **kwargs: Any) -> Callable[[Callable], Callable]:
    """Register `fn` as `placer NAME`; a domain error becomes one line on stderr and exit 1."""

    def decorate(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kw: Any) -> Any:
            try:
                return fn(*args, **kw)
            except DOMAIN_ERRORS as exc:
                message = str(exc)
                if isinstance(exc, OSError) and exc.filename:  # "permission denied: PATH"
                    message = f"{(exc.strerror or type(exc).__name__).lower()}: {exc.filename}"
                typer.echo(f"error: {message}", err=True)
                raise typer.Exit(1) from exc

        app.command(name, **kwargs)(wrapper)
        return fn

    return decorate


def console() -> Console:
    """A rich Console on stdout: the terminal's width there, and wide enough that no table
    column or name is cut when the output goes to a file or a pipe (rich's default is 80)."""
    return Console() if sys.stdout.isatty() else Console(width=PIPE_WIDTH)


def print_json(obj: Any) -> None:
    """Print `obj` as indented strict JSON on stdout (the `--json` contract for scripts:
    NaN and inf print as null)."""
    typer.echo(dumps_json(obj, indent=2))


def plus_minus(figures: dict, key: str, fmt: str = "{:.3f}", scale: float = 1.0) -> str:
    """"value ± half-width" of figure `key` and its 95% interval `<key>_ci95`, each times
    `scale`, in `fmt`."""
    low, high = figures[f"{key}_ci95"]
    return f"{fmt.format(figures[key] * scale)} ± {fmt.format((high - low) / 2 * scale)}"


def span(ci: list[float], fmt: str = "{:.3f}") -> str:
    """An interval [low, high] as "[low, high]" in `fmt`."""
    return f"[{fmt.format(ci[0])}, {fmt.format(ci[1])}]"


def parse_list(text: str, kind: type, what: str) -> list:
    """A comma-separated option value ("1,8") as a list of `kind`."""
    try:
        values = [kind(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise PlacerError(f"{what}: cannot read {text!r} as a comma-separated list") from None
    if not values:
        raise PlacerError(f"{what}: empty list")
    return values


def model_identity(inv: Inventory) -> ModelIdentity:
    """What traces record about the model of `inv` (fingerprint, layers, experts, top-k)."""
    return ModelIdentity(fingerprint=inv.fingerprint, num_layers=inv.num_layers,
                         moe_layers=tuple(inv.moe_layers),
                         experts_per_layer=inv.experts_per_layer, top_k=inv.top_k)
