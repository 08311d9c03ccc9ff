"""From a plan and its checkpoint to the placed directory a serving host loads.

card<N>.safetensors holds card N's resident expert bytes: a fully resident expert stored
as whole per-expert tensors keeps each under its original name, dtype and shape; anything
else resident (pages of a partly resident expert, slices of fused 3D tensors) is one uint8
tensor per page, `res.L<layer>.E<expert>.P<page>`. host<G>.safetensors holds, for the cards of
host-link group G, each expert's cold suffix as ONE uint8 tensor `cold.L<layer>.E<expert>`,
ordered by layer, then card, then expert. Every tensor of every file starts at an absolute
file offset that is a multiple of `align` (the header is padded with spaces, gaps are
`pad.<n>` uint8 tensors, as safetensors wants tensors to tile the data section), so staging a
cold part is one aligned copy. manifest.json is written last (see docs/manifest.md).

Each output is written from the source bytes read, 1 MiB at a time, into reused write
buffers, each piece hashed while it is still in the CPU cache: the output is never re-read
to hash it. That beat os.copy_file_range plus a re-read of every output by 1.4-2x here (with
source offsets unaligned to the output's, copy_file_range goes through splice page by page),
and writing straight from an mmap of the source was slower still (the kernel's copy faults on
each not-yet-mapped source page, zeroes what it wrote and retries). Writes bypass the page
cache where the filesystem allows (O_DIRECT, see OutputStream). Outputs are written into a
staging directory beside --out (inside it when it is an existing empty directory), several
at once on worker threads (os.preadv, os.pwrite and hashlib release the GIL), while other
workers hash the source files (unless their digests are remembered, digests.py); each output
is fsynced once it is whole, and the complete placement (manifest included) is put in place
only when every one is: a placement being replaced with --force stays valid until then
(commit_placement says what a crash at each point leaves). Emits into one --out are
serialized by a lock; SIGINT and SIGTERM remove what the emit wrote.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import hashlib
import json
import mmap
import os
import shutil
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TypeVar

from placer import digests
from placer.errors import PlacerError
from placer.files import NAME_MAX, dumps_json, fsync_dir
from placer.inventory import Expert, Inventory, read_inventory
from placer.manifest import MANIFEST_FORMAT, validate_manifest
from placer.plan import Plan
from placer.units import format_bytes

# Bytes per read and hashlib update: small enough to stay in the CPU cache between the two.
READ_BYTES = 1 << 20
# Bytes per output write: a large O_DIRECT write goes to the disk as several requests at
# once (one 1 MiB write at a time: 1.0-2.0 GB/s here; 16 MiB: 1.5-2.3 GB/s). Each output
# being written holds two such buffers.
WRITE_BYTES = 16 << 20
# Bytes written to an output between two background fdatasyncs of it, so the disk flushes
# while emit writes rather than all at the end (the kernel alone starts at gigabytes dirty);
# only where the filesystem refuses O_DIRECT (see OutputStream).
FLUSH_BYTES = 256 << 20
# What O_DIRECT writes are padded to: a multiple of the logical block size of any disk.
DIRECT_BLOCK = 4096

T = TypeVar("T")


@dataclass(frozen=True)
class Segment:
    """`length` bytes at absolute `offset` of source `file`, from source tensor `tensor`
    (dtype, shape of the whole tensor) at byte `start` of its data."""

    file: str
    offset: int
    length: int
    tensor: str
    dtype: str
    shape: tuple[int, ...]
    start: int


@dataclass
class Entry:
    """One output tensor: its header fields and the source segments that fill it."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    segments: list[Segment]
    owner: tuple[int, int] | None = None  # (layer, expert); None for padding
    stream: int = 0  # where the entry starts in its expert's byte stream
    offset: int = 0  # absolute offset in its output file, set by layout()

    @property
    def length(self) -> int:
        return sum(s.length for s in self.segments)


@dataclass
class OutputFile:
    name: str
    kind: str
    card: int | None
    link: int | None
    entries: list[Entry] = field(default_factory=list)


