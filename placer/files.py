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

A directory output (`directory_output`) is filled under a hidden temporary sibling and renamed
onto its name only when complete; on any failure or interrupt the sibling and every parent
folder it made are removed, so a failed command leaves no directory behind.

Nothing placer writes lands on, inside, or around what it reads: `check_apart` is the one
rule (an output is never equal to, inside, or holding any input of its command: a model, a
GGUF, a plan, trace directories, a placed directory, a spec, a corpus; nor inside any
checkpoint directory, given or not), `check_outputs` applies it to every output of a command
before the command reads or measures anything, and every writer here applies it again.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import secrets
import shutil
import stat
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from placer.errors import PlacerError

NAME_MAX = 255  # bytes in one path component on Linux filesystems
TEMP_SUFFIX = ".tmp"
Inputs = Iterable[tuple[str, "Path | None"]]  # (what it is, path) of what a command reads


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


def write_json_atomic(obj: Any, path: Path, inputs: Inputs = (), what: str = "--out") -> None:
    """Write `obj` as strict JSON to `path` (see the module docstring)."""
    write_text_atomic(dumps_json(obj) + "\n", path, inputs, what)


def plain_file_name(name: object) -> bool:
    """Whether `name` is a plain file name: one path component, not . or .., no NUL, so that
    directory / name stays inside the directory."""
    return (isinstance(name, str) and name not in ("", ".", "..") and "/" not in name
            and "\x00" not in name)


def is_checkpoint(directory: str) -> bool:
    """Whether `directory` is a model checkpoint: config.json beside safetensors weights."""
    if not os.path.isfile(os.path.join(directory, "config.json")):
        return False
    try:
        names = os.listdir(directory)
    except OSError:
        return False
    return any(n.endswith(".safetensors") or n.endswith(".safetensors.index.json")
               for n in names)


def check_apart(target: Path, inputs: Inputs = (), *, what: str = "--out",
                updates: Path | None = None) -> None:
    """The rule of every output: PlacerError, one line naming `what` (the option) and the
    input, when `target` would be an input (the same file, through links or not), lie inside
    an input (a directory: a trace set, a placed directory, a checkpoint), or hold an input
    (an existing directory around it, which a directory output fills or replaces), or lie
    inside any checkpoint directory (is_checkpoint), given or not. `inputs`: (what it is,
    path) pairs, None paths skipped. Symlinks are resolved (a Hugging Face snapshot's files
    are links into its blobs); nothing here raises OSError.

    `updates`: the one input that `target` may be, because the command documents updating
    it in place (`probe --hardware box.toml --out box.toml` writes the spec it read with the
    measured table replaced: docs/cli.md, docs/hardware.md); it is still read whole before
    the atomic write replaces it."""
    out = os.path.realpath(target)
    updated = None if updates is None else os.path.realpath(updates)
    for role, given in inputs:
        if given is None:
            continue
        src = os.path.realpath(given)
        if out == updated == src:
            continue
        if (_inside(out, src) or out == src) and os.path.isdir(src):
            raise PlacerError(f"{what} {target} is inside {role} {given}: placer never writes "
                              "into what it reads; choose a path outside it")
        if out == src or _same_file(out, src):
            raise PlacerError(f"{what} {target} is {role} ({given}); write to another path")
        if _inside(src, out):
            raise PlacerError(f"{what} {target} holds {role} {given}: writing there would "
                              "change the input; choose another path")
    for parent in [out, *map(str, Path(out).parents)]:
        if is_checkpoint(parent):
            raise PlacerError(f"{what} {target} is inside the checkpoint {parent}: placer "
                              "never writes into a checkpoint; choose a path outside it")


def _inside(path: str, directory: str) -> bool:
    """Whether the resolved `path` lies strictly below the resolved `directory`."""
    return path.startswith(directory.rstrip("/") + "/")


# --- Output targets checked before the work (issue 44) -------------------------------------


