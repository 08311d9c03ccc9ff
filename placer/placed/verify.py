"""Prove a placed directory byte for byte against its source checkpoint.

Checks, in order: the manifest's bytes are those its digest covers (placer.plan.seal) and
it validates; the checkpoint is the model it was placed from; every output file exists with
the recorded size and opens as safetensors with the tensors the manifest names; every routed
expert of the inventory is placed exactly once, its tensors are the model's, its pages tile
its byte stream with a resident prefix and their pieces name the right source tensors and
files; no card keeps more resident than its capacity; and, once all of that holds, reading each
output once (streamed, chunk by chunk), its sha256 is the manifest's and every piece's bytes
equal the source bytes they came from (a difference is reported at the absolute offset of its
first differing byte, in the output and in the source), and every source file, hashed afresh,
has the sha256 emit recorded (a checkpoint with the same tensors but other bytes would pass
every other check).
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import numpy as np
from safetensors import safe_open

from placer.checkpoint.inventory import read_inventory
from placer.errors import PlacerError
from placer.placed import digests
from placer.placed.layout import stream_segments
from placer.placed.manifest import expert_tensors, read_manifest
from placer.placed.stream import WRITE_BYTES, direct_io, pread_into, set_direct, sha256_file
from traces.errors import first_line


@dataclass
class Report:
    placed: str
    problems: list[str] = field(default_factory=list)
    bytes_compared: int = 0
    pieces: int = 0
    files: int = 0

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json(self) -> dict:
        return {"placed": self.placed, "ok": self.ok, "problems": self.problems,
                "bytes_compared": self.bytes_compared, "pieces": self.pieces,
                "files": self.files}


def verify_placed(placed: Path, model_dir: Path) -> Report:
    """Every check of the module docstring; the problems found (none: ok)."""
    placed, model_dir = Path(placed), Path(model_dir)
    if placed.exists() and not placed.is_dir():
        raise PlacerError(f"{placed} is not a directory (give the directory placer emit wrote)")
    manifest = read_manifest(placed)
    report = Report(str(placed))
    inv = read_inventory(model_dir, gguf=False)
    if inv.fingerprint != manifest["model"]["fingerprint"]:
        raise PlacerError(f"{placed} was placed from model {manifest['model']['fingerprint']}, "
                          f"but {model_dir} is model {inv.fingerprint}")
    check_files(placed, manifest, report)
    check_placement(manifest, inv, report)
    if report.ok:
        check_bytes(placed, model_dir, manifest, report)
    return report


def check_files(placed: Path, manifest: dict, report: Report) -> None:
    names: dict[str, set[str]] = {}
    for ex in manifest["experts"]:
        for page in ex["pages"]:
            for p in page["pieces"]:
                names.setdefault(p["file"], set()).add(p["tensor"])
    listed = {f["name"] for f in manifest["files"]}
    for name in sorted(set(names) - listed):
        report.problems.append(f"{name}: holds pieces but is not among the manifest's files")
    for f in manifest["files"]:
        path = placed / f["name"]
        report.files += 1
        if not path.is_file():
            report.problems.append(f"{f['name']}: missing")
            continue
        if path.stat().st_size != f["size"]:
            report.problems.append(f"{f['name']}: {path.stat().st_size} bytes, manifest says "
                                   f"{f['size']} (truncated or replaced)")
            continue
        try:
            with safe_open(path, "pt") as st:
                missing = names.get(f["name"], set()) - set(st.keys())
        except Exception as exc:  # safetensors raises its own error types
            report.problems.append(f"{f['name']}: not a readable safetensors file "
                                   f"({first_line(exc)})")
            continue
        for name in sorted(missing):
            report.problems.append(f"{f['name']}: tensor {name} named by the manifest is absent")


def check_placement(manifest: dict, inv, report: Report) -> None:
    seen: dict[tuple[int, int], int] = {}
    capacity = {c["index"]: c["capacity_bytes"] for c in manifest["cards"]}
    resident = dict.fromkeys(capacity, 0)
    for ex in manifest["experts"]:
        key = (ex["layer"], ex["expert"])
        seen[key] = seen.get(key, 0) + 1
        try:
            src = inv.expert(*key)
        except Exception:
            report.problems.append(f"expert {key}: not a routed expert of the model")
            continue
        if ex["bytes"] != src.bytes:
            report.problems.append(f"expert {key}: {ex['bytes']} bytes, the model's has "
                                   f"{src.bytes}")
            continue
        differs = _tensors_differ(ex["tensors"], expert_tensors(src))
        if differs:
            report.problems.append(f"expert {key}: {differs} differs from the model's")
            continue
        pos, cold_seen = 0, False
        for page in ex["pages"]:
            if page["offset"] != pos or sum(p["length"] for p in page["pieces"]) != page["length"]:
                report.problems.append(f"expert {key} page {page['index']}: does not tile "
                                       "the expert's bytes")
            if page["resident"] and cold_seen:
                report.problems.append(f"expert {key}: resident page after a cold one")
            cold_seen |= not page["resident"]
            pos += page["length"]
            want = stream_segments(src, page["offset"], page["offset"] + page["length"])
            got = [(p["origin"]["tensor"], p["origin"]["source_file"], p["origin"]["start"],
                    p["length"]) for p in page["pieces"]]
            if [(s.tensor, s.file, s.start, s.length) for s in want] != got:
                report.problems.append(f"expert {key} page {page['index']}: pieces name the "
                                       f"wrong source tensors or ranges")
        if pos != src.bytes:
            report.problems.append(f"expert {key}: pages cover {pos} of {src.bytes} bytes")
        differs = _cold_differs(ex)
        if differs:
            report.problems.append(f"expert {key}: {differs}")
        resident[ex["card"]] = resident.get(ex["card"], 0) + ex["resident_bytes"]
    for ex in inv.experts:
        n = seen.get((ex.layer, ex.expert), 0)
        if n != 1:
            report.problems.append(f"expert ({ex.layer}, {ex.expert}): placed {n} times")
    for c, used in resident.items():
        if c not in capacity:
            report.problems.append(f"card {c}: homes experts but is not among the manifest's "
                                   f"cards {sorted(capacity)}")
        elif used > capacity[c]:
            report.problems.append(f"card {c}: {used} resident bytes exceed its capacity "
                                   f"{capacity[c]}")


def _cold_differs(ex: dict) -> str | None:
    """How an expert's `resident_bytes` and `cold` range differ from what its pages say (the
    resident pages' length; the cold pages' first piece and the rest of the bytes)."""
    held = sum(page["length"] for page in ex["pages"] if page["resident"])
    if ex["resident_bytes"] != held:
        return f"resident_bytes {ex['resident_bytes']}, its resident pages hold {held}"
    cold = [p for page in ex["pages"] if not page["resident"] for p in page["pieces"]]
    want = None if not cold else {"file": cold[0]["file"], "tensor": cold[0]["tensor"],
                                  "offset": cold[0]["offset"],
                                  "length": ex["bytes"] - ex["resident_bytes"]}
    got = ex["cold"] if want is None or ex["cold"] is None else {k: ex["cold"][k] for k in want}
    if got != want:
        return f"cold is {_short(got)}, its cold pages say {_short(want)}"
    return None


def _short(value: object) -> str:
    """`value` as JSON, cut to one short line."""
    text = json.dumps(value)
    return text if len(text) <= 120 else text[:117] + "..."


def _tensors_differ(got: list[dict], want: list[dict]) -> str | None:
    """The first field where an expert's recorded `tensors` differ from the model's."""
    for i, (g, w) in enumerate(zip(got, want, strict=False)):
        for k, v in w.items():
            if g.get(k) != v:
                return f"tensors[{i}].{k}"
    return None if len(got) == len(want) else f"tensors (the model's has {len(want)})"


@dataclass(frozen=True)
class Piece:
    """`length` bytes at `offset` of an output that must equal those at `source_offset` of
    source file `source` (its name); `what` names the piece when they differ."""

    offset: int
    length: int
    source: str
    source_offset: int
    what: str

    def differs(self, output: str, at: int) -> str:
        """The problem line when this piece's bytes first differ at output offset `at`."""
        return (f"{self.what} at byte {at} of {output} (byte "
                f"{self.source_offset + at - self.offset} of {self.source})")


