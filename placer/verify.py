"""Prove a placed directory byte for byte against its source checkpoint.

Checks, in order: the manifest validates; the checkpoint is the model it was placed from;
every output file exists with the recorded size and sha256 and opens as safetensors with
the tensors the manifest names; every routed expert of the inventory is placed exactly once,
its pages tile its byte stream with a resident prefix, and their pieces name the right
source tensors; no card keeps more resident than its capacity; and every piece's bytes equal
the source bytes they came from (streamed, chunk by chunk).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from safetensors import safe_open

from placer.emit import BUFFER, pread_into, sha256_file, stream_segments
from placer.errors import PlacerError
from placer.inventory import read_inventory
from placer.manifest import read_manifest


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
    manifest = read_manifest(placed)
    report = Report(str(placed))
    inv = read_inventory(model_dir)
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
        if sha256_file(path) != f["sha256"]:
            report.problems.append(f"{f['name']}: sha256 differs from the manifest's")
        try:
            with safe_open(path, "pt") as st:
                missing = names.get(f["name"], set()) - set(st.keys())
        except Exception as exc:  # safetensors raises its own error types
            report.problems.append(f"{f['name']}: not a readable safetensors file ({exc})")
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
            got = [(p["origin"]["tensor"], p["origin"]["start"], p["length"])
                   for p in page["pieces"]]
            if [(s.tensor, s.start, s.length) for s in want] != got:
                report.problems.append(f"expert {key} page {page['index']}: pieces name the "
                                       f"wrong source tensors or ranges")
        if pos != src.bytes:
            report.problems.append(f"expert {key}: pages cover {pos} of {src.bytes} bytes")
        resident[ex["card"]] = resident.get(ex["card"], 0) + ex["resident_bytes"]
    for ex in inv.experts:
        n = seen.get((ex.layer, ex.expert), 0)
        if n != 1:
            report.problems.append(f"expert ({ex.layer}, {ex.expert}): placed {n} times")
    for c, used in resident.items():
        if used > capacity.get(c, -1):
            report.problems.append(f"card {c}: {used} resident bytes exceed its capacity "
                                   f"{capacity.get(c)}")


def check_bytes(placed: Path, model_dir: Path, manifest: dict, report: Report) -> None:
    """Compare every piece with its source bytes."""
    src_off = {(t["name"], t["source_file"]): t["source_offset"] - t["tensor_offset"]
               for ex in manifest["experts"] for t in ex["tensors"]}
    fds: dict[Path, int] = {}
    bufs = (bytearray(BUFFER), bytearray(BUFFER))
    try:
        for ex in manifest["experts"]:
            for page in ex["pages"]:
                for p in page["pieces"]:
                    o = p["origin"]
                    src_start = src_off[(o["tensor"], o["source_file"])] + o["start"]
                    a = _open(fds, placed / p["file"])
                    b = _open(fds, model_dir / o["source_file"])
                    if not _same(a, p["offset"], b, src_start, p["length"], bufs):
                        report.problems.append(
                            f"expert ({ex['layer']}, {ex['expert']}) page {page['index']}: "
                            f"{p['file']} tensor {p['tensor']} differs from {o['source_file']} "
                            f"tensor {o['tensor']} at byte {o['start']}")
                    report.bytes_compared += p["length"]
                    report.pieces += 1
    finally:
        for fd in fds.values():
            os.close(fd)


def _open(fds: dict[Path, int], path: Path) -> int:
    if path not in fds:
        fds[path] = os.open(path, os.O_RDONLY)
    return fds[path]


def _same(a: int, a_off: int, b: int, b_off: int, length: int,
          bufs: tuple[bytearray, bytearray]) -> bool:
    """Whether `length` bytes at `a_off` of fd `a` equal those at `b_off` of fd `b`, read
    into two reused BUFFER-sized buffers (64 MiB reads into fresh bytes objects spent more
    time faulting in memory than comparing)."""
    x, y = bufs
    while length:
        n = min(length, BUFFER)
        if pread_into(a, memoryview(x)[:n], a_off) != n or \
                pread_into(b, memoryview(y)[:n], b_off) != n:
            return False
        if (x != y) if n == BUFFER else (x[:n] != y[:n]):  # whole bytearrays: one memcmp
            return False
        a_off, b_off, length = a_off + n, b_off + n, length - n
    return True