def check_target(target: Path, inputs: Inputs = (), *, what: str = "--out",
                 directory: bool = False, updates: Path | None = None) -> None:
    """Everything about an output `target` that can be known before a command measures or
    solves anything, so that a bad path never loses the run: check_apart, then that it can
    be written: an existing target is a regular file, a character device or a pipe (with
    `directory`: a directory), and otherwise its nearest existing parent is a directory this
    user may create entries in. PlacerError in one line naming `what`; nothing is created."""
    check_apart(target, inputs, what=what, updates=updates)
    path = Path(os.path.abspath(target))
    try:
        st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        st = None
    except OSError as exc:  # worded as write_bytes_atomic words it
        raise PlacerError(f"cannot write {target}: {exc.strerror or exc}") from None
    if st is not None:
        if not directory and stat.S_ISDIR(st.st_mode):  # worded as write_text_atomic words it
            raise PlacerError(f"cannot write {target}: it is a directory (name a file)")
        if directory != stat.S_ISDIR(st.st_mode) and not (
                not directory and (stat.S_ISCHR(st.st_mode) or stat.S_ISFIFO(st.st_mode))):
            raise PlacerError(f"{what} {target} is not a {'directory' if directory else 'file'}")
        if not os.access(path, os.W_OK):
            raise PlacerError(f"{what} {target}: permission denied (cannot write it)")
        return
    parent = next(p for p in path.parents if os.path.lexists(p))
    if not os.path.isdir(parent):
        raise PlacerError(f"{what} {target}: {parent} is not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise PlacerError(f"{what} {target}: permission denied (cannot create entries in "
                          f"{parent})")


def check_outputs(outputs: Inputs, inputs: Inputs, *, directory: bool = False,
                  updates: Path | None = None) -> None:
    """What every command that writes calls once, before it reads, measures or solves
    anything: check_target (the rule, check_apart, then that the path can be written) for
    every output against every input of the command (all of them, not the first), and the
    outputs against each other: two options naming one path are refused (one inside the
    other is the command's to judge: `traces split` refuses nesting trace directories).
    `outputs`: (option, path) pairs, None paths skipped; `directory`: the outputs are
    directories the command fills; `updates`: as check_apart. Nothing is created."""
    given = [(what, Path(path)) for what, path in outputs if path is not None]
    inputs = list(inputs)
    for i, (what, path) in enumerate(given):
        check_target(path, inputs, what=what, directory=directory, updates=updates)
        for other, other_path in given[:i]:
            if os.path.realpath(path) == os.path.realpath(other_path):
                raise PlacerError(f"{what} {path} is also {other}: give each output its own "
                                  "path")


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except (OSError, ValueError):
        return False


@contextlib.contextmanager
def removed_on_failure(directory: Path) -> Iterator[None]:
    """Around code that fills `directory` (a trace directory): when it raises, an error or an
    interrupt, remove the files it added and `directory` itself, and the parents it made,
    where they are new (and left empty), so that a failed command leaves nothing behind."""
    directory = Path(directory)
    made = [p for p in [directory, *directory.parents] if not os.path.lexists(p)]
    before = set(os.listdir(directory)) if os.path.isdir(directory) else set()
    try:
        yield
    except BaseException:
        added = set(os.listdir(directory)) - before if os.path.isdir(directory) else set()
        for name in added:
            if not os.path.isdir(directory / name) or os.path.islink(directory / name):
                with contextlib.suppress(OSError):
                    os.unlink(directory / name)
        for path in made:  # innermost first
            with contextlib.suppress(OSError):
                path.rmdir()
        raise


@contextlib.contextmanager
def directory_output(target: Path, *, replace: bool = False, what: str = "--out"
                     ) -> Iterator[Path]:
    """A new hidden temporary sibling of `target` to fill; renamed onto `target` when the
    body ends without error (with `replace`, an existing `target` is swapped out and removed
    only then; without it an existing `target` is a PlacerError before anything is made). On
    any failure or interrupt the sibling, and every parent folder made for it, are removed."""
    target = Path(target)
    if os.path.lexists(target) and not (replace and target.is_dir()
                                        and not target.is_symlink()):
        raise PlacerError(f"{what} {target} already exists: name a new directory")
    made = [p for p in [*target.parents] if not os.path.lexists(p)]
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        temp = target.parent / temp_name(target.name, "dir")
        temp.mkdir()
    except OSError as exc:
        _remove_made(made)
        raise PlacerError(f"cannot write {target}: {exc.strerror or exc}") from None
    old = None
    try:
        yield temp
        if os.path.lexists(target):
            old = target.parent / temp_name(target.name, "old")
            target.rename(old)
        temp.rename(target)
    except BaseException:
        if old is not None and not os.path.lexists(target):
            old.rename(target)  # the previous output stays as it was
            old = None
        shutil.rmtree(temp, ignore_errors=True)
        _remove_made(made)
        raise
    finally:
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    fsync_dir(target.parent)


def _remove_made(made: list[Path]) -> None:
    """Remove the folders in `made` (innermost first) that are still empty."""
    for path in made:
        with contextlib.suppress(OSError):
            path.rmdir()


def temp_name(name: str, tag: str = "") -> str:
    """A hidden sibling name for `name` that fits NAME_MAX: `.<name>.<tag><8 hex>.tmp`, the
    name cut short where needed (a legal 245-byte name must still get a temporary)."""
    tail = f".{tag}{secrets.token_hex(4)}{TEMP_SUFFIX}"
    room = NAME_MAX - 1 - len(tail.encode())
    return "." + name.encode()[:room].decode(errors="ignore") + tail


def write_text_atomic(text: str, path: Path, inputs: Inputs = (), what: str = "--out") -> None:
    """Write `text` to `path` (see the module docstring); PlacerError in one line when the
    target is a directory, lies on or inside an input (check_apart: `inputs`, `what` names
    the option) or cannot be written."""
    write_bytes_atomic(text.encode(), path, inputs, what)


def write_bytes_atomic(data: bytes, path: Path, inputs: Inputs = (), what: str = "--out"
                       ) -> None:
    """Write `data` to `path` as write_text_atomic does (the module docstring)."""
    path = Path(path)
    check_apart(path, inputs, what=what)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise PlacerError(f"cannot write {path}: {exc.strerror}") from None
    if st is not None and not stat.S_ISREG(st.st_mode):
        _write_special(data, path, st.st_mode)
        return
    if path.is_symlink():
        path = Path(os.path.realpath(path))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        _replace_with(data, path)
    except OSError as exc:
        raise PlacerError(f"cannot write {path}: {exc.strerror or exc}") from None


def _write_special(data: bytes, path: Path, mode: int) -> None:
    if stat.S_ISDIR(mode):
        raise PlacerError(f"cannot write {path}: it is a directory (name a file)")
    if not (stat.S_ISCHR(mode) or stat.S_ISFIFO(mode)):
        raise PlacerError(f"cannot write {path}: not a regular file, character device or pipe")
    try:
        with open(path, "wb") as f:
            f.write(data)
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
