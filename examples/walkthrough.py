"""What the example walk-throughs share: run a placer command as a user types it."""

from __future__ import annotations

import contextlib
import io
import os
import shlex
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
DATA = HERE / "data"


def placer(*args: object) -> str:
    """Run one placer command as a user types it (echoed first) and return its stdout.

    It runs in this process, through the same command line the `placer` console script
    calls (`placer.commands.app.app`), so torch and transformers are imported once for the
    whole walk-through instead of once per command (8-10 s each on a small machine); what it
    prints goes to this script's stdout as it comes, its errors to stderr. A command that
    fails ends the walk-through with its exit status."""
    from placer.commands.app import app

    words = [str(a) for a in args]
    print(f"\n$ placer {shlex.join(words)}", flush=True)
    os.environ.setdefault("COLUMNS", "120")  # tables unclipped
    out = Tee(sys.stdout)
    with contextlib.redirect_stdout(out):
        code = app(args=words, prog_name="placer", standalone_mode=False)
    sys.stdout.flush()
    if code:
        raise SystemExit(f"placer {words[0]} failed (exit status {code})")
    return out.text.getvalue()


class Tee(io.TextIOBase):
    """A stdout that prints what it is given and keeps a copy."""

    def __init__(self, echo: io.TextIOBase) -> None:
        self.echo, self.text = echo, io.StringIO()

    def write(self, s: str) -> int:
        self.text.write(s)
        return self.echo.write(s)

    def flush(self) -> None:
        self.echo.flush()

    def isatty(self) -> bool:
        return False


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
