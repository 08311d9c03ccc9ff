"""A probe's figures written into the spec's own text (`placer probe --step|--host --out`):
only the tables it measured are rewritten, with their comments; every other line (the
comments `hardware new` writes beside each figure, a user's notes) is kept as it was.

A table's lines are its header, the lines up to the next header, and the comment block right
above its header (`hardware new` writes a table's notes there); the comment block right above
the next header is that table's. `[decode]` is rewritten whole for a step, `[host]` and its
`[[host.expert]]` tables for the host; the top-level `estimated = [...]` is rewritten (or
added above the first table) to the spec's list.

The text is TOML, edited by lines: where the spec's tables are not written as headers (a
`decode = { ... }` inline table, dotted keys) or the edited text does not load back to the
very spec, the spec is written afresh by spec_toml instead, and `updated_text` says so.
"""

from __future__ import annotations

import re

from placer.errors import PlacerError
from placer.hardware.spec import HardwareSpec, spec_of_text
from placer.hardware.spec_toml import (
    ESTIMATED_COMMENT,
    decode_lines,
    estimated_line,
    host_lines,
    spec_toml,
)

HEADER = re.compile(r"\s*\[\[?\s*([A-Za-z0-9_.\"' -]+?)\s*\]\]?\s*(#.*)?$")
ESTIMATED = re.compile(r"\s*estimated\s*=")


def updated_text(text: str, spec: HardwareSpec, source: str, *, step_note: str | None = None,
                 host_note: str | None = None) -> tuple[str, bool]:
    """`text` (the spec file read from `source`) with `spec`'s `[decode]` (where `step_note`
    is given: the comment beside base_step_ms) and `[host]` (where `host_note` is: the
    comment above it) and its `estimated` list written in; False with spec_toml's text where
    the lines could not be edited (module docstring)."""
    lines = text.splitlines()
    if step_note is not None:
        lines = _replaced(lines, ("decode",), decode_lines(spec, step_note), must=True)
    if host_note is not None and spec.host is not None:
        lines = _replaced(lines, ("host", "host.expert"), host_lines(spec.host, host_note))
    if lines is not None:
        lines = _with_estimated(lines, spec)
    if lines is not None:
        edited = "\n".join(lines) + "\n"
        try:
            if spec_of_text(edited, source) == spec:
                return edited, True
        except PlacerError:
            pass
    return spec_toml(spec, step_note or "", host_note or ""), False


def _headers(lines: list[str]) -> list[tuple[int, str]]:
    """(line, table name) of every table header outside a multi-line value."""
    found, depth = [], 0
    for i, line in enumerate(lines):
        if depth == 0 and (m := HEADER.fullmatch(line)):
            found.append((i, m.group(1).replace(" ", "").replace('"', "").replace("'", "")))
            continue
        depth += _nesting(line)
    return found


def _nesting(line: str) -> int:
    """How many more brackets and braces `line` opens than it closes, outside its strings
    and comment."""
    count, quote, i = 0, "", 0
    while i < len(line):
        ch = line[i]
        if quote:
            if ch == "\\" and quote == '"':
                i += 1
            elif ch == quote:
                quote = ""
        elif ch in "\"'":
            quote = ch
        elif ch == "#":
            break
        elif ch in "[{":
            count += 1
        elif ch in "]}":
            count -= 1
        i += 1
    return count


def _spans(lines: list[str]) -> list[tuple[int, int, str]]:
    """(first line, end line, name) of every table: its leading comment block, header and
    body, up to the next table's leading comment block (trailing blank lines left out)."""
    heads = _headers(lines)
    starts = [_lead(lines, i) for i, _ in heads]
    spans = []
    for k, (_, name) in enumerate(heads):
        end = starts[k + 1] if k + 1 < len(heads) else len(lines)
        while end > heads[k][0] + 1 and not lines[end - 1].strip():
            end -= 1
        spans.append((starts[k], end, name))
    return spans


def _lead(lines: list[str], header: int) -> int:
    """The first line of the comment block right above the header at `header`."""
    first = header
    while first > 0 and lines[first - 1].lstrip().startswith("#"):
        first -= 1
    return first


def _replaced(lines: list[str] | None, names: tuple[str, ...], new: list[str], *,
              must: bool = False) -> list[str] | None:
    """`lines` with the tables named `names` replaced by `new` where the first of them was
    (appended where there is none; None where `must` and there is none)."""
    if lines is None:
        return None
    spans = [(a, b) for a, b, name in _spans(lines) if name in names]
    if not spans:
        return None if must else [*lines, "", *new]
    out = lines[:spans[0][0]] + new
    for (_, end), (start, _) in zip(spans, [*spans[1:], (len(lines), 0)], strict=True):
        out += lines[end:start]
    return out


def _with_estimated(lines: list[str], spec: HardwareSpec) -> list[str] | None:
    """`lines` with the top-level `estimated` list the spec's (added, with its comment,
    above the first table where it is missing and the spec has any); None where it spans
    lines (a multi-line array)."""
    heads = _headers(lines)
    first = heads[0][0] if heads else len(lines)
    at = next((i for i in range(first) if ESTIMATED.match(lines[i])), None)
    if at is None:
        if not spec.estimated:
            return lines
        top = _lead(lines, first)
        while top > 0 and not lines[top - 1].strip():
            top -= 1
        return [*lines[:top], *ESTIMATED_COMMENT, estimated_line(spec), *lines[top:]]
    if _nesting(lines[at]):
        return None
    return [*lines[:at], estimated_line(spec), *lines[at + 1:]]
