"""Placeholder until the collect/traces commands land (owned by the traces work)."""

import typer


def register(app: typer.Typer) -> None:
    """Register nothing yet."""