def stream_segments(expert: Expert, begin: int, end: int) -> list[Segment]:
    """Source segments of bytes [begin, end) of an expert's byte stream (tensors in order)."""
    out, pos = [], 0
    for t in expert.tensors:
        lo, hi = max(begin, pos), min(end, pos + t.length)
        if lo < hi:
            whole = t.fused_shape if t.fused_shape is not None else t.shape
            out.append(Segment(t.file, t.offset + lo - pos, hi - lo, t.name, t.dtype,
                               tuple(whole), t.tensor_offset + lo - pos))
        pos += t.length
    return out


def plan_files(plan: Plan, inv: Inventory) -> list[OutputFile]:
    """What goes in every output file, in order (see module docstring)."""
    cards = [OutputFile(f"card{c.index}.safetensors", "card", c.index, None) for c in plan.cards]
    groups = plan.hardware.groups()
    hosts = [OutputFile(f"host{g}.safetensors", "host", None, g) for g in range(len(groups))]
    group_of = {c: g for g, members in enumerate(groups) for c in members}
    for ep in plan.experts:
        ex = inv.expert(ep.layer, ep.expert)
        whole = ep.resident_bytes == ep.bytes and all(t.fused_shape is None for t in ex.tensors)
        if whole:
            cards[ep.card].entries += [
                Entry(t.name, t.dtype, tuple(t.shape), stream_segments(ex, pos, pos + t.length),
                      (ep.layer, ep.expert), pos)
                for t, pos in zip(ex.tensors, _starts(ex), strict=True)]
        else:
            cards[ep.card].entries += [
                Entry(f"res.L{ep.layer}.E{ep.expert}.P{p.index}", "U8", (p.length,),
                      stream_segments(ex, p.offset, p.offset + p.length),
                      (ep.layer, ep.expert), p.offset)
                for p in ep.pages if p.resident]
    for ep in sorted(plan.experts, key=lambda e: (e.layer, e.card, e.expert)):
        cold = ep.bytes - ep.resident_bytes
        if cold:
            ex = inv.expert(ep.layer, ep.expert)
            hosts[group_of[ep.card]].entries.append(
                Entry(f"cold.L{ep.layer}.E{ep.expert}", "U8", (cold,),
                      stream_segments(ex, ep.resident_bytes, ep.bytes),
                      (ep.layer, ep.expert), ep.resident_bytes))
    return cards + hosts


def _starts(ex: Expert) -> list[int]:
    pos, out = 0, []
    for t in ex.tensors:
        out.append(pos)
        pos += t.length
    return out


def layout(entries: list[Entry], align: int) -> tuple[bytes, list[Entry]]:
    """The safetensors header (padded so data starts aligned) and the entries with pad
    tensors between them; sets each entry's absolute offset."""
    with_pads: list[Entry] = []
    rel = 0
    for e in entries:
        gap = -rel % align
        if gap:
            with_pads.append(Entry(f"pad.{len(with_pads)}", "U8", (gap,), []))
            rel += gap
        with_pads.append(e)
        rel += e.length
    header: dict = {}
    pos = 0
    for e in with_pads:
        header[e.name] = {"dtype": e.dtype, "shape": list(e.shape),
                          "data_offsets": [pos, pos + _entry_len(e)]}
        pos += _entry_len(e)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-(8 + len(text)) % align)
    data_start = 8 + len(text)
    pos = data_start
    for e in with_pads:
        e.offset = pos
        pos += _entry_len(e)
    return len(text).to_bytes(8, "little") + text, with_pads


def _entry_len(e: Entry) -> int:
    return e.length if e.segments else e.shape[0]


def _write_all(fd: int, data: bytes | memoryview, offset: int) -> None:
    """Write all of `data` at `offset` of fd `fd`."""
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n


def pread_into(fd: int, buf: memoryview, offset: int) -> int:
    """Read up to len(buf) bytes at `offset` of fd `fd` into `buf`; the count read."""
    if hasattr(os, "preadv"):
        return os.preadv(fd, [buf], offset)
    data = os.pread(fd, len(buf), offset)
    buf[:len(data)] = data
    return len(data)


def copy_runs(entries: Iterable[Entry]) -> Iterator[tuple[str, int, int] | bytes]:
    """What an output file's data section is made of, in order: (source file, offset,
    length) for source bytes, merged where segments follow each other in the same source
    file (a whole expert's tensors often do), and bytes for padding."""
    run: tuple[str, int, int] | None = None
    for e in entries:
        if not e.segments:
            if run:
                yield run
                run = None
            yield bytes(e.shape[0])
        for s in e.segments:
            if run and run[0] == s.file and run[1] + run[2] == s.offset:
                run = (s.file, run[1], run[2] + s.length)
                continue
            if run:
                yield run
            run = (s.file, s.offset, s.length)
    if run:
        yield run


