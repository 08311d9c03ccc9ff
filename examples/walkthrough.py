"""What the example walk-throughs share: run a placer command as a user types it."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
DATA = HERE / "data"
PLACER = [sys.executable, "-m", "placer"]


def placer(*args: object) -> str:
    """Run one placer command, echoing it as a user would type it; returns its stdout."""
    words = [str(a) for a in args]
    print(f"\n$ placer {shlex.join(words)}", flush=True)
    env = {**os.environ, "COLUMNS": os.environ.get("COLUMNS", "120")}  # tables unclipped
    done = subprocess.run([*PLACER, *words], check=True, stdout=subprocess.PIPE, text=True,
                          env=env)
    print(done.stdout, end="", flush=True)
    return done.stdout


def prose_blocks() -> list[str]:
    """Real public prose (examples/data/README.md names the source), one block per passage."""
    text = (DATA / "shakespeare_head.txt").read_text()
    return [b for b in text.split("\n\n") if b.strip()]
