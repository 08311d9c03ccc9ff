"""Runs `placer` commands in-process under an address-space limit, for the hostile-file
property tests (tests/test_hostile_properties.py). No pytest here.

    python hostile_worker.py HEADROOM_BYTES

imports placer (and torch, which the SGLang reader loads), sets RLIMIT_AS to the address
space that took (about 2 GB with the CPU build of torch; a CUDA build maps more, and the
cases should not pay for that) plus HEADROOM_BYTES, then reads one JSON list of arguments
per line on stdin and answers each with one JSON object on stdout: {"code": exit status,
"stdout", "stderr", "seconds": wall time, "traceback": the text of an exception the command
let escape, or null}. A case that blows
the limit outside placer's own handling, or crashes the interpreter, ends the worker: the
test sees its stdout close.
"""

from __future__ import annotations

import json
import resource
import sys
import time
import traceback


def main() -> None:
    import torch  # noqa: F401  (imported once here, not inside the first timed case)
    import typer
    from click.testing import CliRunner

    from placer.cli import app

    command = typer.main.get_command(app)
    limit = address_space() + int(sys.argv[1])
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    answer = sys.stdout
    for line in sys.stdin:
        args = json.loads(line)
        start = time.monotonic()
        result = CliRunner().invoke(command, args, prog_name="placer")
        escaped = result.exception is not None and not isinstance(result.exception, SystemExit)
        answer.write(json.dumps({
            "code": result.exit_code, "stdout": result.stdout, "stderr": result.stderr,
            "seconds": time.monotonic() - start,
            "traceback": "".join(traceback.format_exception(result.exception))
            if escaped else None}) + "\n")
        answer.flush()


def address_space() -> int:
    """The bytes of address space this process holds now (VmSize)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmSize in /proc/self/status")


if __name__ == "__main__":
    main()
