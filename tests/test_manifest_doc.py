"""docs/manifest.md against the schema, the source of truth."""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema

from placer.placed.manifest import manifest_schema

DOC = Path(__file__).resolve().parent.parent / "docs" / "manifest.md"


def property_names(schema: dict) -> set[str]:
    names = set()
    if isinstance(schema, dict):
        names |= set(schema.get("properties", {}))
        for value in schema.values():
            names |= property_names(value)
    elif isinstance(schema, list):
        for value in schema:
            names |= property_names(value)
    return names


def test_doc_names_every_schema_field() -> None:
    text = DOC.read_text()
    missing = sorted(n for n in property_names(manifest_schema()) if f"`{n}`" not in text)
    assert not missing, f"docs/manifest.md does not document: {missing}"


def test_doc_example_validates_against_the_expert_schema() -> None:
    blocks = re.findall(r"```json\n(.*?)```", DOC.read_text(), flags=re.S)
    assert blocks
    expert = manifest_schema()["properties"]["experts"]["items"]
    resolver_schema = {**expert, "$defs": manifest_schema()["$defs"]}
    for block in blocks:
        jsonschema.validate(json.loads(block), resolver_schema)


def test_doc_names_the_output_tensor_patterns() -> None:
    text = DOC.read_text()
    for pattern in ("res.L<layer>.E<expert>.P<page>", "cold.L<layer>.E<expert>", "pad.<n>"):
        assert pattern in text
