"""Progress on stderr for commands that run long: a bar over a known number of items
(ItemsBar), and a spinner naming the running stage of a solve, with its time elapsed beside
its time limit (StageSpinner; the solvers call its `stage` and never import placer)."""

from __future__ import annotations


class ItemsBar:
    """`label` and the current item's description, a bar and `done/total` on stderr; a no-op
    when not `enabled` (not a terminal, or --json). `show(what)` names the item now running,
    `advance()` counts one done."""

    def __init__(self, label: str, total: int, enabled: bool) -> None:
        self.bar = None
        if enabled:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
            )

            self.bar = Progress(TextColumn(f"{label} {{task.description}}"), BarColumn(),
                                MofNCompleteColumn(), TimeElapsedColumn(),
                                console=Console(stderr=True), transient=True)
            self.task = self.bar.add_task("", total=total)

    def __enter__(self) -> ItemsBar:
        if self.bar is not None:
            self.bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.stop()

    def show(self, what: str) -> None:
        if self.bar is not None:
            self.bar.update(self.task, description=what)

    def advance(self) -> None:
        if self.bar is not None:
            self.bar.advance(self.task)


NO_BAR = ItemsBar("", 0, enabled=False)  # for callers that show no progress


class StageSpinner:
    """`label`, the stage now running, a spinner and the time elapsed "of LIMIT s" on stderr
    (a no-op when not `enabled`); `stage(what)` is the callback a solver is given. The
    display refreshes from its own thread, so it keeps time while SCIP or PDLP run."""

    def __init__(self, label: str, limit_s: float | None, enabled: bool) -> None:
        self.bar = None
        if enabled:
            from rich.console import Console
            from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

            limit = f"(time limit {limit_s:g} s)" if limit_s else ""
            self.bar = Progress(SpinnerColumn(), TextColumn(f"{label} {{task.description}}"),
                                TimeElapsedColumn(), TextColumn(limit),
                                console=Console(stderr=True), transient=True)
            self.task = self.bar.add_task("", total=None)

    def __enter__(self) -> StageSpinner:
        if self.bar is not None:
            self.bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.stop()

    def stage(self, what: str) -> None:
        if self.bar is not None:
            self.bar.update(self.task, description=what)
