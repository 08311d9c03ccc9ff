"""From a plan and its checkpoint to the placed directory a serving host loads.

The files and their byte layout are `placer.placed.layout`'s; each output is streamed from the
source bytes by `placer.placed.stream`, several at once on worker threads (os.preadv,
os.pwrite and hashlib release the GIL), while other workers hash the source files (unless
their digests are remembered, `placer.placed.digests`); each output is fsynced once it is
whole, and the complete placement (manifest included, `placer.placed.manifest`) is put in
place only when every one is (`placer.placed.commit`): a placement being replaced with --force
stays valid until then. Emits into one --out are serialized by a lock; SIGINT and SIGTERM
remove what the emit wrote.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from pathlib import Path

from placer.checkpoint.inventory import Inventory, read_inventory
from placer.errors import PlacerError
from placer.files import check_apart
from placer.placed import digests
from placer.placed.commit import (
    IN_PLACE_STAGE,
    Signals,
    check_space,
    commit_placement,
    discard,
    make_dirs,
    output_lock,
    prepare_output,
    sibling,
)
from placer.placed.layout import Entry, layout, plan_files
from placer.placed.manifest import build_manifest, validate_manifest, write_manifest
from placer.placed.stream import fdatasync_and_close, fsync_path, sha256_file, write_file
from placer.plan.placement import Plan
from traces.options import check_rules


def emit_placement(plan: Plan, model_dir: Path, out_dir: Path, *, align: int = 4096,
                   force: bool = False, progress: bool = False) -> dict:
    """Write the placed directory for `plan` from the checkpoint `model_dir`; the manifest.

    The new placement is written whole into a staging directory and only then put in place
    (see commit_placement), under an exclusive lock on `out_dir` (output_lock); SIGINT and
    SIGTERM stop the writing and remove what it wrote (Signals)."""
    model_dir, out_dir = Path(model_dir), Path(out_dir)
    check_rules({"align": align}, "emit", error=PlacerError)
    if plan.engine is not None:
        raise PlacerError(f"this plan was solved with --engine {plan.engine.get('name')}: that "
                          "engine reads its own model files (placer export llamacpp prints "
                          "its command); emit is for placer's runtime")
    if plan.model.get("estimated"):
        raise PlacerError("this plan was solved from a config alone (no checkpoint bytes): "
                          "solve it against the downloaded checkpoint to emit")
    inv = read_inventory(model_dir, gguf=False)
    if inv.fingerprint != plan.model["fingerprint"]:
        raise PlacerError(f"the plan is for model {plan.model['fingerprint']}, but {model_dir} "
                          f"is model {inv.fingerprint} (another model, or its headers changed)")
    if out_dir.is_symlink():  # replace the directory it names, not the link
        out_dir = Path(os.path.realpath(out_dir))
    check_apart(out_dir, [("the checkpoint", model_dir),
                          *(("the checkpoint's file", model_dir / s.name) for s in inv.files)])
    if out_dir.exists() and not out_dir.is_dir():
        raise PlacerError(f"--out {out_dir} exists and is not a directory")
    laid = [(f, *layout(f.entries, align)) for f in plan_files(plan, inv)]
    with Signals() as signals:
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
                 align: int, force: bool, progress: bool, signals: Signals) -> dict:
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