SOURCE_DIFFERS = "the source checkpoint differs from the one this placement was made from"


def check_bytes(placed: Path, model_dir: Path, manifest: dict, report: Report) -> None:
    """Every output's sha256 and every piece's bytes against its source: one pass over each
    output, two outputs per core at once (each thread waits on the disk about as long as it
    hashes; preadv and hashlib release the GIL). Meanwhile every source file the manifest
    records is hashed afresh (never from the digest cache, which is what it checks) and
    compared with the sha256 emit recorded."""
    src_off = {(t["name"], t["source_file"]): t["source_offset"] - t["tensor_offset"]
               for ex in manifest["experts"] for t in ex["tensors"]}
    pieces: dict[str, list[Piece]] = {f["name"]: [] for f in manifest["files"]}
    for ex in manifest["experts"]:
        for page in ex["pages"]:
            for p in page["pieces"]:
                o = p["origin"]
                pieces[p["file"]].append(Piece(
                    p["offset"], p["length"], o["source_file"],
                    src_off[(o["tensor"], o["source_file"])] + o["start"],
                    f"expert ({ex['layer']}, {ex['expert']}) page {page['index']}: {p['file']} "
                    f"tensor {p['tensor']} differs from {o['source_file']} tensor "
                    f"{o['tensor']}"))
                report.bytes_compared += p["length"]
                report.pieces += 1
    recorded = manifest["source"]["files"]
    sources: dict[str, int] = {}  # shared by the threads: a shard open per output is too many
    try:
        for name in sorted({p.source for ps in pieces.values() for p in ps}):
            sources[name] = os.open(model_dir / name, os.O_RDONLY)
        with ThreadPoolExecutor(2 * (os.cpu_count() or 1)) as pool:
            hashed = [pool.submit(check_source, model_dir, f) for f in
                      sorted(recorded, key=lambda f: -f["size"])]  # longest first
            found = pool.map(lambda f: check_output(placed / f["name"], f["sha256"],
                                                    pieces[f["name"]], sources),
                             manifest["files"])
            for problems in list(found):
                report.problems += problems
            results = [h.result() for h in hashed]
    finally:
        for fd in sources.values():
            os.close(fd)
    digests.remember({path: fresh for path, fresh, _ in results if fresh is not None})
    source_problems = [problem for _, _, problem in results if problem is not None]
    if source_problems:
        report.problems[:0] = [SOURCE_DIFFERS, *source_problems]  # the summary first


