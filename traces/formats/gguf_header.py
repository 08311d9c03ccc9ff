"""A bounded reader of GGUF headers: the key-value metadata and the tensor infos, never the
tensor data, with every count and length checked against the bytes left before it is used.

Why not `gguf.GGUFReader` (gguf 0.19.0): it memory-maps the file and reads every array of the
metadata eagerly, one numpy part per element, so an array claiming billions of elements, or
arrays nested in arrays, runs for a minute and ends in MemoryError or SystemError. Here a
claim is refused in one line before anything is read for it, and arrays placer does not need
(a tokenizer's vocabulary) are skipped, not decoded. The file is read through a buffered
cursor, not mapped, so a model of hundreds of GB costs no address space.

The rules are llama.cpp's own loader's (`ggml/src/gguf.cpp`, `gguf_init_from_file_impl`, at
ggml-org/llama.cpp 0c1e57098bba43ac29e6e3b677cdceebdd22334f): magic `GGUF`; version 2 or 3
(1 is no longer read, a version whose low 16 bits are 0 is the other byte order); tensor and
key-value counts; keys non-empty and unique; an array's element type is a scalar or a string,
never an array (gguf.cpp refuses nested arrays: "invalid GGUF type"); strings and arrays at
most 2**30 long and within the bytes left; `general.alignment` a uint32 power of two; tensor
names shorter than GGML_MAX_NAME (64) and unique, at most GGML_MAX_DIMS (4) dims, each >= 0,
element count < 2**63, a ggml type of the `gguf` package's GGML_QUANT_SIZES table, rows a
whole number of blocks; each tensor's offset is the sum of the padded sizes of the tensors
before it, and the data ends inside the file. A block tensor's layer index is the decimal
llama.cpp writes (`block_index`). No name (a key's, a tensor's) holds a NUL byte: gguf.cpp
reads it whole into a std::string but then names the tensor with `ggml_set_name(&info.t,
name.c_str())` and finds keys and tensors by `strcmp` on C strings, so llama.cpp sees
`blk.1.ffn_up_exps.weight\0x` as layer 1's up experts where a reader of the whole bytes sees
another (dense) tensor; both readings cannot be right, so such a file is refused.

Beyond llama.cpp, placer caps what it reads (MAX_KV, MAX_TENSORS, MAX_STRING_ARRAY: far above
any real model) so that a file of millions of tiny entries is refused in seconds too, and what
it decodes (KEEP_ARRAY, KEEP_STRING, KEEP_TOTAL: values past them are `Skipped`), so that its
memory stays in megabytes whatever a file of gigabytes of metadata holds.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32  # gguf.cpp GGUF_DEFAULT_ALIGNMENT
ALIGNMENT_KEY = "general.alignment"
MAX_LENGTH = 1 << 30  # gguf.cpp GGUF_MAX_STRING_LENGTH and GGUF_MAX_ARRAY_ELEMENTS
MAX_NAME = 64  # ggml.h GGML_MAX_NAME (a tensor name holds at most 63 bytes)
MAX_DIMS = 4  # ggml.h GGML_MAX_DIMS
MAX_KV = 1 << 16  # real models hold < 100 keys
MAX_TENSORS = 1 << 17  # real models hold a few thousand tensors
MAX_STRING_ARRAY = 1 << 21  # elements walked per string array (vocabularies hold < 300k)
KEEP_ARRAY = 1 << 12  # arrays up to this many elements are decoded, longer ones only counted
KEEP_STRING = 1 << 20  # string values up to this many bytes are decoded
KEEP_TOTAL = 1 << 24  # bytes decoded in all (strings over MAX_NAME, arrays at 8 per element)
_CHUNK = 1 << 20
BLOCK_PREFIX = "blk."
_DECIMAL = re.compile(r"0|[1-9][0-9]{0,8}", re.ASCII)  # printf %d of a layer index

# Scalar value types: (struct format, bytes).
_SCALARS = {
    GGUFValueType.UINT8: ("B", 1), GGUFValueType.INT8: ("b", 1),
    GGUFValueType.UINT16: ("H", 2), GGUFValueType.INT16: ("h", 2),
    GGUFValueType.UINT32: ("I", 4), GGUFValueType.INT32: ("i", 4),
    GGUFValueType.FLOAT32: ("f", 4), GGUFValueType.BOOL: ("?", 1),
    GGUFValueType.UINT64: ("Q", 8), GGUFValueType.INT64: ("q", 8),
    GGUFValueType.FLOAT64: ("d", 8),
}


@dataclass(frozen=True)
class Skipped:
    """A value not decoded: an array of `count` elements of `kind`, or a string of `count`
    bytes (kind STRING), longer than placer keeps (KEEP_ARRAY, KEEP_STRING)."""

    kind: str
    count: int

    def __str__(self) -> str:
        return f"<{self.count} x {self.kind}>"


@dataclass(frozen=True)
class TensorInfo:
    """One tensor's info. `ne` is ggml's order: ne[0] is the innermost (contiguous) dimension,
    so the numpy (row-major) shape is `ne` reversed; `offset` is absolute in the file,
    `nbytes` the tensor's exact length (elements / block size x type size)."""

    name: str
    ggml_type: GGMLQuantizationType
    ne: tuple[int, ...]
    offset: int
    nbytes: int

    @property
    def shape(self) -> tuple[int, ...]:
        """The row-major shape in elements (`ne` reversed)."""
        return tuple(reversed(self.ne))

    @property
    def type_name(self) -> str:
        return self.ggml_type.name


