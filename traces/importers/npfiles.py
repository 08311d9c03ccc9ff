"""`.npy` and `.npz` files as importers read them: headers checked before any byte is read.

A `.npy` header says the array's shape and dtype, and `np.load` allocates what it says: a
header claiming 10**12 rows asks for terabytes before finding the file short. Here every
array's size is computed from its header in exact integers and compared with the bytes the
file (or the `.npz` member, by the zip directory's uncompressed size) actually holds before
it is loaded; a file named `.npy` must be one (not a zip, which `np.load` would take as an
`.npz`); a corrupted `.npz` member (bad deflate data, a bad CRC) is a TraceError naming it.
Pickled (object) arrays are never loaded.
"""

from __future__ import annotations

import io
import math
import zipfile
import zlib
from pathlib import Path
from typing import IO

import numpy as np

from traces.errors import TraceError

NPY_MAGIC = b"\x93NUMPY"
READ_ERRORS = (ValueError, OSError, EOFError, zipfile.BadZipFile, zlib.error)


def npy_header(fp: IO[bytes], size: int, where: str) -> tuple[tuple[int, ...], np.dtype]:
    """(shape, dtype) of the `.npy` stream `fp` of `size` bytes; a TraceError unless the
    header is NumPy's, the dtype holds no Python objects and the data it claims is exactly
    what follows it."""
    if fp.read(len(NPY_MAGIC)) != NPY_MAGIC:
        raise TraceError(f"{where}: not a .npy array (no NumPy header)")
    fp.seek(0)
    try:
        version = np.lib.format.read_magic(fp)
        read = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                else np.lib.format.read_array_header_2_0)
        shape, _, dtype = read(fp)
    except READ_ERRORS as exc:
        raise TraceError(f"{where}: not a readable .npy header ({exc})") from None
    if dtype.hasobject:
        raise TraceError(f"{where}: an array of Python objects (dtype {dtype}), which is "
                         "never loaded (it would run pickle)")
    claimed = math.prod(shape) * dtype.itemsize
    if claimed != size - fp.tell():
        raise TraceError(f"{where}: its header claims {list(shape)} of {dtype} "
                         f"({claimed} bytes), the file holds {size - fp.tell()}")
    return tuple(shape), dtype


def load_npy(path: Path) -> np.ndarray:
    """The array of a `.npy` file, its header checked first (npy_header)."""
    path = Path(path)
    try:
        with path.open("rb") as fp:
            npy_header(fp, path.stat().st_size, str(path))
            fp.seek(0)
            return np.load(fp, allow_pickle=False)
    except TraceError:
        raise
    except READ_ERRORS as exc:
        raise TraceError(f"{path}: not a readable .npy file ({exc})") from None


def npy_from_bytes(raw: bytes, where: str) -> np.ndarray:
    """The array of the `.npy` bytes `raw` (a server's reply), its header checked first."""
    stream = io.BytesIO(raw)
    npy_header(stream, len(raw), where)
    stream.seek(0)
    try:
        return np.load(stream, allow_pickle=False)
    except READ_ERRORS as exc:
        raise TraceError(f"{where}: not a readable .npy array ({exc})") from None


def load_npz(path: Path) -> dict[str, np.ndarray]:
    """{name: array} of a `.npz` file, each member's header checked against its size first."""
    path = Path(path)
    out = {}
    try:
        with zipfile.ZipFile(path) as zf:
            for info in zf.infolist():
                name, where = info.filename.removesuffix(".npy"), f"{path}[{info.filename}]"
                with zf.open(info) as fp:
                    npy_header(fp, info.file_size, where)
                with zf.open(info) as fp:
                    out[name] = np.load(fp, allow_pickle=False)
    except TraceError:
        raise
    except READ_ERRORS as exc:
        raise TraceError(f"{path}: not a readable .npz file ({exc})") from None
    return out


def load_arrays(path: Path) -> dict[str, np.ndarray]:
    """The arrays of one `.npz` / `.npy` file ({"expert_ids": ...} for a `.npy`)."""
    path = Path(path)
    if not path.is_file():
        raise TraceError(f"no such file: {path}")
    if path.suffix.lower() == ".npy":
        return {"expert_ids": load_npy(path)}
    return load_npz(path)


def npz_keys(path: Path) -> list[str]:
    """The member names of an `.npz` file (nothing loaded)."""
    try:
        with zipfile.ZipFile(path) as zf:
            return [n.removesuffix(".npy") for n in zf.namelist()]
    except READ_ERRORS as exc:
        raise TraceError(f"{path}: not a readable .npz file ({exc})") from None


def npy_ndim(path: Path) -> int:
    """The number of dimensions a `.npy` file's header gives (nothing loaded)."""
    path = Path(path)
    try:
        with path.open("rb") as fp:
            return len(npy_header(fp, path.stat().st_size, str(path))[0])
    except OSError as exc:
        raise TraceError(f"{path}: not a readable .npy file ({exc})") from None