def check_source(model_dir: Path, recorded: dict
                 ) -> tuple[Path, tuple[str, str, float] | None, str | None]:
    """Hash the source file `recorded` names ({name, size, sha256}) in `model_dir`: (its path,
    what digests.remember takes to remember the fresh digest, so that a corrupt cache entry
    is replaced by the truth, or None, the problem when it differs from the record or None)."""
    path = model_dir / recorded["name"]
    if not path.is_file():
        return path, None, f"source {recorded['name']}: missing from {model_dir}"
    key, began = digests.stat_key(path), time.time()
    size = path.stat().st_size
    if size != recorded["size"]:
        return path, None, (f"source {recorded['name']}: {size} bytes, the placement was made "
                            f"from {recorded['size']}")
    digest = sha256_file(path)
    if digest != recorded["sha256"]:
        return path, (key, digest, began), (
            f"source {recorded['name']}: sha256 {digest[:16]}..., the placement was made from "
            f"{recorded['sha256'][:16]}...")
    return path, (key, digest, began), None


def check_output(path: Path, sha256: str, pieces: list[Piece], sources: dict[str, int]
                 ) -> list[str]:
    """Read the output at `path` once, front to back, WRITE_BYTES at a time: its sha256, and
    every piece (whatever its order) against its source bytes (`sources`: open fds by name);
    the problems found, each piece that differs with the absolute offset of its first
    differing byte in the output and in the source.

    The output is read with O_DIRECT where the filesystem allows it: from the disk, not
    from pages cached when it was written, and without filling the page cache with it
    (here, 3.3 GB of outputs took 4 s of system time read buffered, most of it allocating
    page cache). Reads are whole aligned buffers at aligned offsets, as O_DIRECT wants."""
    pieces = sorted(pieces, key=lambda p: p.offset)
    h = hashlib.sha256()
    out, src = mmap.mmap(-1, WRITE_BYTES), bytearray(WRITE_BYTES)
    bad: dict[int, int] = {}  # index of a piece that differs: output offset of its first diff
    first = 0  # the first piece not wholly before the current chunk
    pos = 0
    fd = os.open(path, os.O_RDONLY)
    try:
        direct = set_direct(fd, True)
        while True:
            n, direct = direct_io(fd, direct, partial(pread_into, fd, memoryview(out), pos))
            if not n:
                break
            h.update(memoryview(out)[:n])
            end = pos + n
            for i in range(first, len(pieces)):
                p = pieces[i]
                if p.offset >= end:
                    break
                lo, hi = max(p.offset, pos), min(p.offset + p.length, end)
                if lo < hi and i not in bad:
                    at = _first_difference(out, lo - pos, sources[p.source],
                                           p.source_offset + lo - p.offset, hi - lo, src)
                    if at is not None:
                        bad[i] = lo + at
            while first < len(pieces) and pieces[first].offset + pieces[first].length <= end:
                first += 1
            pos = end
    finally:
        os.close(fd)
    for i in range(first, len(pieces)):  # pieces that run past the end of the file
        if i not in bad and pieces[i].offset + pieces[i].length > pos:
            bad[i] = max(pieces[i].offset, pos)
    problems = [pieces[i].differs(path.name, bad[i]) for i in sorted(bad)]
    if h.hexdigest() != sha256:
        problems.insert(0, f"{path.name}: sha256 differs from the manifest's")
    return problems


def _first_difference(out: mmap.mmap, at: int, source: int, offset: int, length: int,
                      buf: bytearray) -> int | None:
    """Where the `length` bytes at `at` of `out` first differ from those at `offset` of fd
    `source` (read into `buf`), relative to `at`; None when all are equal. Compared by numpy
    without copying either side (slicing both copied up to 16 MiB twice, costing more than
    the hash; memoryviews compare byte by byte); a source that ends early differs where it
    ends."""
    n = pread_into(source, memoryview(buf)[:length], offset)
    a = np.frombuffer(out, np.uint8, n, at)
    b = np.frombuffer(buf, np.uint8, n)
    if np.array_equal(a, b):
        return None if n == length else n
    return int(np.flatnonzero(a != b)[0])
