"""Byte sizes and rates as people write them: "20GiB", "32GB", "52GB/s", 4096."""

from __future__ import annotations

import math
import re

from placer.errors import PlacerError

_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?\d+)?)\s*([A-Za-z]*)\s*$")


def parse_bytes(value: str | int | float, what: str = "size") -> int:
    """Bytes in `value`: an int, or a number with a unit (B, KB..TB, KiB..TiB)."""
    if isinstance(value, bool):
        raise PlacerError(f"{what}: expected a size, got {value!r}")
    if isinstance(value, int | float):
        number, unit = float(value), ""
    else:
        m = _SIZE.match(str(value))
        if not m or m[2].upper() not in _UNITS:
            raise PlacerError(f"{what}: cannot read {value!r} as a size (e.g. 20GiB, 512MB)")
        number, unit = float(m[1]), m[2].upper()
    if not math.isfinite(number * _UNITS[unit]):  # nan, inf, "1e400GB"
        raise PlacerError(f"{what}: expected a finite size, got {value!r}")
    return int(round(number * _UNITS[unit]))


def parse_rate(value: str | int | float, what: str = "bandwidth") -> float:
    """Bytes per second in `value`: a number, or a size with "/s" ("52GB/s")."""
    if isinstance(value, str):
        text = value.strip()
        if not text.endswith("/s"):
            raise PlacerError(f"{what}: cannot read {value!r} as a rate (e.g. 52GB/s)")
        value = text[:-2]
    return float(parse_bytes(value, what))


BYTE_UNITS = (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10))


def format_bytes(n: float) -> str:
    """Human form of a byte count, binary units ("1.50 GiB")."""
    for unit, scale in BYTE_UNITS:
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{int(n)} B"
