"""The one bounded read every file reader of traces/ and placer/ goes through (issue 44).

A reader that calls `Path.read_bytes()` allocates whatever length the file claims: a sparse
8 GiB plan (`truncate -s 8G`, no disk used) was a MemoryError traceback, or 16.9 GB of RSS
where memory allowed. Here each kind of file has a size limit (`LIMITS`), checked with
`fstat` on the open file before a byte is read, and the read itself stops one byte past the
limit (a pipe, a character device or a file growing while read has no size to stat).
Line-oriented files (corpora, JSONL replies) are streamed, so their total length is free, but
each line is bounded (`LINE_LIMITS`) and so is a `.txt` corpus's block of lines
(`bounded_lines`, `MAX_BLOCK`).

The limits are far above what placer's own files reach (docs/reliability.md, "The bounds",
gives each value and why) and far below what a 4 GB address space can parse: JSON in Python
takes 10-40 bytes of objects per byte of text.
"""

from __future__ import annotations

import itertools
import os
import stat
from collections.abc import Callable, Iterator
from pathlib import Path

from traces.errors import TraceError

MiB = 1 << 20

LIMITS = {  # kind of file -> the most bytes placer reads of it
    "plan": 64 * MiB,           # plan.json (a 61-layer, 256-expert plan: about 4 MB)
    "manifest": 64 * MiB,       # a placed manifest.json (the plan plus one entry per shard)
    "config": 4 * MiB,          # a model's config.json (the largest on the Hub: ~100 KB)
    "index": 64 * MiB,          # model.safetensors.index.json (DeepSeek-V3: 9 MB)
    "spec": 1 * MiB,            # a hardware spec TOML (a few hundred bytes)
    "prompt-lens": 64 * MiB,    # vLLM --prompt-lens JSON (a million requests: ~30 MB)
    "meta": 1 * MiB,            # TensorRT-LLM meta_info.json (two integers)
    "load-balancer": 16 * MiB,  # TensorRT-LLM load balancer YAML (layers x slots integers)
    "expert-location": 64 * MiB,  # SGLang --init-expert-location JSON (layers x slots)
    "digest-cache": 64 * MiB,   # placer's own digest cache
}
LINE_LIMITS = {  # kind of line-oriented file -> the most bytes of one line
    "corpus": 16 * MiB,         # one document: far past any context window (4M tokens)
    "jsonl": 256 * MiB,         # one SGLang /generate reply: 32k tokens x 61 layers x top-8
}                               # routed experts, base64, is 83 MB
MAX_BLOCK = LINE_LIMITS["corpus"]  # a .txt corpus document (lines up to a blank one)


def _size(n: int) -> str:
    return f"{n / MiB:.0f} MiB" if n >= MiB else f"{n} bytes"


def read_bounded(path: Path, kind: str, where: str | None = None,
                 error: type[ValueError] = TraceError) -> bytes:
    """The bytes of `path`, a file of `kind` (a key of LIMITS); `error` in one line naming
    `where` (default: the path) when it cannot be read, is not a regular file of at most
    LIMITS[kind] bytes by its stat, or holds more than that when read (an OSError worded as
    the CLI words one). FileNotFoundError passes through for the callers that word a missing
    file themselves."""
    limit, where = LIMITS[kind], where or str(path)
    try:
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            if stat.S_ISDIR(st.st_mode):
                raise error(f"{where}: is a directory, expected a {kind} file")
            if stat.S_ISREG(st.st_mode) and st.st_size > limit:
                raise error(f"{where}: {st.st_size} bytes, more than a {kind} file may hold "
                            f"({_size(limit)}); refused before reading it")
            data = f.read(limit + 1)
    except FileNotFoundError:
        raise
    except IsADirectoryError:
        raise error(f"{where}: is a directory, expected a {kind} file") from None
    except OSError as exc:  # worded as the CLI words an OSError: "permission denied: PATH"
        raise error(f"{(exc.strerror or type(exc).__name__).lower()}: {path}") from None
    if len(data) > limit:
        raise error(f"{where}: more than {_size(limit)}, more than a {kind} file may hold")
    return data


def bounded_lines(path: Path, kind: str, where: Callable[[int], str] | None = None,
                  error: type[ValueError] = TraceError) -> Iterator[tuple[int, int, bytes]]:
    """(line number from 1, byte offset of the line in the file, the line's bytes with its
    newline) of every line of `path`; `error` naming the line (`where(number)`, default
    PATH:NUMBER) and its offset when one holds more than LINE_LIMITS[kind] bytes: no line is
    read further than that."""
    limit = LINE_LIMITS[kind]
    offset = 0
    with open(path, "rb") as f:
        for number in itertools.count(1):
            raw = f.readline(limit + 1)
            if not raw:
                return
            if len(raw) > limit:
                name = where(number) if where is not None else f"{path}:{number}"
                raise error(f"{name}: a line longer than {_size(limit)} (at byte offset "
                            f"{offset}); a {kind} line holds at most that")
            yield number, offset, raw
            offset += len(raw)
