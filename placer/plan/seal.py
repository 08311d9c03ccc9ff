"""The manifest's digest of itself: what emit writes into manifest.json so that any change to
its bytes after emit is found before anything trusts them (docs/manifest.md, "Digest").

`digest.value` is the sha256 of the bytes of manifest.json with every occurrence of those
64 hex digits written as 64 ASCII zeros: a loader in any language recomputes it from the
file alone, with no JSON canonicalization. `digest.fields` holds, for every other top-level
field, the sha256 of its canonical JSON (`canonical`): placer's aid to name which field
differs when the bytes do; a loader may ignore it.
"""

from __future__ import annotations

import hashlib
import json
import re

from placer.errors import PlacerError
from placer.files import dumps_json
from placer.plan.format import MANIFEST_FORMAT, MANIFEST_VERSION

ALGORITHM = "sha256"
PLACEHOLDER = "0" * 64
_HEX = re.compile(r"[0-9a-f]{64}")
_NAMED = 4  # fields a changed manifest names at most (then "and N more")


def manifest_text(manifest: dict) -> str:
    """The exact text of manifest.json for `manifest` (what the digest covers)."""
    return dumps_json(manifest) + "\n"


def canonical(value: object) -> bytes:
    """The canonical JSON of a parsed value: keys sorted, no whitespace, non-ASCII escaped
    (Python's json.dumps with sort_keys=True, separators=(",", ":"), ensure_ascii=True)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True
                      ).encode("ascii")


def field_digests(manifest: dict) -> dict[str, str]:
    """sha256 of the canonical JSON of every top-level field but `digest`."""
    return {k: hashlib.sha256(canonical(v)).hexdigest() for k, v in manifest.items()
            if k != "digest"}


def seal_manifest(manifest: dict) -> None:
    """Set `manifest["digest"]` (last) so that manifest_text(manifest) proves itself."""
    manifest.pop("digest", None)
    as_read = json.loads(dumps_json(manifest))  # the fields as a reader parses them
    manifest["digest"] = digest = {"algorithm": ALGORITHM, "fields": field_digests(as_read),
                                   "value": PLACEHOLDER}
    digest["value"] = hashlib.sha256(manifest_text(manifest).encode()).hexdigest()


def file_digest(raw: bytes, value: str) -> str:
    """sha256 of manifest bytes `raw` with every occurrence of `value` written as zeros."""
    return hashlib.sha256(raw.replace(value.encode("ascii"), PLACEHOLDER.encode())).hexdigest()


def check_seal(raw: bytes, manifest: object, where: str) -> None:
    """Raise a one-line PlacerError naming `where` (the manifest's path) and the field when
    the parsed `manifest` read from bytes `raw` carries no well-formed digest or its bytes
    are not those the digest covers."""
    if not isinstance(manifest, dict):
        raise PlacerError(f"{where}: expected a JSON object (a placer manifest), got "
                          f"{_kind(manifest)}")
    if "digest" not in manifest:
        version = manifest.get("version")
        if manifest.get("format") == MANIFEST_FORMAT and version in (1, 2):
            raise PlacerError(f"{where}: a version {version} manifest, written before "
                              "manifests carried their own digest: re-emit the placement "
                              "(placer emit --force writes it again)")
        raise PlacerError(f"{where}: digest: missing (placer emit writes one into every "
                          f"version {MANIFEST_VERSION} manifest): the file was changed after "
                          "emit, or is not a placer manifest")
    digest = manifest["digest"]
    if not isinstance(digest, dict):
        raise PlacerError(f"{where}: digest: expected an object (algorithm, fields, value), "
                          f"got {_kind(digest)}")
    if digest.get("algorithm") != ALGORITHM:
        raise PlacerError(f"{where}: digest.algorithm: expected {ALGORITHM!r}, got "
                          f"{_kind(digest.get('algorithm'))}")
    value, fields = digest.get("value"), digest.get("fields")
    if not isinstance(value, str) or not _HEX.fullmatch(value):
        raise PlacerError(f"{where}: digest.value: expected 64 lowercase hex digits, got "
                          f"{_kind(value)}")
    if not isinstance(fields, dict):
        raise PlacerError(f"{where}: digest.fields: expected an object, got {_kind(fields)}")
    if file_digest(raw, value) == value:
        return
    changed = _changed(field_digests(manifest), fields)
    if changed:
        raise PlacerError(f"{where}: changed after emit (its sha256 is not digest.value): "
                          f"{changed}; re-emit the placement, or restore the file")
    raise PlacerError(f"{where}: changed after emit: its sha256 is not digest.value, though "
                      "every field reads as digest.fields records (reformatted, or the digest "
                      "itself changed); re-emit the placement, or restore the file")


def _changed(found: dict[str, str], recorded: dict) -> str:
    """The fields whose digest differs from the one recorded, named in one line ("" for
    none): "experts differs", "predicted is missing, predictee was added"."""
    parts = []
    for name in sorted(set(found) | set(recorded), key=str):
        shown = name if re.fullmatch(r"[A-Za-z0-9_]{1,40}", name) else _kind(name)
        if name not in found:
            parts.append(f"field {shown} is missing")
        elif name not in recorded:
            parts.append(f"field {shown} was added")
        elif recorded[name] != found[name]:
            parts.append(f"field {shown} differs from digest.fields.{shown}" if shown == name
                         else f"field {shown} differs from its digest.fields entry")
    more = f", and {len(parts) - _NAMED} more" if len(parts) > _NAMED else ""
    return ", ".join(parts[:_NAMED]) + more


def _kind(value: object) -> str:
    """What was found, in a few characters of one line."""
    if value is None:
        return "null"
    if isinstance(value, list | dict):
        return f"{type(value).__name__} of {len(value)}"
    return f"{type(value).__name__} {json.dumps(value, ensure_ascii=True)[:40]}"
