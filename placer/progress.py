"""A rich progress bar on stderr over a known number of items, for commands that run long."""

from __future__ import annotations


class ItemsBar:
    """`label` and the current item's description, a bar and `done/total` on stderr; a no-op
    when not `enabled` (not a terminal, or --json). `show(what)` names the item now running,
    `advance()` counts one done."""

    def __init__(self, label: str, total: int, enabled: bool) -> None:
        self.bar = None
        if enabled:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

            self.bar = Progress(TextColumn(f"{label} {{task.description}}"), BarColumn(),
                                MofNCompleteColumn(), console=Console(stderr=True),
                                transient=True)
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
