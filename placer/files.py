"""Writing small output files (plans, manifests, exports) so that nothing half-written is
ever seen, and JSON that any parser reads.

`write_text_atomic` writes a regular file through a temporary sibling, fsynced and renamed
over the target, created with mode 0666 & ~umask like any file the user makes (mkstemp's
0600 kept other users of a serving host from reading a manifest). A target that already
exists and is not a regular file is handled by kind:
- a character device or FIFO (/dev/null, /dev/stdout, a named pipe) is written straight to:
  renaming over it would replace the device node with a regular file;
- a directory, block device or socket is refused with one line.
A symlink to a regular file is followed: the file it names is replaced, the link kept.

JSON is strict (RFC 8259): NaN and +-inf, which Python's json writes as bare `NaN` and
`Infinity`, become null (`strict_json`).
"""

from __future__ import annotations

import json
import math
import os
import secrets
import stat
from pathlib import Path
from typing import Any

from placer.errors import PlacerError

NAME_MAX = 255  # bytes in one path component on Linux filesystems
TEMP_SUFFIX = ".tmp"


def strict_json(obj: Any) -> Any:
    """`obj` with every non-finite float (NaN, inf) replaced by None, containers copied."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: strict_json(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [strict_json(v) for v in obj]
    return obj


def dumps_json(obj: Any, indent: int | None = 1) -> str:
    """`obj` as strict JSON text (non-finite floats as null; see strict_json)."""
    return json.dumps(strict_json(obj), indent=indent, allow_nan=False)


def write_json_atomic(obj: Any, path: Path) -> None:
    """Write `obj` as strict JSON to `path` (see the module docstring)."""
    write_text_atomic(dumps_json(obj) + "\n", path)


def temp_name(name: str, tag: str = "") -> str:
    """A hidden sibling name for `name` that fits NAME_MAX: `.<name>.<tag><8 hex>.tmp`, the
    name cut short where needed (a legal 245-byte name must still get a temporary)."""
    tail = f".{tag}{secrets.token_hex(4)}{TEMP_SUFFIX}"
    room = NAME_MAX - 1 - len(tail.encode())
    return "." + name.encode()[:room].decode(errors="ignore") + tail


def write_text_atomic(text: str, path: Path) -> None:
    """Write `text` to `path` (see the module docstring); PlacerError in one line when the
    target is a directory or cannot be written."""
    path = Path(path)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise PlacerError(f"cannot write {path}: {exc.strerror}") from None
    if st is not None and not stat.S_ISREG(st.st_mode):
        _write_special(text, path, st.st_mode)
        return
    if path.is_symlink():
        path = Path(os.path.realpath(path))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        _replace_with(text.encode(), path)
    except OSError as exc:
        raise PlacerError(f"cannot write {path}: {exc.strerror or exc}") from None


def _write_special(text: str, path: Path, mode: int) -> None:
    if stat.S_ISDIR(mode):
        raise PlacerError(f"cannot write {path}: it is a directory (name a file)")
    if not (stat.S_ISCHR(mode) or stat.S_ISFIFO(mode)):
        raise PlacerError(f"cannot write {path}: not a regular file, character device or pipe")
    try:
        with open(path, "w") as f:
            f.write(text)
    except OSError as exc:
        raise PlacerError(f"cannot write {path}: {exc.strerror or exc}") from None


def _replace_with(data: bytes, path: Path) -> None:
    """Write `data` to a new temporary sibling of `path` (mode 0666 & ~umask), fsync it,
    rename it over `path` and fsync the directory."""
    while True:
        tmp = path.parent / temp_name(path.name)
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
            break
        except FileExistsError:
            continue
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def fsync_dir(path: Path) -> None:
    """fsync a directory, so renames in it survive a crash (where the filesystem allows)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