@dataclass(frozen=True)
class GGUFHeader:
    """A GGUF file's header: its metadata {key: value} (ints, floats, bools, strings, lists of
    those, or `Skipped`), its tensors in file order, where its data section starts."""

    path: Path
    size: int
    version: int
    fields: dict[str, object]
    alignment: int
    data_start: int
    tensors: tuple[TensorInfo, ...]


class _Cursor:
    """Reads a file forward in chunks; every read is checked against the bytes left first."""

    def __init__(self, path: Path, size: int, error: type[Exception]) -> None:
        self.f = path.open("rb")
        self.path, self.size, self.error = path, size, error
        self.pos = 0  # absolute position of buf[at]
        self.buf, self.at = b"", 0
        self.kept = 0  # bytes decoded so far, against KEEP_TOTAL

    def keep(self, n: int) -> bool:
        """Whether `n` more bytes may be decoded (KEEP_TOTAL); if so they are counted."""
        if self.kept + n > KEEP_TOTAL:
            return False
        self.kept += n
        return True

    def left(self) -> int:
        return self.size - self.pos

    def need(self, n: int, what: str) -> None:
        if n > self.left():
            raise self.error(f"{self.path}: {what} needs {n} bytes but {self.left()} are left "
                             f"at offset {self.pos} of {self.size} (truncated or corrupt GGUF)")

    def take(self, n: int, what: str) -> bytes:
        self.need(n, what)
        if self.at + n > len(self.buf):
            self.buf = self.buf[self.at:] + self.f.read(max(n, _CHUNK))
            self.at = 0
        out = self.buf[self.at:self.at + n]
        if len(out) < n:
            raise self.error(f"{self.path}: {what}: the file ended early (changed while read?)")
        self.at += n
        self.pos += n
        return out

    def skip(self, n: int, what: str) -> None:
        self.need(n, what)
        if self.at + n <= len(self.buf):
            self.at += n
        else:
            self.f.seek(self.pos + n)
            self.buf, self.at = b"", 0
        self.pos += n

    def scalar(self, fmt: str, size: int, what: str) -> object:
        return struct.unpack("<" + fmt, self.take(size, what))[0]

    def length(self, what: str, unit: str = "bytes") -> int:
        """A string's or array's uint64 length, at most llama.cpp's 2**30."""
        n = self.scalar("Q", 8, f"{what}: its length")
        if n > MAX_LENGTH:
            raise self.error(f"{self.path}: {what} claims {n} {unit}, more than the 2**30 "
                             "that llama.cpp reads")
        return n

    def string(self, what: str, *, keep: int = KEEP_STRING, name: bool = False
               ) -> str | Skipped:
        """A string of at most `keep` bytes within KEEP_TOTAL (else Skipped; names up to
        MAX_NAME bytes cost none of it). A name (a key, a tensor's) must be UTF-8; a value's
        bytes that are not are replaced (U+FFFD), as they name nothing."""
        n = self.length(what)
        self.need(n, what)
        if n > keep or (n > MAX_NAME and not self.keep(n)):
            self.skip(n, what)
            return Skipped("STRING", n)
        raw = self.take(n, what)
        try:
            text = raw.decode("utf-8", errors="strict" if name else "replace")
        except UnicodeDecodeError:
            raise self.error(f"{self.path}: {what} is not UTF-8") from None
        if name and "\x00" in text:
            raise self.error(f"{self.path}: {what} {text!r} holds a NUL byte: llama.cpp reads "
                             f"names as C strings, so to it this is "
                             f"{text.split(chr(0))[0]!r}, another name than placer's")
        return text


