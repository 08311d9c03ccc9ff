"""Reading JSON that anyone may have written (configs, headers, manifests, replies, dumps).

`json.loads` turns two kinds of hostile text into errors that are not JSONDecodeError, or
into values nothing downstream expects: nesting a few thousand levels deep (RecursionError,
or a structure later code recurses into) and integers of thousands of digits (ValueError past
4300 digits; below that, numbers no array or file offset can hold). `loads_json` refuses
both, and bad UTF-8, with one error naming where the text came from; every JSON reader of
traces/ and placer/ goes through it. (`NaN` and `Infinity` are read as Python reads them:
every reader checks its numbers' types and ranges and names the field that holds one.)
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

from traces.errors import TraceError
from traces.formats.bounded import bounded_lines

MAX_DEPTH = 64        # containers inside containers; placer's own files need fewer than 10
MAX_INT_DIGITS = 20   # every integer below 10**20 (2**64 has 20 digits)


class _Refused(ValueError):
    pass


def _int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise _Refused(f"an integer of {len(text.lstrip('-'))} digits (at most "
                       f"{MAX_INT_DIGITS})")
    return int(text)


def loads_json(data: str | bytes, where: str, error: type[ValueError] = TraceError,
               object_pairs_hook: Callable | None = None) -> object:
    """The JSON value in `data` (UTF-8 when bytes); `error(f"{where}: ...")` when it is not
    JSON, not UTF-8, nested deeper than MAX_DEPTH, or holds an integer of more than
    MAX_INT_DIGITS digits. Exceptions of `object_pairs_hook` other than ValueError pass
    through."""
    if isinstance(data, bytes | bytearray):
        data = decode_utf8(data, where, error)
    try:
        value = json.loads(data, parse_int=_int, object_pairs_hook=object_pairs_hook)
    except _Refused as exc:
        raise error(f"{where}: {exc}") from None
    except RecursionError:
        raise error(f"{where}: nested deeper than {MAX_DEPTH} levels") from None
    except ValueError as exc:  # JSONDecodeError
        raise error(f"{where}: not valid JSON ({exc})") from None
    if depth(value) > MAX_DEPTH:
        raise error(f"{where}: nested deeper than {MAX_DEPTH} levels")
    return value


def decode_utf8(raw: bytes, where: str, error: type[ValueError] = TraceError,
                offset: int = 0) -> str:
    """`raw` as UTF-8 text; `error(f"{where}: ...")` naming the first byte that is not UTF-8
    and its offset (`offset`: where `raw` starts in its file)."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{where}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at byte offset "
                    f"{offset + exc.start})") from None


def jsonl_lines(path: Path, where: Callable[[int], str] | None = None, kind: str = "jsonl"
                ) -> Iterator[tuple[int, str]]:
    """(line number, text) of every non-blank line of the JSONL file `path`; a TraceError
    naming the line (`where(number)`, default PATH:NUMBER) and the byte offset in the file of
    the first byte that is not UTF-8, or of a line longer than traces.formats.bounded.LINE_LIMITS
    allows a file of `kind`."""
    for number, offset, raw in bounded_lines(path, kind, where):
        name = where(number) if where is not None else f"{path}:{number}"
        text = decode_utf8(raw, name, offset=offset)
        if text.strip():
            yield number, text


def depth(value: object) -> int:
    """How many containers deep `value` is (a scalar: 0), without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        children = item.values() if isinstance(item, dict) else item \
            if isinstance(item, list) else None
        if children is None:
            continue
        deepest = max(deepest, level)
        if level <= MAX_DEPTH:
            stack.extend((child, level + 1) for child in children
                         if isinstance(child, dict | list))
    return deepest
