"""What the example walk-throughs share: run a placer command as a user types it."""

from __future__ import annotations

import os
import shlex
import shutil
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


def fresh_dir(out: Path) -> Path:
    """`out`, emptied (a walk-through always starts from nothing)."""
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    return out


def tiny_model(out: Path) -> Path:
    """The walk-throughs' tiny qwen3_moe checkpoint (4 layers x 16 experts, top-2), built
    offline in `out` with a tokenizer trained on the bundled prose."""
    from placer.checkpoint.tiny import build_tiny_model

    return build_tiny_model("qwen3_moe", out, texts=prose_blocks(), layers=4, experts=16,
                            top_k=2, hidden=64, router_scale=4.0)
