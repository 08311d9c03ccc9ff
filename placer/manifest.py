"""The manifest of a placed directory: its JSON Schema (placer/schema/), validation, reading.

The schema file shipped in the package is the source of truth (docs/manifest.md explains
it); every manifest is validated against it when written and when read.
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from pathlib import Path

import jsonschema

from placer.errors import PlacerError

MANIFEST_FORMAT = "placer-manifest"


@cache
def manifest_schema() -> dict:
    """The manifest's JSON Schema (draft 2020-12)."""
    text = resources.files("placer").joinpath("schema/manifest.schema.json").read_text()
    return json.loads(text)


def validate_manifest(manifest: dict) -> None:
    """Raise PlacerError naming the first place where `manifest` breaks the schema."""
    validator = jsonschema.Draft202012Validator(manifest_schema())
    error = next(iter(sorted(validator.iter_errors(manifest), key=lambda e: list(e.path))),
                 None)
    if error is not None:
        where = "/".join(str(p) for p in error.absolute_path) or "(top level)"
        raise PlacerError(f"manifest does not match its schema at {where}: {error.message}")


def read_manifest(path: Path) -> dict:
    """Read and validate a manifest (`path` is the placed directory or the manifest)."""
    path = Path(path)
    if path.is_dir():
        path = path / "manifest.json"
    if not path.is_file():
        raise PlacerError(f"no manifest at {path} (not a placed directory, or its emit did "
                          "not finish)")
    try:
        manifest = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise PlacerError(f"{path}: not valid JSON ({exc})") from None
    validate_manifest(manifest)
    return manifest
