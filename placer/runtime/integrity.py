"""Before a placed directory runs: its files and its source checkpoint are the ones recorded.

The fingerprint says a checkpoint has the same config and tensor names, dtypes and shapes as
the one a placement was made from, not the same bytes: another fine-tune of the same model,
or a shard with a flipped byte, passes it and generates garbage. So `placer run` first checks
every source file and every placed file against the size and sha256 the manifest records.
Digests come from the cache of placer/digests.py where a file's stat is unchanged (emit
remembers its sources'), else the file is hashed once (threads, one file each) and its
digest remembered, so only the first run after a change pays for reading the bytes.
`placer verify` is the full proof: it hashes everything afresh and compares every byte.
Its checks that read no byte (every expert placed once with the model's tensors, pages that
tile it, pieces naming tensors the files hold) run next (`check_layout`): a manifest
whose digest holds but which says something else (a faulty emitter's) is one line, not a
traceback from deep in the loader.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from placer.errors import PlacerError
from placer.placed import digests
from placer.placed.stream import sha256_file
from placer.placed.verify import Report, check_files, check_placement


def check_integrity(placed: Path, checkpoint: Path, manifest: dict) -> None:
    """PlacerError (one line) unless every source file `manifest` records is in `checkpoint`
    and every output file in `placed`, each with its recorded size and sha256."""
    checkpoint, placed = Path(checkpoint), Path(placed)
    source = [(checkpoint / f["name"], f) for f in manifest["source"]["files"]]
    outputs = [(placed / f["name"], f) for f in manifest["files"]]
    for path, f in source + outputs:
        if not path.is_file():
            raise PlacerError(f"{path}: missing (the manifest records {f['name']})")
        if path.stat().st_size != f["size"]:
            raise PlacerError(f"{path}: {path.stat().st_size} bytes, the manifest records "
                              f"{f['size']}")
    found = file_digests([p for p, _ in source + outputs])
    for path, f in source:
        if found[path] != f["sha256"]:
            raise PlacerError(f"{path}: sha256 differs from the one {placed} was made from: the "
                              "source checkpoint differs from the one this placement was made "
                              "from")
    for path, f in outputs:
        if found[path] != f["sha256"]:
            raise PlacerError(f"{path}: sha256 differs from the manifest's (changed since "
                              "emit; placer verify names the bytes)")


def check_layout(placed: Path, manifest: dict, inv) -> None:
    """PlacerError (one line) at the first problem `placer verify` finds in `manifest`
    (placed from the checkpoint of inventory `inv`) without reading a placed byte."""
    report = Report(str(placed))
    check_files(Path(placed), manifest, report)
    check_placement(manifest, inv, report)
    if report.problems:
        more = len(report.problems) - 1
        raise PlacerError(f"{Path(placed) / 'manifest.json'}: {report.problems[0]}"
                          + (f" (and {more} more: placer verify names them)" if more else ""))


def file_digests(paths: list[Path]) -> dict[Path, str]:
    """sha256 of each of `paths`: remembered where the stat is unchanged, else hashed (and
    remembered, see placer/digests.py)."""
    known = digests.cached(paths)
    todo = [p for p in paths if p not in known]
    if todo:
        with ThreadPoolExecutor(min(len(todo), os.cpu_count() or 1)) as pool:
            fresh = dict(zip(todo, pool.map(_hash, todo), strict=True))
        digests.remember(fresh)
        known |= {p: digest for p, (_, digest, _) in fresh.items()}
    return known


def _hash(path: Path) -> tuple[str, str, float]:
    """(stat key before hashing, sha256, when hashing began): what digests.remember takes."""
    key, began = digests.stat_key(path), time.time()
    return key, sha256_file(path), began
