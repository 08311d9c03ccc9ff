"""Progress on stderr for commands that run long: a bar over a known number of items
(ItemsBar), and a spinner naming the running stage of a solve, with its time elapsed beside
its time limit (StageSpinner; the solvers call its `stage` and never import placer)."""

from __future__ import annotations

from typing import Any


class _Live:
    """A rich Progress on stderr with one task, built from `columns` (a no-op when not
    `enabled`: not a terminal, or --json); it refreshes from its own thread. `show(what)`
    names what is running now."""

    def __init__(self, enabled: bool, total: int | None, columns: Any) -> None:
        self.bar = None
        if enabled:
            from rich.console import Console
            from rich.progress import Progress

            self.bar = Progress(*columns(), console=Console(stderr=True), transient=True)
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