def read_gguf_header(path: Path, error: type[Exception]) -> GGUFHeader:
    """The header of the GGUF file at `path`, or `error` (the caller's domain exception) in one
    line naming the file and the field that is wrong."""
    path = Path(path)
    if not path.is_file():
        raise error(f"GGUF file not found: {path}")
    size = path.stat().st_size
    cur = _Cursor(path, size, error)
    try:
        if cur.left() < 4 or cur.take(4, "magic") != GGUF_MAGIC:
            raise error(f"{path}: not a GGUF file (no GGUF magic)")
        version = cur.scalar("I", 4, "version")
        if version & 0xFFFF == 0:
            raise error(f"{path}: GGUF version {version:#x} is of the other byte order "
                        "(big-endian GGUF is not read)")
        if version not in (2, 3):
            raise error(f"{path}: GGUF version {version}; llama.cpp reads versions 2 and 3")
        n_tensors = cur.scalar("q", 8, "tensor count")
        n_kv = cur.scalar("q", 8, "key-value count")
        _check_count(cur, n_kv, MAX_KV, 8 + 4, "key-value count")
        fields = _read_fields(cur, n_kv)
        alignment = _alignment(path, fields, error)
        _check_count(cur, n_tensors, MAX_TENSORS, 8 + 4 + 4 + 8, "tensor count")
        infos = [_tensor_info(cur, i) for i in range(n_tensors)]
    finally:
        cur.f.close()
    names = set()
    for name, *_ in infos:
        if name in names:
            raise error(f"{path}: tensor {name!r} is named twice")
        names.add(name)
        block_index(name, path, error)
    data_start = cur.pos + (-cur.pos % alignment) if infos else cur.pos
    return GGUFHeader(path, size, version, fields, alignment, data_start,
                      _layout(path, size, data_start, alignment, infos, error))


def block_index(name: str, path: Path, error: type[Exception]) -> int | None:
    """The layer of tensor `name` when it is a block's (`blk.N.*`), else None; `error` when N
    is not the decimal llama.cpp writes. llama.cpp names every block tensor `blk.%d.NAME`
    (LLM_TENSOR_NAMES, `src/llama-arch.cpp`) and finds it by that exact name, so `blk.01` or
    `blk.١` (an Arabic-Indic digit, which Python's int() and re's \\d accept) is a tensor
    llama.cpp never loads ("wrong number of tensors", `done_getting_tensors`,
    `src/llama-model-loader.cpp`), and reading it as layer 1 would count a layer twice."""
    if not name.startswith(BLOCK_PREFIX):
        return None
    index = name[len(BLOCK_PREFIX):].split(".", 1)[0]
    if not _DECIMAL.fullmatch(index):
        raise error(f"{path}: tensor {name!r}: layer index {index!r} is not the decimal "
                    "llama.cpp writes (blk.%d: ASCII digits, no leading zero)")
    return int(index)


def _check_count(cur: _Cursor, n: int, cap: int, least: int, what: str) -> None:
    """A count of entries of at least `least` bytes each: >= 0, at most `cap`, and fitting in
    the bytes left."""
    if n < 0 or n > cap:
        raise cur.error(f"{cur.path}: {what} is {n}; placer reads 0 to {cap}")
    if n * least > cur.left():
        raise cur.error(f"{cur.path}: {what} {n} needs at least {n * least} bytes but "
                        f"{cur.left()} are left (truncated or corrupt GGUF)")


def _read_fields(cur: _Cursor, n_kv: int) -> dict[str, object]:
    fields: dict[str, object] = {}
    for i in range(n_kv):
        key = cur.string(f"key #{i}", name=True)
        if not key:
            raise cur.error(f"{cur.path}: key #{i} is empty")
        if isinstance(key, Skipped):
            raise cur.error(f"{cur.path}: key #{i} is {key.count} bytes long; placer reads "
                            f"keys of up to {KEEP_STRING} bytes, {KEEP_TOTAL} of metadata in all")
        if key in fields:
            raise cur.error(f"{cur.path}: key {key!r} appears twice")
        fields[key] = _value(cur, key)
    return fields


def _value_type(cur: _Cursor, what: str) -> GGUFValueType:
    raw = cur.scalar("I", 4, f"{what}: its type")
    try:
        return GGUFValueType(raw)
    except ValueError:
        raise cur.error(f"{cur.path}: {what} has GGUF value type {raw}, which is none of "
                        f"{', '.join(t.name for t in GGUFValueType)}") from None


