"""Session fixtures built once per test run instead of once per xdist worker.

`make test` runs the suite on two or more workers (pyproject's addopts), and a
session-scoped fixture is a worker's own: each worker that runs a test needing it builds it
again (the regression case's four collects and three solves, the llama.cpp GGUFs and the
bench plan solved from llama.cpp's routing: a minute or more each on two cores). With
`once_per_run`, the first worker to need one builds it in a folder of the run's base
temporary directory, which every worker shares, while holding a lock; a worker that needs
it meanwhile waits for that build (it would have spent as long building its own), and one
that needs it later reads what the build returned. Without xdist it is built as before.

What such a fixture returns must be paths, strings, numbers, and lists, tuples and dicts of
them (it is kept as JSON for the other workers), and the tests must treat what it built as
read-only (they already do: a session fixture's files are shared by every test of a worker).
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest


def once_per_run(tmp_path_factory: pytest.TempPathFactory, name: str,
                 build: Callable[[Path], Any]) -> Any:
    """`build(folder)`'s value, built by the first worker of this run that asks (module
    docstring); `folder` is a fresh empty directory named after `name`."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return build(tmp_path_factory.mktemp(name))
    shared = tmp_path_factory.getbasetemp().parent  # .../pytest-N, above every popen-gwK
    root = shared / f"once-{name}"
    done = shared / f"once-{name}.json"
    with open(shared / f"once-{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or the worker dies
        if done.is_file():
            return _decode(json.loads(done.read_text()))
        shutil.rmtree(root, ignore_errors=True)  # what a worker whose build failed left
        root.mkdir()
        value = build(root)
        done.write_text(json.dumps(_encode(value)))
        return value


def _encode(value: Any) -> Any:
    if isinstance(value, Path):
        return {"path": str(value)}
    if isinstance(value, tuple):
        return {"tuple": [_encode(v) for v in value]}
    if isinstance(value, list):
        return [_encode(v) for v in value]
    if isinstance(value, dict):
        return {"dict": [[_encode(k), _encode(v)] for k, v in value.items()]}
    if value is None or isinstance(value, str | int | float | bool):
        return value
    raise TypeError(f"once_per_run: cannot share a {type(value).__name__} between workers")


def _decode(value: Any) -> Any:
    if isinstance(value, list):
        return [_decode(v) for v in value]
    if isinstance(value, dict):
        (kind, inner), = value.items()
        if kind == "path":
            return Path(inner)
        if kind == "tuple":
            return tuple(_decode(v) for v in inner)
        return {_decode(k): _decode(v) for k, v in inner}
    return value
