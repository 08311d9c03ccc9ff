"""Putting a complete placement in place, and only then: the lock, the staging directory
beside --out, the atomic swap (renameat2 RENAME_EXCHANGE) and the signals that must not cut
it short.

Emits into one --out are serialized by a lock; the new placement is written into a staging
directory beside --out (inside it when it is an existing empty directory) and put in place
when it is whole (commit_placement says what a crash at each point leaves); SIGINT and
SIGTERM remove what the emit wrote.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import json
import os
import shutil
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from placer.errors import PlacerError, held_for_import
from placer.files import NAME_MAX, fsync_dir
from placer.placed.layout import entry_len
from placer.placed.stream import DIRECT_BLOCK
from placer.units import format_bytes

# Where an emit into an existing empty directory stages its outputs (inside it, so that a
# mount point works).
IN_PLACE_STAGE = ".placer-emit.new"


def sibling(out_dir: Path, tag: str) -> Path:
    """The hidden sibling `.<name>.placer-<tag>` of `out_dir` (name cut to fit NAME_MAX): the
    new placement being written (`new`), the old one being swapped out (`old`), the lock."""
    tail = f".placer-{tag}"
    room = NAME_MAX - 1 - len(tail)
    return out_dir.parent / ("." + out_dir.name.encode()[:room].decode(errors="ignore") + tail)


def make_dirs(path: Path) -> list[Path]:
    """mkdir -p `path`; the directories it created, outermost first."""
    missing = [p for p in [path, *path.parents] if not p.exists()][::-1]
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise PlacerError(f"cannot create {path}: {exc.strerror or exc}") from None
    return missing


@contextlib.contextmanager
def output_lock(out_dir: Path) -> Iterator[None]:
    """Hold an exclusive flock on the lock file beside `out_dir` (removed after), so a second
    emit into the same directory is refused with one line. Where `out_dir`'s parent cannot
    be written, the existing `out_dir` itself is locked (nothing to remove)."""
    path = sibling(out_dir, "lock")
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        except OSError as exc:
            if not out_dir.is_dir():
                raise PlacerError(f"cannot write beside {out_dir}: {exc.strerror}") from None
            fd, path = os.open(out_dir, os.O_RDONLY | os.O_DIRECTORY), None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise PlacerError(f"another emit is writing {out_dir} (it holds "
                              f"{path or out_dir}); wait for it to finish") from None
        # its last holder may have removed the file between our open and flock: lock anew
        if path is None or _same_file(fd, path):
            break
        os.close(fd)
    try:
        yield
    finally:
        if path is not None:
            path.unlink(missing_ok=True)
        os.close(fd)


def _same_file(fd: int, path: Path) -> bool:
    try:
        return os.path.samestat(os.fstat(fd), os.stat(path))
    except FileNotFoundError:
        return False


def prepare_output(out_dir: Path, force: bool) -> str:
    """Under the lock: clear what a killed emit left (a staging directory; an old placement
    moved aside and not yet replaced is moved back), check `out_dir`; how the new placement
    will be put in place: "fresh" (no out_dir), "in_place" (an empty one) or "swap"."""
    new, old = sibling(out_dir, "new"), sibling(out_dir, "old")
    if old.is_dir():
        if out_dir.exists():
            shutil.rmtree(old)
        else:
            os.rename(old, out_dir)
    for stage in (new, out_dir / IN_PLACE_STAGE):
        if stage.is_dir():
            shutil.rmtree(stage)
    if not out_dir.exists():
        return "fresh"
    if not out_dir.is_dir():
        raise PlacerError(f"--out {out_dir} exists and is not a directory")
    if not any(out_dir.iterdir()):
        return "in_place"
    if not force:
        raise PlacerError(f"--out {out_dir} is not empty; pass --force to replace it")
    check_replaceable(out_dir)
    if os.stat(out_dir).st_dev != os.stat(out_dir.parent).st_dev:
        raise PlacerError(f"--out {out_dir} is a mount point: the new placement cannot be "
                          "written beside it and swapped in; empty it first")
    return "swap"


def check_replaceable(out_dir: Path) -> None:
    """What --force may replace: a placement, and nothing else. `out_dir` must hold a
    manifest.json naming its files, and nothing but that manifest and those files (a typo in
    --out must not delete a folder of the user's, nor a file put beside a placement)."""
    manifest = out_dir / "manifest.json"
    try:
        names = {f["name"] for f in json.loads(manifest.read_bytes())["files"]}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        why = "has none" if isinstance(exc, FileNotFoundError) else "cannot be read as one"
        raise PlacerError(f"--out {out_dir} is not a placement (its manifest.json {why}): "
                          "--force replaces only a directory placer emitted") from None
    foreign = sorted(p.name for p in out_dir.iterdir() if p.name not in names | {manifest.name})
    if foreign:
        raise PlacerError(f"--out {out_dir} holds {len(foreign)} entr"
                          f"{'y' if len(foreign) == 1 else 'ies'} its manifest does not name "
                          f"({foreign[0]!r}{', ...' if len(foreign) > 1 else ''}): --force "
                          "replaces only what placer emitted; move them or choose another --out")


def check_space(out_dir: Path, where: Path, laid: list, mode: str) -> None:
    """Refuse to start when the filesystem of `where` lacks the bytes of every output (the
    last O_DIRECT write of each may pass its end by a block before it is cut back)."""
    need = sum(len(h) + sum(entry_len(e) for e in es) + DIRECT_BLOCK for _, h, es in laid)
    free = shutil.disk_usage(where).free
    if free >= need:
        return
    beside = (" beside the old one, which stays until the new one is complete"
              if mode == "swap" else "")
    raise PlacerError(f"not enough disk space for {out_dir}: the new placement needs "
                      f"{format_bytes(need)}{beside}; {format_bytes(free)} free")


def commit_placement(stage: Path, out_dir: Path, mode: str, names: list[str]) -> Path | None:
    """Put the complete placement in `stage` in place of `out_dir`; the old placement's
    directory left to remove, if any. What a crash (power loss, SIGKILL) at each point leaves:

    - fresh: rename(stage, out_dir) is atomic: no out_dir, or the new one.
    - swap: renameat2(RENAME_EXCHANGE) swaps the two directories atomically (the old one
      ends at the staging name): the old out_dir or the new one. Where the filesystem lacks
      it: rename(out_dir, .old), then rename(stage, out_dir): between the two out_dir is
      missing and .old holds the old placement, which the next emit moves back.
    - in_place (out_dir was empty): the outputs are renamed in, manifest.json last, so
      out_dir has no manifest until every output is in place.
    Either way every leftover (staging, .old) is cleared by the next emit into out_dir.
    """
    if mode == "fresh":
        os.rename(stage, out_dir)
        fsync_dir(out_dir.parent)
        return None
    if mode == "swap":
        if exchange(stage, out_dir):
            fsync_dir(out_dir.parent)
            return stage
        old = sibling(out_dir, "old")
        os.rename(out_dir, old)
        try:
            os.rename(stage, out_dir)
        except BaseException:
            os.rename(old, out_dir)
            raise
        fsync_dir(out_dir.parent)
        return old
    moved = []
    try:
        for name in [*names, "manifest.json"]:
            os.rename(stage / name, out_dir / name)
            moved.append(out_dir / name)
        stage.rmdir()
    except BaseException:
        for path in moved:
            path.unlink(missing_ok=True)
        raise
    fsync_dir(out_dir)
    return None


def exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically (Linux renameat2 RENAME_EXCHANGE); False where the C library
    or the filesystem lacks it."""
    renameat2 = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    if renameat2 is None:
        return False
    at_fdcwd, rename_exchange = -100, 2
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(b))


def discard(stage: Path) -> Path | None:
    """Remove a staging directory; itself if it could not be removed."""
    try:
        shutil.rmtree(stage)
    except FileNotFoundError:
        pass
    except OSError:
        return stage
    return None


class Interrupted(KeyboardInterrupt):
    """SIGTERM (or SIGINT) while a command or an emit runs: raised in the main thread, so it
    cleans up as on Ctrl-C; the CLI then prints one line, `error: interrupted by SIGTERM;
    nothing partial was left behind`, and exits 143 (130 for SIGINT:
    placer.commands.common.command)."""


class Signals:
    """While a command (placer.cli) or an emit runs in the main thread, SIGINT and SIGTERM
    raise Interrupted there, once: from the first, or from `hold()` (an error is being cleaned
    up, or the complete new placement is being put in place), further ones are ignored, so
    that the cleanup or the swap finishes. The previous handlers come back on exit.

    Python runs a signal's handler between any two bytecodes of the main thread, also inside
    a finalizer (`__del__`, a weakref callback, a generator closed by the garbage collector),
    where an exception cannot propagate: Python prints `Exception ignored in ...` and goes on.
    An Interrupted lost there would leave the command running with further signals ignored
    (1 SIGTERM in 22 to `collect`, issue 53), so while Signals is active sys.unraisablehook
    catches it and a thread sends the signal to the main thread again as soon as the hook
    has returned (the hook cannot: a signal sent from Python code is handled right after
    the call that sends it, in the hook, and lost there too; the switch interval is cut to
    SWITCH_S meanwhile so that the thread gets its turn within a few bytecodes), to be
    handled at a bytecode outside the finalizer (or lost again in the next one and sent
    again: each finalizer ends).

    A signal that arrives while the main thread imports a module waits for the import to
    finish (placer.errors.held_for_import)."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)
    SWITCH_S = 1e-5

    def __init__(self) -> None:
        self.held = False
        self.raised = False
        self.lost: signal.Signals | None = None  # an Interrupted a finalizer swallowed
        self.in_hook = False
        self.previous: dict[int, object] = {}
        self.previous_hook: object = None

    def __enter__(self) -> Signals:
        if threading.current_thread() is threading.main_thread():
            self.previous = {s: signal.signal(s, self._raise) for s in self.SIGNALS}
            self.previous_hook, sys.unraisablehook = sys.unraisablehook, self._unraisable
        return self

    def hold(self) -> None:
        self.held = True

    def _raise(self, signum: int, frame: object) -> None:
        if self.held or self.raised or self.in_hook:
            return
        if held_for_import(signum, frame):
            return
        self.raised, self.lost = True, None
        raise Interrupted(signal.Signals(signum).name)

    def _unraisable(self, unraisable: Any) -> None:
        """An Interrupted swallowed by a finalizer: the signal again (class docstring)."""
        exc = unraisable.exc_value
        if not isinstance(exc, Interrupted) or self.previous_hook is None:
            hook = self.previous_hook or sys.__unraisablehook__
            hook(unraisable)
            return
        self.in_hook = True
        try:
            self.lost = signal.Signals[str(exc)]
            again = threading.Thread(target=self._again, args=(sys.getswitchinterval(),),
                                     name="placer-signal-again", daemon=True)
            sys.setswitchinterval(self.SWITCH_S)
            again.start()
        finally:
            self.in_hook = False  # the last bytecode before the hook returns

    def _again(self, interval: float) -> None:
        """The lost signal to the main thread once it has left the hook, unless Signals has
        ended or raised since."""
        try:
            while self.in_hook:
                time.sleep(0)
            signum = self.lost
            if signum is not None and self.previous_hook is not None:
                self.raised = False
                signal.pthread_kill(threading.main_thread().ident, signum)
        finally:
            sys.setswitchinterval(interval)

    def __exit__(self, *exc: object) -> None:
        for s, handler in self.previous.items():
            signal.signal(s, handler)
        if self.previous_hook is not None:
            sys.unraisablehook, self.previous_hook = self.previous_hook, None
        self.lost = None
