"""Fault injection for emit: whatever fails, wherever it is interrupted, afterwards --out
holds a placement that verifies (the new one if the emit completed, else the old one) or is
as it was (absent, or empty), and no staging, lock or temporary file is left
(emit_fault_driver.check).

- In process (hypothesis): ENOSPC, EIO or KeyboardInterrupt at the n-th step of an emit: an
  output write, an fsync, the manifest write, the directory exchange or a rename.
- In a subprocess: real SIGINT and SIGTERM at random moments while the outputs are written,
  from a thread of the emitting process, and from the parent at the real CLI.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import random
import signal
import subprocess
import sys
import time
from itertools import count
from pathlib import Path
from unittest import mock

import pytest
from emit_fault_driver import MODES, NEW_ALIGN, OLD_ALIGN, check, prepare
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from placed_plans import mixed_plan

import placer.placed.commit
import placer.placed.emit
import placer.placed.stream
from placer.plan.placement import read_plan

DRIVER = Path(__file__).resolve().parent / "emit_fault_driver.py"
FAULTS = {"ENOSPC": lambda: OSError(errno.ENOSPC, "No space left on device"),
          "EIO": lambda: OSError(errno.EIO, "Input/output error"),
          "interrupt": KeyboardInterrupt}


@pytest.fixture(scope="module")
def setup(tiny_models, tmp_path_factory) -> tuple[Path, Path, Path]:
    """(model, plan, a placement of it emitted with OLD_ALIGN)."""
    root = tmp_path_factory.mktemp("faults")
    model = tiny_models["qwen3_moe"]
    plan = mixed_plan(model, root)
    placer.placed.emit.emit_placement(read_plan(plan), model, root / "old", align=OLD_ALIGN)
    return model, plan, root / "old"


CASES = count()


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(mode=st.sampled_from(MODES), fault=st.sampled_from(sorted(FAULTS)),
       at=st.integers(1, 45), can_exchange=st.booleans())
def test_a_fault_at_any_step(setup, tmp_path: Path, cli, mode: str, fault: str, at: int,
                             can_exchange: bool) -> None:
    model, plan, old = setup
    out = tmp_path / str(next(CASES)) / "placed"
    out.parent.mkdir()
    prepare(out, mode, old)
    steps: list[str] = []

    def step(name: str, real):
        def run(*args, **kwargs):
            steps.append(name)
            if len(steps) == at:
                raise FAULTS[fault]()
            return real(*args, **kwargs)
        return run

    exchange = placer.placed.commit.exchange if can_exchange else (lambda a, b: False)
    with contextlib.ExitStack() as stack:
        emit, stream, commit = placer.placed.emit, placer.placed.stream, placer.placed.commit
        for name, target, real in [("write", stream, stream._write_all),
                                   ("fsync", emit, emit.fsync_path),
                                   ("manifest", emit, emit.write_manifest),
                                   ("exchange", commit, exchange),
                                   ("rename", os, os.rename)]:
            attr = {"write": "_write_all", "fsync": "fsync_path", "manifest": "write_manifest",
                    "exchange": "exchange", "rename": "rename"}[name]
            stack.enter_context(mock.patch.object(target, attr, step(name, real)))
        stack.enter_context(mock.patch.object(placer.placed.stream, "WRITE_BYTES", 8192))
        result = cli("emit", "--plan", plan, "--model", model, "--out", out, "--align",
                     NEW_ALIGN, *(["--force"] if mode == "force" else []), ok=False)
    completed = len(steps) < at
    assert result.exit_code == (0 if completed else 1) or (fault == "interrupt" and
                                                           result.exit_code == 130), \
        (steps, result.output)  # click exits 130 on KeyboardInterrupt
    if not completed and fault != "interrupt":
        assert result.output.startswith(f"error: writing {out} failed: ")
        assert "(nothing was left behind" in result.output
    check(out, mode, completed, model)


def _run(args: list, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, DRIVER, *map(str, args)], text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kwargs)


def test_signals_at_random_writes(setup, tmp_path: Path) -> None:
    """Eight emits in one process, each signalled (SIGINT or SIGTERM, sent to the main thread
    by the thread making a seeded random one of its first writes; two past its last write, so
    those complete)."""
    model, plan, old = setup
    rng = random.Random(16)
    nth = [rng.randint(1, 12) for _ in range(6)] + [10**6, 10**6]
    points = [[int(sig), n, MODES[i % 3]]
              for i, (sig, n) in enumerate(zip([signal.SIGINT, signal.SIGTERM] * 4, nth,
                                               strict=True))]
    proc = _run(["loop", model, plan, old, tmp_path, json.dumps(points)])
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr
    completed = json.loads(stdout)
    for i, ((_, _, mode), done) in enumerate(zip(points, completed, strict=True)):
        check(tmp_path / str(i) / "placed", mode, done, model)
    assert completed == [n == 10**6 for n in nth], completed


@pytest.mark.parametrize("signum", [signal.SIGTERM])
def test_the_cli_killed_while_writing(signum: int, setup, tmp_path: Path) -> None:
    """`placer emit --force` gets SIGTERM from outside while it writes its outputs."""
    model, plan, old = setup
    out = tmp_path / "placed"
    prepare(out, "force", old)
    proc = _run(["cli", "emit", "--plan", plan, "--model", model, "--out", out, "--force",
                 "--align", NEW_ALIGN])
    assert proc.stdout.readline() == "writing\n"
    time.sleep(random.Random(3).uniform(0, 0.05))
    proc.send_signal(signum)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode in (1, 130, 143) and "Traceback" not in stderr, stderr
    check(out, "force", False, model)
