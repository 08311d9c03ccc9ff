"""`placer schema`: print the manifest's JSON Schema."""

from __future__ import annotations

import typer

from placer.commands.common import command, print_json


def register(app: typer.Typer) -> None:
    @command(app, "schema")
    def schema() -> None:
        """Print the JSON Schema every manifest.json is validated against (see
        docs/manifest.md)."""
        from placer.placed.manifest import manifest_schema

        print_json(manifest_schema())
