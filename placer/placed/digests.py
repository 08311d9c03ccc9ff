"""sha256 of source files, remembered by stat, so an unchanged checkpoint is hashed once.

Emit records every source file's sha256 in the manifest; hashing a 700 GB checkpoint again
for each plan emitted from it takes minutes of CPU. A digest is reused only while the
file's (device, inode, size, mtime_ns, ctime_ns) are unchanged: what git's index trusts.
Any write changes mtime and ctime, and no user can set ctime back. As git does for "racily
clean" files, a digest is not remembered for a file changed less than RACY_S seconds before
it was hashed, since a second write within the same timestamp tick would keep its stat.

The cache is one JSON file, $PLACER_CACHE_DIR/sha256.json (default
$XDG_CACHE_HOME/placer, else ~/.cache/placer), replaced atomically. A missing, corrupt or
unwritable cache only means hashing again, never an error.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path

from traces.formats.bounded import read_bounded
from traces.formats.jsontext import loads_json

RACY_S = 2.0  # younger files are hashed every time (see module docstring)


def cache_file() -> Path:
    root = os.environ.get("PLACER_CACHE_DIR") or Path(
        os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "placer"
    return Path(root) / "sha256.json"


def stat_key(path: Path, st: os.stat_result | None = None) -> str:
    """What must stay the same for a remembered digest of `path` to hold (`st`: its stat,
    when the caller has it)."""
    st = st or os.stat(path)
    return f"{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}"


def _entry(path: Path, key: str) -> str:
    """The cache's name for `path` as it was when its stat_key was `key`."""
    return f"{Path(path).resolve()}|{key}"


def _load() -> dict[str, str]:
    try:
        data = loads_json(read_bounded(cache_file(), "digest-cache"), "the digest cache")
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def cached(paths: list[Path]) -> dict[Path, str]:
    """The remembered sha256 of each of `paths` whose stat is unchanged."""
    known = _load()
    out = {}
    for p in paths:
        digest = known.get(_entry(p, stat_key(p)))
        if isinstance(digest, str):
            out[p] = digest
    return out


def remember(digests: dict[Path, tuple[str, str, float]]) -> None:
    """Remember, for each path, (stat_key before hashing, sha256, time hashing began), unless
    the file changed while being hashed or too shortly before (RACY_S)."""
    fresh = {}
    for p, (key, digest, began) in digests.items():
        st = os.stat(p)
        if stat_key(p, st) == key and began - max(st.st_mtime_ns, st.st_ctime_ns) / 1e9 > RACY_S:
            fresh[_entry(p, key)] = digest
    if not fresh:
        return
    path = cache_file()
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        live = {k: v for k, v in _load().items() if _still_valid(k)}
        fd, tmp = tempfile.mkstemp(prefix=".sha256.", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(live | fresh, f)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


def _still_valid(entry: str) -> bool:
    """Whether a cache entry's file still has its stat (old entries are dropped)."""
    name, _, key = entry.rpartition("|")
    try:
        return stat_key(Path(name)) == key
    except OSError:
        return False
