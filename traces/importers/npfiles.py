"""`.npy` and `.npz` files as importers read them: every header parsed here, every size checked,
before a byte of data is read or inflated.

A `.npy` header says the array's shape and dtype, and `np.load` allocates what it says: a
header claiming 10**12 rows asks for terabytes before finding the file short, and numpy's own
header parser fails on garbage with `tokenize.TokenError` and friends. So numpy never parses
a header here (`parse_header`): the magic, the version, the header length against the bytes
there are (at most MAX_HEADER, numpy's own limit), a Python dict literal (`ast.literal_eval`
of that bounded text) holding exactly `descr`, `fortran_order` and `shape`, a plain numeric
dtype (bool, integer or float: never objects, which would run pickle, nor structured or
sub-array dtypes) and a shape of non-negative integers whose size, in exact integers, is the
number of bytes after the header. The data is then read into an array of that size.

An `.npz` is a zip archive, and a member of a few KB can inflate to gigabytes. Before any
member is inflated (`npz_headers`): its size in the zip directory must be within
MAX_INFLATION times its compressed size (or under FREE_BYTES: small members are never
refused; real routing compresses 2-12x), its header (read from the start of the stream, a
few KB inflated at most) must match that size, and the caller's `check` sees every member's
shape and dtype (the model's layers and top-k, equal token counts) before any data is read.
A corrupted member (bad deflate data, a bad CRC) is a TraceError naming it.
"""

from __future__ import annotations

import ast
import io
import math
import re
import zipfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import numpy as np

from traces.errors import TraceError, first_line

NPY_MAGIC = b"\x93NUMPY"
MAX_HEADER = 10_000      # bytes of header dict text: numpy's np.load refuses longer ones too
MAX_DIMS = 32            # dimensions of an array (numpy's own limit is 64)
MAX_INFLATION = 100      # a zip member's size over its compressed size (routing: 2-12x)
FREE_BYTES = 64 << 20    # a member this small inflates whatever its ratio
CHUNK = 1 << 20          # bytes read at a time
DESCR = re.compile(r"[<>|=][biuf][0-9]{1,2}")  # what np.save writes for numeric dtypes
READ_ERRORS = (ValueError, OSError, EOFError, zipfile.BadZipFile, zlib.error,
               NotImplementedError)  # NotImplementedError: a zip compression zipfile lacks


@dataclass(frozen=True)
class NpyHeader:
    """What a `.npy` header says: the array is `shape` of `dtype`, its data `data_offset`
    bytes into the stream, column-major where `fortran_order`."""

    shape: tuple[int, ...]
    dtype: np.dtype
    fortran_order: bool
    data_offset: int

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


Check = Callable[[dict[str, NpyHeader]], None]  # sees every array's header; raises TraceError


def parse_header(fp: IO[bytes], size: int, where: str) -> NpyHeader:
    """The header of the `.npy` stream `fp` (at its start) of `size` bytes; a TraceError,
    prefixed `where`, unless it is a header np.save could have written for a plain numeric
    array whose data is exactly the bytes that follow it (module docstring). Reads at most
    12 + MAX_HEADER bytes."""
    lead = fp.read(len(NPY_MAGIC) + 2)
    if lead[:len(NPY_MAGIC)] != NPY_MAGIC:
        raise TraceError(f"{where}: not a .npy array (no NumPy header)")
    version = tuple(lead[len(NPY_MAGIC):])
    if version not in ((1, 0), (2, 0), (3, 0)):
        raise TraceError(f"{where}: .npy format version {version} (numpy writes 1.0, 2.0, 3.0)")
    width = 2 if version == (1, 0) else 4
    length = int.from_bytes(fp.read(width).ljust(width, b"\xff"), "little")
    offset = len(lead) + width + length
    if length > MAX_HEADER or offset > size:
        raise TraceError(f"{where}: its .npy header claims {length} bytes (at most "
                         f"{MAX_HEADER}, and the file holds {size})")
    raw = fp.read(length)
    try:
        text = raw.decode("utf-8" if version == (3, 0) else "latin-1")
        fields = ast.literal_eval(text)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        raise TraceError(f"{where}: its .npy header is not a Python dict literal") from None
    shape, dtype, fortran = _fields(fields, where)
    header = NpyHeader(shape, dtype, fortran, offset)
    if header.nbytes != size - offset:
        raise TraceError(f"{where}: its header claims {list(shape)} of {dtype} "
                         f"({header.nbytes} bytes), the file holds {size - offset}")
    return header


def _fields(fields: object, where: str) -> tuple[tuple[int, ...], np.dtype, bool]:
    """(shape, dtype, fortran_order) of a parsed header dict, checked."""
    if not isinstance(fields, dict) or set(fields) != {"descr", "fortran_order", "shape"}:
        raise TraceError(f"{where}: its .npy header must be a dict of descr, fortran_order "
                         "and shape")
    descr, fortran, shape = fields["descr"], fields["fortran_order"], fields["shape"]
    if not isinstance(fortran, bool):
        raise TraceError(f"{where}: its .npy header's fortran_order is not True or False")
    if not (isinstance(shape, tuple) and len(shape) <= MAX_DIMS and all(
            isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape)):
        raise TraceError(f"{where}: its .npy header's shape {str(shape)[:60]} is not a tuple "
                         f"of at most {MAX_DIMS} non-negative integers")
    if not isinstance(descr, str) or not DESCR.fullmatch(descr):
        raise TraceError(f"{where}: an array of dtype {str(descr)[:60]}, expected bool, "
                         "integers or floats (arrays of Python objects are never loaded: "
                         "they would run pickle)")
    try:
        dtype = np.dtype(descr)
    except TypeError:
        raise TraceError(f"{where}: an array of dtype {descr}, which numpy does not "
                         "know") from None
    return shape, dtype, fortran


