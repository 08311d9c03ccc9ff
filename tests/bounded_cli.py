"""Run `placer` commands in a child process under an address-space limit (issue 35): what a
hostile input costs shows as a MemoryError, a crash or a long run instead of swapping the box.

python bounded_cli.py LIMIT_BYTES COMMANDS_JSON
    Sets RLIMIT_AS to LIMIT_BYTES, then runs each command of COMMANDS_JSON (a list of
    argument lists) in-process through click's CliRunner (the real app, built once)
    and prints one JSON list: per command its exit code, stdout, stderr, the type of the
    exception that ended it (SystemExit for a clean exit) and its seconds.

`run_bounded` is the parent's side.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LIMIT = 3 << 30  # 3 GiB of address space


def run_bounded(commands: list[list[str]], *, limit: int = LIMIT, timeout: float = 600
                ) -> list[dict]:
    """The results of `commands` (see the module docstring), run in one child process."""
    done = subprocess.run([sys.executable, __file__, str(limit), json.dumps(commands)],
                          capture_output=True, text=True, cwd=REPO, timeout=timeout,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    return json.loads(done.stdout)


def main(limit: int, commands: list[list[str]]) -> None:
    import resource
    import time

    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    import typer
    from click.testing import CliRunner

    from placer.cli import app

    command = typer.main.get_command(app)  # built once: most of an invocation's time
    results = []
    for args in commands:
        start = time.perf_counter()
        result = CliRunner().invoke(command, args, prog_name="placer")
        results.append({"args": args, "exit_code": result.exit_code, "stdout": result.stdout,
                        "stderr": result.stderr,
                        "exception": type(result.exception).__name__,
                        "seconds": time.perf_counter() - start})
    print(json.dumps(results))


if __name__ == "__main__":
    main(int(sys.argv[1]), json.loads(sys.argv[2]))
