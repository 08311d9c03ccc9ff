"""The values a hardware spec holds, read strictly: sizes, rates, FLOP/s and plain numbers,
finite and bounded (placer/hardware/spec.py's docstring says why), and the shapes of its
tables; each error names the field ("spec: cards[0].vram: ...")."""

from __future__ import annotations

import math
import re
from typing import Any

from placer.errors import PlacerError
from placer.units import parse_bytes, parse_rate

MAX_BYTES = 2**60          # sizes and bytes/s beyond this are typos, not hardware
MIN_RATE = 1e6             # bytes/s below this (a floppy disk's) are typos too
MAX_FLOPS = 1e18
MIN_FLOPS = 1e6
_FLOPS = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?\d+)?)\s*([KMGTP]?)FLOP(?:S|/s)\s*$",
                    re.IGNORECASE)
_FLOPS_SCALE = {"": 1.0, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15}


def flops_of(value: Any, what: str) -> float:
    """FLOP/s in `value`: a number, or "<n>[KMGTP]FLOPS" ("1.5TFLOPS")."""
    if isinstance(value, str):
        m = _FLOPS.match(value)
        if not m:
            raise PlacerError(f"{what}: cannot read {value!r} as FLOP/s (e.g. 1.5TFLOPS)")
        value = float(m[1]) * _FLOPS_SCALE[m[2].upper()]
    return number_of(value, what, MIN_FLOPS, MAX_FLOPS)


def size_of(value: Any, what: str) -> int:
    """Bytes (>= 0, <= 2**60) from a number or a size string."""
    finite_or_text(value, what, "a size (e.g. 20GiB)")
    n = parse_bytes(value, what)
    if not 0 <= n <= MAX_BYTES:
        raise PlacerError(f"{what}: expected a size in 0..2**60 bytes, got {value!r}")
    return n


def rate_of(value: Any, what: str) -> float:
    """Bytes/s (> 0, <= 2**60) from a number or a rate string."""
    finite_or_text(value, what, "a rate (e.g. 52GB/s)")
    rate = parse_rate(value, what)
    if not MIN_RATE <= rate <= MAX_BYTES:
        raise PlacerError(f"{what}: expected a positive rate from 1MB/s up to 2**60 B/s, got "
                          f"{value!r}")
    return rate


def number_of(value: Any, what: str, lo: float, hi: float, *, positive: bool = False) -> float:
    """A finite plain number in [lo, hi] (> lo with `positive`); strings are refused."""
    if isinstance(value, bool) or not isinstance(value, int | float) or (
            isinstance(value, int) and abs(value) > 2**63):
        raise PlacerError(f"{what}: expected a number, got {value!r}")
    x = float(value)
    if not math.isfinite(x) or x < lo or x > hi or (positive and x <= lo):
        bound = f"{'>' if positive else '>='} {lo:g} and <= {hi:g}"
        raise PlacerError(f"{what}: expected a finite number {bound}, got {value!r}")
    return x


def finite_or_text(value: Any, what: str, expected: str) -> None:
    """Refuse what the unit parsers would turn into a traceback: bools, NaN, inf, tables."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise PlacerError(f"{what}: expected {expected}, got {value!r}")
    if isinstance(value, float) and not math.isfinite(value):
        raise PlacerError(f"{what}: expected {expected}, got {value!r}")
    if isinstance(value, int) and abs(value) > MAX_BYTES:
        raise PlacerError(f"{what}: expected {expected} up to 2**60, got {value!r}")


def text_of(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise PlacerError(f"{what}: expected a string, got {value!r}")
    return value


def table_list(value: Any, what: str) -> list[dict]:
    if not isinstance(value, list) or not all(isinstance(t, dict) for t in value):
        raise PlacerError(f"{what}: expected a list of tables, got {kind_of(value)}")
    return value


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def kind_of(value: Any) -> str:
    """A short description of what was found where a table was expected."""
    if isinstance(value, list):
        return f"a list ({str(value)[:40]})"
    return repr(value)[:60]