def _value(cur: _Cursor, key: str) -> object:
    what = f"key {key!r}"
    kind = _value_type(cur, what)
    if key == ALIGNMENT_KEY and kind != GGUFValueType.UINT32:
        raise cur.error(f"{cur.path}: {what} is {kind.name}; gguf.cpp requires UINT32")
    if kind == GGUFValueType.STRING:
        return cur.string(what)
    if kind != GGUFValueType.ARRAY:
        return cur.scalar(*_SCALARS[kind], what)
    element = _value_type(cur, f"{what} (array element)")
    if element == GGUFValueType.ARRAY:
        raise cur.error(f"{cur.path}: {what} is an array of arrays; llama.cpp reads no nested "
                        "arrays")
    count = cur.length(what, f"{element.name} elements")
    if element == GGUFValueType.STRING:
        return _string_array(cur, what, count)
    fmt, size = _SCALARS[element]
    cur.need(count * size, f"{what} (array of {count} {element.name})")
    if count > KEEP_ARRAY or not cur.keep(count * 8):
        cur.skip(count * size, what)
        return Skipped(element.name, count)
    return np.frombuffer(cur.take(count * size, what), dtype="<" + fmt).tolist()


def _string_array(cur: _Cursor, what: str, count: int) -> list | Skipped:
    """An array of strings: each is a length and bytes, so it is walked, never jumped."""
    what = f"{what} (array of {count} STRING)"
    if count > MAX_STRING_ARRAY:
        raise cur.error(f"{cur.path}: {what} is longer than the {MAX_STRING_ARRAY} strings "
                        "placer reads in one array")
    cur.need(count * 8, what)
    if count > KEEP_ARRAY or not cur.keep(count * 8):
        for i in range(count):
            cur.skip(cur.length(f"{what} element {i}"), f"{what} element {i}")
        return Skipped("STRING", count)
    return [cur.string(f"{what} element {i}") for i in range(count)]


def _alignment(path: Path, fields: dict, error: type[Exception]) -> int:
    value = fields.get(ALIGNMENT_KEY, DEFAULT_ALIGNMENT)  # a uint32: _value checked its type
    if value <= 0 or value & (value - 1):
        raise error(f"{path}: {ALIGNMENT_KEY} is {value}, expected a power of 2")
    return value


def _tensor_info(cur: _Cursor, i: int) -> tuple[str, GGMLQuantizationType, tuple, int]:
    name = cur.string(f"tensor #{i}: its name", keep=MAX_NAME, name=True)
    length = name.count if isinstance(name, Skipped) else len(name.encode())
    if length >= MAX_NAME:
        raise cur.error(f"{cur.path}: tensor #{i}'s name is {length} bytes; ggml holds at "
                        f"most {MAX_NAME - 1}")
    what = f"tensor {name!r}"
    n_dims = cur.scalar("I", 4, f"{what}: its dimension count")
    if n_dims > MAX_DIMS:
        raise cur.error(f"{cur.path}: {what} has {n_dims} dimensions; ggml holds at most "
                        f"{MAX_DIMS}")
    ne = tuple(cur.scalar("q", 8, f"{what}: its dimensions") for _ in range(n_dims))
    elements = 1
    for n in ne:
        if n < 0:
            raise cur.error(f"{cur.path}: {what} has dimensions {list(ne)}; each must be >= 0")
        elements *= n
    if elements >= 1 << 63:
        raise cur.error(f"{cur.path}: {what} has dimensions {list(ne)}: {elements} elements, "
                        "past int64")
    raw = cur.scalar("I", 4, f"{what}: its ggml type")
    try:
        kind = GGMLQuantizationType(raw)
        block, _ = GGML_QUANT_SIZES[kind]
    except (ValueError, KeyError):
        raise cur.error(f"{cur.path}: {what} has ggml type {raw}, which the gguf package "
                        "does not know") from None
    if (ne[0] if ne else 1) % block:
        raise cur.error(f"{cur.path}: {what} is {kind.name} with rows of "
                        f"{ne[0] if ne else 1} elements, not a multiple of its block size "
                        f"{block}")
    offset = cur.scalar("Q", 8, f"{what}: its data offset")
    return name, kind, ne, offset


def _layout(path: Path, size: int, data_start: int, alignment: int, infos: list,
            error: type[Exception]) -> tuple[TensorInfo, ...]:
    """Tensors at the offsets gguf.cpp expects: each the padded sum of those before it."""
    tensors, expected = [], 0
    for name, kind, ne, offset in infos:
        block, type_size = GGML_QUANT_SIZES[kind]
        nbytes = int(np.prod(ne, dtype=object)) // block * type_size if ne else type_size
        if offset != expected:
            raise error(f"{path}: tensor {name!r} has data offset {offset}, expected {expected} "
                        "(the padded sizes of the tensors before it)")
        tensors.append(TensorInfo(name, kind, ne, data_start + offset, nbytes))
        expected += nbytes + (-nbytes % alignment)
        if data_start + offset + nbytes > size:
            raise error(f"{path}: tensor {name!r} ({kind.name}{list(ne)}, {nbytes} bytes at "
                        f"{data_start + offset}) ends past the end of the file ({size} bytes; "
                        "truncated?)")
    return tuple(tensors)
