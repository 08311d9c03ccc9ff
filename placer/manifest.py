"""The manifest of a placed directory: its JSON Schema (placer/schema/), validation, reading.

The schema file shipped in the package is the source of truth (docs/manifest.md explains
it); every manifest is validated against it when written and when read. jsonschema walks a
manifest at about 0.3 s per 128 experts, so a valid manifest is accepted by a predicate
compiled from the same schema (the handful of keywords it uses, with jsonschema's meaning),
and jsonschema itself runs only to name the error of one that fails it.
"""

from __future__ import annotations

import json
import numbers
import re
from collections.abc import Callable
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


Check = Callable[[object], bool]

_TYPES: dict[str, Check] = {  # as jsonschema's draft 2020-12 type checker has them
    "object": lambda x: isinstance(x, dict),
    "array": lambda x: isinstance(x, list),
    "string": lambda x: isinstance(x, str),
    "boolean": lambda x: isinstance(x, bool),
    "null": lambda x: x is None,
    "number": lambda x: isinstance(x, numbers.Number) and not isinstance(x, bool),
    "integer": lambda x: (isinstance(x, int) and not isinstance(x, bool))
    or (isinstance(x, float) and x.is_integer()),
}
_NOT_ASSERTIONS = {"$schema", "$id", "$comment", "$defs", "title", "description", "examples",
                   "default"}


def compile_schema(schema: dict | bool, root: dict) -> Check:
    """A predicate true exactly when an instance is valid under `schema` (draft 2020-12,
    local $refs into `root`); ValueError for a keyword it does not know, so that a schema
    using one is left to jsonschema."""
    if isinstance(schema, bool):
        return lambda x: schema
    if not isinstance(schema, dict):
        raise ValueError(f"not a schema: {schema!r}")
    checks = [_keyword(k, v, root) for k, v in schema.items() if k not in _NOT_ASSERTIONS]
    if len(checks) == 1:
        return checks[0]
    return lambda x: all(c(x) for c in checks)


def _keyword(key: str, value, root: dict) -> Check:
    """The check of one keyword; like jsonschema's, each ignores instances of other types."""
    if key == "type":
        kinds = [_TYPES[t] for t in ([value] if isinstance(value, str) else value)]
        return kinds[0] if len(kinds) == 1 else lambda x: any(k(x) for k in kinds)
    if key == "properties":
        props = [(k, compile_schema(v, root)) for k, v in value.items()]
        return lambda x: not isinstance(x, dict) or all(c(x[k]) for k, c in props if k in x)
    if key == "required":
        return lambda x: not isinstance(x, dict) or all(k in x for k in value)
    if key == "items":
        item = compile_schema(value, root)
        return lambda x: not isinstance(x, list) or all(item(v) for v in x)
    if key == "minimum":
        return lambda x: not _TYPES["number"](x) or x >= value
    if key == "pattern":
        regex = re.compile(value)
        return lambda x: not isinstance(x, str) or regex.search(x) is not None
    if key in ("const", "enum"):
        options = [value] if key == "const" else value
        if any(isinstance(o, list | dict) for o in options):
            raise ValueError(f"{key} of a structure")
        return lambda x: any(_equal(x, o) for o in options)
    if key == "oneOf":
        subs = [compile_schema(s, root) for s in value]
        return lambda x: sum(s(x) for s in subs) == 1
    if key == "$ref":
        if not value.startswith("#/"):
            raise ValueError(f"non-local $ref {value}")
        target = root
        for part in value[2:].split("/"):
            target = target[part.replace("~1", "/").replace("~0", "~")]
        return compile_schema(target, root)
    raise ValueError(f"keyword {key} is not supported")


def _equal(x: object, scalar: object) -> bool:
    """jsonschema's equality against a scalar: booleans are not the numbers 0 and 1."""
    if isinstance(x, bool) or isinstance(scalar, bool):
        return type(x) is type(scalar) and x == scalar
    return x == scalar


@cache
def _fast_check() -> Check | None:
    try:
        return compile_schema(manifest_schema(), manifest_schema())
    except (ValueError, KeyError, TypeError):
        return None


@cache
def _validator() -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(manifest_schema())


def validate_manifest(manifest: dict) -> None:
    """Raise PlacerError naming the first place where `manifest` breaks the schema."""
    fast = _fast_check()
    if fast is not None and fast(manifest):
        return
    error = min(_validator().iter_errors(manifest), key=lambda e: list(e.path), default=None)
    if error is not None:
        where = "/".join(str(p) for p in error.absolute_path) or "(top level)"
        raise PlacerError(f"manifest does not match its schema at {where}: {error.message}")


def read_manifest(path: Path) -> dict:
    """Read and validate a manifest (`path` is the placed directory or the manifest).
    PlacerError in one line when it is missing, not a file, unreadable, not UTF-8 JSON
    (RFC 8259; emit writes UTF-8) or not the schema."""
    path = Path(path)
    if path.is_dir():
        path = path / "manifest.json"
    if not path.is_file():
        raise PlacerError(f"no manifest at {path} (not a placed directory, or its emit did "
                          "not finish)")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:  # worded as the CLI words an OSError: "permission denied: PATH"
        raise PlacerError(f"{(exc.strerror or type(exc).__name__).lower()}: {path}") from None
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError
        raise PlacerError(f"{path}: not valid UTF-8 JSON ({exc})") from None
    validate_manifest(manifest)
    return manifest
