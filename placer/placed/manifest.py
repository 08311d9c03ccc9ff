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
import os
import re
from collections.abc import Callable
from functools import cache
from importlib import resources
from pathlib import Path

import jsonschema

from placer.checkpoint.inventory import Inventory
from placer.errors import PlacerError
from placer.placed.layout import Entry, expert_starts
from placer.plan.format import MANIFEST_FORMAT, MANIFEST_VERSION
from placer.plan.placement import Plan
from placer.plan.seal import check_seal, manifest_text, seal_manifest
from traces.formats.bounded import read_bounded
from traces.formats.jsontext import loads_json


@cache
def manifest_schema() -> dict:
    """The manifest's JSON Schema (draft 2020-12)."""
    text = resources.files("placer.placed").joinpath("schema/manifest.schema.json").read_text()
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
    if key == "minItems":
        return lambda x: not isinstance(x, list) or len(x) >= value
    if key == "maxItems":
        return lambda x: not isinstance(x, list) or len(x) <= value
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
        expected = error.schema.get("description") if error.validator == "pattern" else None
        raise PlacerError(f"manifest does not match its schema at {where}: {error.message}"
                          + (f" (expected: {expected})" if expected else ""))


def read_manifest(path: Path) -> dict:
    """Read and validate a manifest (`path` is the placed directory or the manifest).
    PlacerError in one line when it is missing, not a file, unreadable, not UTF-8 JSON
    (RFC 8259; emit writes UTF-8), not the bytes its digest covers (placer.plan.seal:
    checked before anything else) or not the schema."""
    path = Path(path)
    if path.is_dir():
        path = path / "manifest.json"
    if not path.is_file():
        raise PlacerError(f"no manifest at {path} (not a placed directory, or its emit did "
                          "not finish)")
    raw = read_bounded(path, "manifest", error=PlacerError)
    manifest = loads_json(raw, str(path), PlacerError)
    check_seal(raw, manifest, str(path))  # first: nothing else reads bytes changed after emit
    try:
        validate_manifest(manifest)
    except PlacerError as exc:
        raise PlacerError(f"{path}: {exc}") from None
    return manifest


def write_manifest(manifest: dict, path: Path) -> None:
    """Write the manifest (strict JSON) into the staging directory and fsync it: no temporary
    name is needed there, nothing reads the directory before it is put in place."""
    with open(path, "w") as f:
        f.write(manifest_text(manifest))
        f.flush()
        os.fsync(f.fileno())



def build_manifest(plan: Plan, inv: Inventory, model_dir: Path, laid: list, outputs: list,
                   align: int, source_sha: dict[str, str]) -> dict:
    """The plan plus where every byte landed (see docs/manifest.md), sealed with its digest
    (placer.plan.seal); `source_sha` is the sha256 of every source file and config.json,
    by name."""
    pieces: dict[tuple[int, int], list[dict]] = {}
    for f, _, entries in laid:
        for e in entries:
            if e.owner is not None:
                pieces.setdefault(e.owner, []).extend(entry_pieces(f.name, e))
    d = plan.to_json()
    d["format"], d["version"] = MANIFEST_FORMAT, MANIFEST_VERSION
    d["source"] = {"dir": str(model_dir.resolve()),
                   "files": [{"name": s.name, "size": s.size, "sha256": source_sha[s.name]}
                             for s in inv.files]
                   + [{"name": "config.json", "size": (model_dir / "config.json").stat().st_size,
                       "sha256": source_sha["config.json"]}]}
    d["align"] = align
    d["files"] = outputs
    d["dense"] = [{"name": t.name, "file": t.file, "offset": t.offset, "length": t.length,
                   "dtype": t.dtype, "shape": list(t.shape),
                   "cards": [c.index for c in plan.cards]} for t in inv.dense_tensors]
    for ed, ep in zip(d["experts"], plan.experts, strict=True):
        ex = inv.expert(ep.layer, ep.expert)
        ed["tensors"] = expert_tensors(ex)
        mine = sorted(pieces.get((ep.layer, ep.expert), []), key=lambda p: p["stream"])
        cold = [p for p in mine if p["stream"] >= ep.resident_bytes]
        ed["cold"] = None if not cold else {
            "file": cold[0]["file"], "tensor": cold[0]["tensor"], "offset": cold[0]["offset"],
            "length": ep.bytes - ep.resident_bytes}
        for pd in ed["pages"]:
            lo, hi = pd["offset"], pd["offset"] + pd["length"]
            pd["pieces"] = [_clip(p, lo, hi) for p in mine
                            if p["stream"] < hi and p["stream"] + p["length"] > lo]
    seal_manifest(d)
    return d


def expert_tensors(ex) -> list[dict]:
    """The `tensors` of inventory expert `ex` as the manifest records them."""
    return [{"name": t.name, "dtype": t.dtype, "shape": list(t.shape), "stream_offset": pos,
             "length": t.length, "source_file": t.file, "source_offset": t.offset,
             "fused_shape": list(t.fused_shape) if t.fused_shape else None,
             "tensor_offset": t.tensor_offset}
            for t, pos in zip(ex.tensors, expert_starts(ex), strict=True)]


def entry_pieces(file: str, e: Entry) -> list[dict]:
    """One piece per source segment of an output tensor, with its expert-stream offset."""
    out, start = [], 0
    for s in e.segments:
        out.append({"file": file, "tensor": e.name, "start": start, "offset": e.offset + start,
                    "length": s.length, "stream": e.stream + start,
                    "origin": {"tensor": s.tensor, "source_file": s.file, "dtype": s.dtype,
                               "shape": list(s.shape), "start": s.start}})
        start += s.length
    return out


def _clip(p: dict, lo: int, hi: int) -> dict:
    """Piece `p` cut to stream range [lo, hi) (pages never straddle an output tensor, but a
    whole tensor may hold several pages of a fully resident expert)."""
    a, b = max(lo, p["stream"]), min(hi, p["stream"] + p["length"])
    cut = a - p["stream"]
    return {"file": p["file"], "tensor": p["tensor"], "start": p["start"] + cut,
            "offset": p["offset"] + cut, "length": b - a,
            "origin": {**p["origin"], "start": p["origin"]["start"] + cut}}