class OutputStream:
    """An output file written through two page-aligned WRITE_BYTES buffers: while one is
    written (on the `io` pool), the next is filled from the source, READ_BYTES at a time, each
    piece hashed as soon as it is read, so reading and hashing overlap the disk.

    Writes bypass the page cache (O_DIRECT) where the filesystem allows it: emit never reads
    its outputs back, and allocating page cache for every byte written cost more kernel time
    here than the copy itself (1.2 GB: 4.8-5.6 s of system time buffered, 0.3 s direct), and
    would evict the checkpoint being read. O_DIRECT wants block-aligned offsets, lengths and
    addresses: every write is a whole buffer at a multiple of WRITE_BYTES except the last,
    which is padded to DIRECT_BLOCK and cut back by ftruncate. A filesystem that refuses
    O_DIRECT, when it is set or at a write, gets buffered writes and an fdatasync every
    FLUSH_BYTES."""

    def __init__(self, path: Path, io: ThreadPoolExecutor, flush: Callable[[int], None]) -> None:
        self.bufs = [memoryview(mmap.mmap(-1, WRITE_BYTES)) for _ in range(2)]
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        self.direct = set_direct(self.fd, True)
        self.io, self.flush = io, flush
        self.fill = self.size = self.unflushed = 0
        self.hash = hashlib.sha256()
        self.pending: Future | None = None

    def put(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            n = min(len(view), WRITE_BYTES - self.fill)
            piece = self.bufs[0][self.fill:self.fill + n]
            piece[:] = view[:n]
            self._filled(piece)
            view = view[n:]

    def put_source(self, fd: int, name: str, offset: int, length: int) -> None:
        """Append `length` bytes at `offset` of source file `fd` (called `name`)."""
        end = offset + length
        while offset < end:
            n = min(end - offset, READ_BYTES, WRITE_BYTES - self.fill)
            piece = self.bufs[0][self.fill:self.fill + n]
            if pread_into(fd, piece, offset) != n:
                raise PlacerError(f"source file {name} ended early (was it truncated?)")
            self._filled(piece)
            offset += n

    def _filled(self, piece: memoryview) -> None:
        self.hash.update(piece)
        self.fill += len(piece)
        if self.fill == WRITE_BYTES:
            self._ship()

    def _ship(self) -> None:
        """Once the other buffer's write is done, start writing this one and fill the other
        next. Under O_DIRECT a short last write is padded with whatever the buffer holds
        beyond what was filled; finish() cuts that off."""
        self._wait()
        padded = self.fill + (-self.fill % DIRECT_BLOCK if self.direct else 0)
        self.pending = self.io.submit(self._write, self.bufs[0][:padded], self.size)
        self.size += self.fill
        self.bufs.reverse()
        self.fill = 0

    def _write(self, view: memoryview, offset: int) -> None:
        _, self.direct = direct_io(self.fd, self.direct, partial(_write_all, self.fd, view, offset))
        self.unflushed += len(view)
        if not self.direct and self.unflushed >= FLUSH_BYTES:
            self.flush(self.fd)
            self.unflushed = 0

    def _wait(self) -> None:
        if self.pending is not None:
            pending, self.pending = self.pending, None
            pending.result()

    def finish(self) -> str:
        """Write what is left and cut the padding; the file's sha256 (fsync is the caller's)."""
        if self.fill:
            self._ship()
        self._wait()
        if os.fstat(self.fd).st_size != self.size:
            os.ftruncate(self.fd, self.size)
        return self.hash.hexdigest()

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._wait()  # never close the fd under a write still running
        os.close(self.fd)


def set_direct(fd: int, on: bool) -> bool:
    """Turn O_DIRECT on or off for `fd`; whether it is now on."""
    flag = getattr(os, "O_DIRECT", 0)
    if not flag:
        return False
    flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    try:
        fcntl.fcntl(fd, fcntl.F_SETFL, flags | flag if on else flags & ~flag)
    except OSError:
        return False
    return on


def direct_io(fd: int, direct: bool, io: Callable[[], T]) -> tuple[T, bool]:
    """Run the read or write `io` on `fd`; where O_DIRECT is on (`direct`) and the filesystem,
    having taken it at fcntl, refuses this transfer (EINVAL), turn it off and run `io` again
    buffered. (`io`'s result, whether O_DIRECT is still on.)"""
    try:
        return io(), direct
    except OSError as exc:
        if not (direct and exc.errno == errno.EINVAL):
            raise
    direct = set_direct(fd, False)
    return io(), direct


def write_file(path: Path, header: bytes, entries: Iterable[Entry], sources: dict[str, int],
               advance: Callable[[int], None], abort: threading.Event, io: ThreadPoolExecutor,
               flush: Callable[[int], None]) -> str:
    """Write one safetensors file from its header, entries and the source files (open fds,
    by name) through an OutputStream; its sha256."""
    out = OutputStream(path, io, flush)
    try:
        out.put(header)
        for run in copy_runs(entries):
            if isinstance(run, bytes):
                out.put(run)
                continue
            file, offset, length = run
            for start in range(offset, offset + length, READ_BYTES):
                if abort.is_set():
                    raise PlacerError(f"writing {path.name} was cancelled")
                want = min(READ_BYTES, offset + length - start)
                out.put_source(sources[file], file, start, want)
                advance(want)
        return out.finish()
    finally:
        out.close()


def fdatasync_and_close(fd: int) -> None:
    try:
        os.fdatasync(fd)
    finally:
        os.close(fd)


def fsync_path(path: Path) -> None:
    """fsync a file already written and closed (fsync flushes the file, whatever the fd)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sha256_file(path: Path, abort: threading.Event | None = None) -> str:
    """The file's sha256; raises PlacerError early once `abort` is set.

    Hashes through mmap: hashlib reads the page cache in place, where read() would first
    copy every byte into a buffer (as much kernel time again as the hash takes, here). As for
    any mmap reader (safetensors' own loader too), a file truncated while it is being hashed
    ends the process with SIGBUS."""
    h = hashlib.sha256()
    with open(path, "rb", buffering=0) as f:
        size = os.fstat(f.fileno()).st_size
        if not size:  # mmap refuses an empty file
            return h.hexdigest()
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            if hasattr(m, "madvise"):
                m.madvise(mmap.MADV_SEQUENTIAL)
            for start in range(0, size, READ_BYTES):
                if abort is not None and abort.is_set():
                    raise PlacerError(f"hashing {path} was cancelled")
                with memoryview(m)[start:start + READ_BYTES] as piece:
                    h.update(piece)
    return h.hexdigest()


def emit_placement(plan: Plan, model_dir: Path, out_dir: Path, *, align: int = 4096,
                   force: bool = False, progress: bool = False) -> dict:
    """Write the placed directory for `plan` from the checkpoint `model_dir`; the manifest.

    The new placement is written whole into a staging directory and only then put in place
    (see commit_placement), under an exclusive lock on `out_dir` (output_lock); SIGINT and
    SIGTERM stop the writing and remove what it wrote (_Signals)."""
    model_dir, out_dir = Path(model_dir), Path(out_dir)
    if align < 8 or align & (align - 1):
        raise PlacerError(f"--align must be a power of two >= 8, not {align}")
    if plan.model.get("estimated"):
        raise PlacerError("this plan was solved from a config alone (no checkpoint bytes): "
                          "solve it against the downloaded checkpoint to emit")
    inv = read_inventory(model_dir)
    if inv.fingerprint != plan.model["fingerprint"]:
        raise PlacerError(f"the plan is for model {plan.model['fingerprint']}, but {model_dir} "
                          f"is model {inv.fingerprint} (another model, or its headers changed)")
    if out_dir.is_symlink():  # replace the directory it names, not the link
        out_dir = Path(os.path.realpath(out_dir))
    check_apart(out_dir, model_dir, [s.name for s in inv.files] + ["config.json"])
    if out_dir.exists() and not out_dir.is_dir():
        raise PlacerError(f"--out {out_dir} exists and is not a directory")
    laid = [(f, *layout(f.entries, align)) for f in plan_files(plan, inv)]
    with _Signals() as signals:
        made = make_dirs(out_dir.parent)
        try:
            with output_lock(out_dir):
                return _emit_locked(plan, inv, model_dir, out_dir, laid, align, force,
                                    progress, signals)
        except BaseException:
            signals.hold()
            for d in reversed(made):
                with contextlib.suppress(OSError):
                    d.rmdir()
            raise


def _emit_locked(plan: Plan, inv: Inventory, model_dir: Path, out_dir: Path, laid: list,
                 align: int, force: bool, progress: bool, signals: _Signals) -> dict:
    mode = prepare_output(out_dir, force)
    stage = out_dir / IN_PLACE_STAGE if mode == "in_place" else sibling(out_dir, "new")
    check_space(out_dir, stage.parent, laid, mode)
    total = sum(e.length for _, _, es in laid for e in es if e.segments)
    try:
        stage.mkdir()
        paths = [stage / f.name for f, _, _ in laid]
        manifest = write_outputs(plan, inv, model_dir, laid, paths, align, progress, total,
                                 signals.hold)
        write_manifest(manifest, stage / "manifest.json")
        signals.hold()  # from here the new placement is complete: finish putting it in place
        old = commit_placement(stage, out_dir, mode, [p.name for p in paths])
    except OSError as exc:
        signals.hold()
        left = discard(stage)
        kept = "; the old placement is unchanged" if mode == "swap" else ""
        raise PlacerError(f"writing {out_dir} failed: {exc.strerror or exc} ("
                          + (f"{left} could not be removed" if left else
                             "nothing was left behind") + f"{kept})") from None
    except BaseException:
        signals.hold()
        discard(stage)
        raise
    if old is not None:  # best effort: the next emit into out_dir removes what is left
        shutil.rmtree(old, ignore_errors=True)
    return manifest


def write_manifest(manifest: dict, path: Path) -> None:
    """Write the manifest (strict JSON) into the staging directory and fsync it: no temporary
    name is needed there, nothing reads the directory before it is put in place."""
    with open(path, "w") as f:
        f.write(dumps_json(manifest) + "\n")
        f.flush()
        os.fsync(f.fileno())


# Where an emit into an existing empty directory stages its outputs (inside it, so that a
# mount point works).
IN_PLACE_STAGE = ".placer-emit.new"


def sibling(out_dir: Path, tag: str) -> Path:
    """The hidden sibling `.<name>.placer-<tag>` of `out_dir` (name cut to fit NAME_MAX): the
    new placement being written (`new`), the old one being swapped out (`old`), the lock."""
    tail = f".placer-{tag}"
    room = NAME_MAX - 1 - len(tail)
    return out_dir.parent / ("." + out_dir.name.encode()[:room].decode(errors="ignore") + tail)


def check_apart(out_dir: Path, model_dir: Path, names: list[str]) -> None:
    """Refuse an --out equal to, inside or holding the checkpoint or any of its source files
    (symlinks resolved: a Hugging Face snapshot's files are links into its blobs)."""
    out, src = out_dir.resolve(), model_dir.resolve()
    if out == src or src in out.parents:
        raise PlacerError(f"--out {out_dir} is inside the checkpoint {model_dir}: writing there "
                          "would change the source; choose a directory outside it")
    for path in [src, *((model_dir / n).resolve() for n in names)]:
        if out in path.parents:
            raise PlacerError(f"--out {out_dir} holds the checkpoint's {path}: replacing it "
                              "would delete the source; choose another directory")


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
    if os.stat(out_dir).st_dev != os.stat(out_dir.parent).st_dev:
        raise PlacerError(f"--out {out_dir} is a mount point: the new placement cannot be "
                          "written beside it and swapped in; empty it first")
    return "swap"


def check_space(out_dir: Path, where: Path, laid: list, mode: str) -> None:
    """Refuse to start when the filesystem of `where` lacks the bytes of every output (the
    last O_DIRECT write of each may pass its end by a block before it is cut back)."""
    need = sum(len(h) + sum(_entry_len(e) for e in es) + DIRECT_BLOCK for _, h, es in laid)
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
    """SIGTERM (or SIGINT) while an emit writes: raised in the main thread, so the emit
    cleans up as on Ctrl-C (the CLI then prints "Aborted!" and exits 1)."""


class _Signals:
    """While an emit runs in the main thread, SIGINT and SIGTERM raise Interrupted there, once:
    from the first, or from `hold()` (an error is being cleaned up, or the complete new
    placement is being put in place), further ones are ignored, so that the cleanup or the
    swap finishes. The previous handlers come back on exit."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self.held = False
        self.previous: dict[int, object] = {}

    def __enter__(self) -> _Signals:
        if threading.current_thread() is threading.main_thread():
            self.previous = {s: signal.signal(s, self._raise) for s in self.SIGNALS}
        return self

    def hold(self) -> None:
        self.held = True

    def _raise(self, signum: int, frame: object) -> None:
        if self.held:
            return
        self.held = True
        raise Interrupted(signal.Signals(signum).name)

    def __exit__(self, *exc: object) -> None:
        for s, handler in self.previous.items():
            signal.signal(s, handler)


def write_outputs(plan: Plan, inv: Inventory, model_dir: Path, laid: list, paths: list[Path],
                  align: int, progress: bool, total: int,
                  stopping: Callable[[], None] = lambda: None) -> dict:
    """Write every output to its path (in the staging directory), fsynced; the validated
    manifest.

    One thread per core takes jobs longest first: writing (and hashing) one output, or
    hashing one source file whose digest is not remembered from an earlier emit (digests.py).
    Both run at the speed of sha256, and a job cannot be split, so longest-first keeps a
    large source file from being hashed last. An output's buffers are written by an `io`
    thread while its job fills and hashes the next, and it is fsynced by a `syncers` thread
    as soon as it is whole (and, where writes are buffered, every FLUSH_BYTES). On any error
    the workers are stopped before this returns (`stopping` is called first), so the caller
    can clean up.
    """
    abort = threading.Event()
    names = [s.name for s in inv.files] + ["config.json"]
    with contextlib.ExitStack() as stack:
        sources = {s.name: os.open(model_dir / s.name, os.O_RDONLY) for s in inv.files}
        for fd in sources.values():
            stack.callback(os.close, fd)
        # workers last, so they are stopped first: they submit to the other two
        syncers = stack.enter_context(ThreadPoolExecutor(len(paths)))
        io = stack.enter_context(ThreadPoolExecutor(len(paths)))  # each output's writes
        workers = stack.enter_context(ThreadPoolExecutor(os.cpu_count() or 1))
        try:
            advance = stack.enter_context(_progress(progress, total))

            flushes: list[Future] = []

            def flush(fd: int) -> None:
                flushes.append(syncers.submit(fdatasync_and_close, os.dup(fd)))

            def write(header: bytes, entries: list[Entry], path: Path) -> tuple[str, Future]:
                digest = write_file(path, header, entries, sources, advance, abort, io, flush)
                return digest, syncers.submit(fsync_path, path)

            known = digests.cached([model_dir / n for n in names])
            began = time.time()
            keys = {n: digests.stat_key(model_dir / n) for n in names
                    if model_dir / n not in known}
            # (bytes to hash, path, job): an output costs its write on top of its hash
            jobs = [((model_dir / n).stat().st_size, model_dir / n,
                     partial(sha256_file, model_dir / n, abort)) for n in keys]
            jobs += [(2 * sum(e.length for e in entries), path,
                      partial(write, header, entries, path))
                     for (_, header, entries), path in zip(laid, paths, strict=True)]
            futures = {path: workers.submit(job)
                       for _, path, job in sorted(jobs, key=lambda j: -j[0])}
            done = [futures[path].result() for path in paths]
            outputs = [{"name": f.name, "kind": f.kind, "card": f.card, "link": f.link,
                        "size": path.stat().st_size, "sha256": digest}
                       for (f, _, _), path, (digest, _) in zip(laid, paths, done, strict=True)]
            source_sha = {n: known.get(model_dir / n) or futures[model_dir / n].result()
                          for n in names}
            manifest = build_manifest(plan, inv, model_dir, laid, outputs, align, source_sha)
            validate_manifest(manifest)
            for synced in [*flushes, *(synced for _, synced in done)]:
                synced.result()
            digests.remember({model_dir / n: (key, source_sha[n], began)
                              for n, key in keys.items()})
            return manifest
        except BaseException:
            stopping()
            abort.set()
            raise


class _progress:
    """A rich progress bar in bytes (a no-op when `enabled` is False)."""

    def __init__(self, enabled: bool, total: int) -> None:
        self.enabled, self.total = enabled, total

    def __enter__(self) -> Callable[[int], None]:
        if not self.enabled:
            return lambda n: None
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            Progress,
            TimeRemainingColumn,
            TransferSpeedColumn,
        )

        self.bar = Progress("emit", BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                            TimeRemainingColumn(), transient=True)
        self.bar.__enter__()
        task = self.bar.add_task("emit", total=self.total)
        return lambda n: self.bar.advance(task, n)

    def __exit__(self, *exc: object) -> None:
        if self.enabled:
            self.bar.__exit__(*exc)


def build_manifest(plan: Plan, inv: Inventory, model_dir: Path, laid: list, outputs: list,
                   align: int, source_sha: dict[str, str]) -> dict:
    """The plan plus where every byte landed (see docs/manifest.md); `source_sha` is the
    sha256 of every source file and config.json, by name."""
    pieces: dict[tuple[int, int], list[dict]] = {}
    for f, _, entries in laid:
        for e in entries:
            if e.owner is not None:
                pieces.setdefault(e.owner, []).extend(entry_pieces(f.name, e))
    d = plan.to_json()
    d["format"] = MANIFEST_FORMAT
    d["source"] = {"dir": str(model_dir.resolve()),
                   "files": [{"name": s.name, "size": s.size, "sha256": source_sha[s.name]}
                             for s in inv.files]
                   + [{"name": "config.json", "size": (model_dir / "config.json").stat().st_size,
                       "sha256": source_sha["config.json"]}]}
    d["align"] = align
    d["files"] = outputs
    d["dense"] = [{"name": t.name, "file": t.file, "offset": t.offset, "length": t.length,
                   "dtype": t.dtype, "shape": list(t.shape),
                   "cards": [c.index for c in plan.cards]} for t in inv.dense_tensors]
    for ed, ep in zip(d["experts"], plan.experts, strict=True):
        ex = inv.expert(ep.layer, ep.expert)
        ed["tensors"] = [{"name": t.name, "dtype": t.dtype, "shape": list(t.shape),
                          "stream_offset": pos, "length": t.length, "source_file": t.file,
                          "source_offset": t.offset,
                          "fused_shape": list(t.fused_shape) if t.fused_shape else None,
                          "tensor_offset": t.tensor_offset}
                         for t, pos in zip(ex.tensors, _starts(ex), strict=True)]
        mine = sorted(pieces.get((ep.layer, ep.expert), []), key=lambda p: p["stream"])
        cold = [p for p in mine if p["stream"] >= ep.resident_bytes]
        ed["cold"] = None if not cold else {
            "file": cold[0]["file"], "tensor": cold[0]["tensor"], "offset": cold[0]["offset"],
            "length": ep.bytes - ep.resident_bytes}
        for pd in ed["pages"]:
            lo, hi = pd["offset"], pd["offset"] + pd["length"]
            pd["pieces"] = [_clip(p, lo, hi) for p in mine
                            if p["stream"] < hi and p["stream"] + p["length"] > lo]
    return d


def entry_pieces(file: str, e: Entry) -> list[dict]:
    """One piece per source segment of an output tensor, with its expert-stream offset."""
    out, start = [], 0
    for s in e.segments:
        out.append({"file": file, "tensor": e.name, "start": start, "offset": e.offset + start,
                    "length": s.length, "stream": e.stream + start,
                    "origin": {"tensor": s.tensor, "source_file": s.file, "dtype": s.dtype,
                               "shape": list(s.shape), "start": s.start}})
        start += s.length
    return out


def _clip(p: dict, lo: int, hi: int) -> dict:
    """Piece `p` cut to stream range [lo, hi) (pages never straddle an output tensor, but a
    whole tensor may hold several pages of a fully resident expert)."""
    a, b = max(lo, p["stream"]), min(hi, p["stream"] + p["length"])
    cut = a - p["stream"]
    return {"file": p["file"], "tensor": p["tensor"], "start": p["start"] + cut,
            "offset": p["offset"] + cut, "length": b - a,
            "origin": {**p["origin"], "start": p["origin"]["start"] + cut}}
