"""What tests/test_emit_faults.py runs in a subprocess (real SIGINT and SIGTERM), and the
property it checks afterwards. No pytest here: the subprocess imports only placer.

python emit_fault_driver.py loop MODEL PLAN OLD ROOT POINTS_JSON
    For each [signal, n, mode] of POINTS_JSON: prepare ROOT/<i>/placed (see prepare), emit
    PLAN into it (--force, align NEW_ALIGN); the thread that makes the emit's n-th write sends
    the signal to the main thread (a real signal, at a point that does not depend on timing).
    Prints one JSON list: whether each emit completed.
python emit_fault_driver.py cli ARGS...
    `placer ARGS` (the real CLI), printing "writing" once the first output write starts.
Both slow emit's writes (8 KiB buffers, 4 ms a write) so that signals land while it writes.
"""

from __future__ import annotations

import json
import shutil
import signal
import sys
import threading
import time
from pathlib import Path

import placer.placed.emit
import placer.placed.stream
from placer.placed.verify import verify_placed
from placer.plan.placement import read_plan

MODES = ("fresh", "empty", "force")  # no --out yet; an empty one; a placement to replace
OLD_ALIGN, NEW_ALIGN = 4096, 256


def prepare(out: Path, mode: str, old: Path) -> None:
    """Make `out` as `mode` says (`old`: a placement emitted with OLD_ALIGN)."""
    if mode == "force":
        shutil.copytree(old, out)
    elif mode == "empty":
        out.mkdir()


def check(out: Path, mode: str, completed: bool, model: Path) -> None:
    """The property: nothing hidden is left beside or in `out` (staging, old, lock, temps);
    `out` holds the new placement (if the emit completed), else it is as it was: the old
    placement, empty, or absent. Every placement found must verify."""
    left = [p.name for p in out.parent.iterdir() if p.name.startswith(".")]
    if out.is_dir():
        left += [p.name for p in out.iterdir() if p.name.startswith(".")]
    assert left == [], (mode, completed, left)
    if not completed and mode != "force":
        assert (out.is_dir() and not any(out.iterdir())) if mode == "empty" \
            else not out.exists(), (mode, sorted(out.iterdir()) if out.exists() else None)
        return
    report = verify_placed(out, model)
    assert report.ok, (mode, completed, report.problems)
    align = json.loads((out / "manifest.json").read_text())["align"]
    assert align == (NEW_ALIGN if completed else OLD_ALIGN), (mode, completed, align)


def slow_writes(announce: bool = False) -> None:
    placer.placed.stream.WRITE_BYTES = 8192
    write, started = placer.placed.stream._write_all, []

    def slow(fd: int, data, offset: int) -> None:
        if announce and not started:
            started.append(True)
            print("writing", flush=True)
        time.sleep(0.004)
        write(fd, data, offset)

    placer.placed.stream._write_all = slow


def loop(model: Path, plan: Path, old: Path, root: Path, points: list) -> list[bool]:
    slow_writes()
    for signum in (signal.SIGINT, signal.SIGTERM):  # outside the emit's handlers: ignored
        signal.signal(signum, signal.SIG_IGN)
    write, main_thread = placer.placed.stream._write_all, threading.main_thread().ident
    completed = []
    for i, (signum, nth, mode) in enumerate(points):
        out = root / str(i) / "placed"
        out.parent.mkdir(parents=True)
        prepare(out, mode, old)
        writes = []

        def signalling(fd: int, data, offset: int, signum=signum, nth=nth, writes=writes):
            writes.append(offset)
            if len(writes) == nth:
                signal.pthread_kill(main_thread, signum)
            write(fd, data, offset)

        placer.placed.stream._write_all = signalling
        done = False
        try:
            try:
                placer.placed.emit.emit_placement(read_plan(plan), model, out, align=NEW_ALIGN,
                                           force=mode == "force")
                done = True
            finally:
                time.sleep(0.01)  # a signal sent now is handled in here
        except KeyboardInterrupt:
            pass
        placer.placed.stream._write_all = write
        completed.append(done)
    return completed


def main(argv: list[str]) -> None:
    if argv[0] == "loop":
        model, plan, old, root = map(Path, argv[1:5])
        print(json.dumps(loop(model, plan, old, root, json.loads(argv[5]))))
        return
    slow_writes(announce=True)
    from placer.cli import app

    app(argv[1:], prog_name="placer")


if __name__ == "__main__":
    main(sys.argv[1:])