def read_data(fp: IO[bytes], header: NpyHeader, where: str) -> np.ndarray:
    """The array whose data `fp` holds next (after `header`), read CHUNK bytes at a time into
    an array of the size the header gives (already checked against the stream's)."""
    try:
        flat = np.empty(math.prod(header.shape), dtype=header.dtype)
    except MemoryError:
        raise TraceError(f"{where}: {header.nbytes} bytes of {list(header.shape)} "
                         f"{header.dtype} do not fit in memory") from None
    view = memoryview(flat.view(np.uint8).reshape(-1))
    done = 0
    while done < len(view):
        got = fp.readinto(view[done:done + CHUNK])
        if not got:
            raise TraceError(f"{where}: the data ends after {done} of {len(view)} bytes")
        done += got
    fp.read(1)  # at the end of a zip member: its CRC is checked here
    return flat.reshape(header.shape, order="F" if header.fortran_order else "C")


def load_npy(path: Path, check: Check | None = None) -> np.ndarray:
    """The array of a `.npy` file, its header checked first (parse_header; `check` sees it
    as {"expert_ids": header})."""
    path = Path(path)
    try:
        with path.open("rb") as fp:
            header = parse_header(fp, path.stat().st_size, str(path))
            if check is not None:
                check({"expert_ids": header})
            return read_data(fp, header, str(path))
    except TraceError:
        raise
    except READ_ERRORS as exc:
        raise TraceError(f"{path}: not a readable .npy file ({first_line(exc)})") from None


def npy_from_bytes(raw: bytes, where: str) -> np.ndarray:
    """The array of the `.npy` bytes `raw` (a server's reply), its header checked first."""
    stream = io.BytesIO(raw)
    return read_data(stream, parse_header(stream, len(raw), where), where)


def check_inflation(info: zipfile.ZipInfo, where: str) -> None:
    """Refuse the zip member `info` when it would inflate past MAX_INFLATION times its
    compressed size (and past FREE_BYTES): a zip bomb, not routing."""
    if info.file_size > max(FREE_BYTES, MAX_INFLATION * info.compress_size):
        raise TraceError(f"{where}: {info.compress_size} compressed bytes claim to inflate to "
                         f"{info.file_size} (more than {MAX_INFLATION} times; real arrays "
                         "compress a few times): refused before inflating it")


def npz_headers(zf: zipfile.ZipFile, path: Path,
                names: Callable[[str], bool] | None = None) -> dict[str, tuple[zipfile.ZipInfo,
                                                                            NpyHeader]]:
    """{array name: (member, header)} of the `.npz` open as `zf`, for the names `names`
    accepts (default all): each member's inflation bounded and its header read from the first
    bytes of its stream (module docstring). Nothing past the headers is inflated."""
    out = {}
    for info in zf.infolist():
        name, where = info.filename.removesuffix(".npy"), f"{path}[{info.filename}]"
        if names is not None and not names(name):
            continue
        if name in out:
            raise TraceError(f"{where}: the archive holds {info.filename} twice")
        check_inflation(info, where)
        with zf.open(info) as fp:
            out[name] = info, parse_header(fp, info.file_size, where)
    return out


def load_npz(path: Path, check: Check | None = None,
             names: Callable[[str], bool] | None = None) -> dict[str, np.ndarray]:
    """{name: array} of a `.npz` file (those `names` accepts), every member's size and header
    checked, and `check` given every header, before any data is inflated."""
    path = Path(path)
    try:
        with zipfile.ZipFile(path) as zf:
            headers = npz_headers(zf, path, names)
            if check is not None:
                check({name: header for name, (_, header) in headers.items()})
            out = {}
            for name, (info, header) in headers.items():
                with zf.open(info) as fp:
                    fp.read(header.data_offset)
                    out[name] = read_data(fp, header, f"{path}[{info.filename}]")
            return out
    except TraceError:
        raise
    except READ_ERRORS as exc:
        raise TraceError(f"{path}: not a readable .npz file ({first_line(exc)})") from None


def load_arrays(path: Path, check: Check | None = None,
                names: Callable[[str], bool] | None = None) -> dict[str, np.ndarray]:
    """The arrays of one `.npz` / `.npy` file ({"expert_ids": ...} for a `.npy`), their
    headers given to `check` before any data is read."""
    path = Path(path)
    if not path.is_file():
        raise TraceError(f"no such file: {path}")
    if path.suffix.lower() == ".npy":
        return {"expert_ids": load_npy(path, check)}
    return load_npz(path, check, names)


def npz_keys(path: Path) -> list[str]:
    """The member names of an `.npz` file (nothing loaded)."""
    try:
        with zipfile.ZipFile(path) as zf:
            return [n.removesuffix(".npy") for n in zf.namelist()]
    except READ_ERRORS as exc:
        raise TraceError(f"{path}: not a readable .npz file ({first_line(exc)})") from None


def npy_ndim(path: Path) -> int:
    """The number of dimensions a `.npy` file's header gives (nothing loaded)."""
    path = Path(path)
    try:
        with path.open("rb") as fp:
            return len(parse_header(fp, path.stat().st_size, str(path)).shape)
    except OSError as exc:
        raise TraceError(f"{path}: not a readable .npy file ({first_line(exc)})") from None
