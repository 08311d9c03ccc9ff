"""Placeholder until this command group lands."""

import typer


def register(app: typer.Typer) -> None:
    """Register nothing yet."""
