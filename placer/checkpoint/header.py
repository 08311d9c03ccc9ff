"""Strict reading of safetensors headers (never the tensor bytes).

A safetensors file is an 8-byte little-endian header length N, N bytes of JSON mapping each
tensor name to {dtype, shape, data_offsets: [begin, end]} (offsets relative to the data
section that starts at 8 + N), and the data section. We read only the first 8 + N bytes and
check that every tensor's byte length matches its dtype and shape and lies inside the file.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from pathlib import Path

from placer.errors import PlacerError
from traces.formats.jsontext import loads_json

# Bits per element of every dtype safetensors knows.
DTYPE_BITS = {
    "BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8,
    "I16": 16, "U16": 16, "F16": 16, "BF16": 16,
    "I32": 32, "U32": 32, "F32": 32,
    "I64": 64, "U64": 64, "F64": 64,
    "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6,
}
MAX_HEADER_BYTES = 100 * 1024 * 1024  # safetensors' own limit


@dataclass(frozen=True)
class TensorHeader:
    """One tensor's entry: `offset` is absolute in the file, `length` in bytes."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int
    length: int


@dataclass(frozen=True)
class FileHeader:
    """A safetensors file's header: its tensors in data order, and its size."""

    path: Path
    size: int
    data_start: int
    tensors: tuple[TensorHeader, ...]
    metadata: dict[str, str]


def tensor_bytes(dtype: str, shape: tuple[int, ...]) -> int:
    """Byte length of a tensor of `dtype` and `shape` (sub-byte dtypes rounded up)."""
    if dtype not in DTYPE_BITS:
        raise PlacerError(f"unknown safetensors dtype {dtype!r}")
    return (math.prod(shape) * DTYPE_BITS[dtype] + 7) // 8


def read_header(path: Path) -> FileHeader:
    """Read and validate the header of the safetensors file at `path`."""
    path = Path(path)
    if not path.is_file():
        raise PlacerError(f"safetensors file not found: {path}")
    size = path.stat().st_size
    with path.open("rb") as f:
        prefix = f.read(8)
        if len(prefix) < 8:
            raise PlacerError(f"{path.name}: truncated safetensors header ({size} bytes)")
        (n,) = struct.unpack("<Q", prefix)
        if n > MAX_HEADER_BYTES or 8 + n > size:
            raise PlacerError(f"{path.name}: header length {n} exceeds the file ({size} bytes)")
        raw = f.read(n)
    try:
        entries = loads_json(raw, f"{path.name}: header", PlacerError, _no_duplicates)
    except _DuplicateKey as exc:
        raise PlacerError(f"{path.name}: header names {exc.args[0]!r} twice") from None
    if not isinstance(entries, dict):
        raise PlacerError(f"{path.name}: header is not a JSON object")
    metadata = entries.pop("__metadata__", None)
    if metadata is None:
        metadata = {}
    if not isinstance(metadata, dict) or not all(
            isinstance(v, str) for v in metadata.values()):
        raise PlacerError(f"{path.name}: __metadata__ must map names to strings, got "
                          f"{_short(metadata)}")
    data_start = 8 + n
    tensors = [_tensor(path.name, name, entry, data_start) for name, entry in entries.items()]
    tensors.sort(key=lambda t: t.offset)
    _check_layout(path.name, tensors, data_start, size)
    return FileHeader(path, size, data_start, tuple(tensors), dict(metadata))


class _DuplicateKey(Exception):
    pass


def _no_duplicates(pairs: list[tuple[str, object]]) -> dict:
    """A JSON object as a dict; _DuplicateKey when it names a key twice (json keeps the last)."""
    out: dict = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key)
        out[key] = value
    return out


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _tensor(file: str, name: str, entry: object, data_start: int) -> TensorHeader:
    if not isinstance(entry, dict) or not {"dtype", "shape", "data_offsets"} <= entry.keys():
        raise PlacerError(f"{file}: header entry for tensor {name!r} is not "
                          "{dtype, shape, data_offsets}")
    dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    if not isinstance(dtype, str) or dtype not in DTYPE_BITS:
        raise PlacerError(f"{file}: tensor {name!r} has dtype {_short(dtype)}, expected one of "
                          f"{', '.join(DTYPE_BITS)}")
    if not isinstance(shape, list) or not all(_is_int(d) and d >= 0 for d in shape):
        raise PlacerError(f"{file}: tensor {name!r} has shape {_short(shape)}, expected a list "
                          "of non-negative integers")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(map(_is_int, offsets))):
        raise PlacerError(f"{file}: tensor {name!r} has data_offsets {_short(offsets)}, "
                          "expected [begin, end]")
    shape, (begin, end) = tuple(shape), offsets
    expected = tensor_bytes(dtype, shape)
    if end - begin != expected or begin < 0:
        raise PlacerError(
            f"{file}: tensor {name!r} claims bytes [{begin}, {end}) but {dtype}{list(shape)} "
            f"needs {expected}")
    return TensorHeader(name, dtype, shape, data_start + begin, expected)


def _check_layout(file: str, tensors: list[TensorHeader], data_start: int, size: int) -> None:
    """Tensors must not overlap and must end inside the file."""
    cursor = data_start
    for t in tensors:
        if t.offset < cursor:
            raise PlacerError(f"{file}: tensor {t.name!r} overlaps the tensor before it")
        cursor = t.offset + t.length
    if cursor > size:
        raise PlacerError(
            f"{file}: data section needs {cursor} bytes but the file has {size} (truncated?)")
