"""Property: hostile files of the classes issue 35 found (bytes that are not UTF-8 in a JSONL,
garbage `.npy` headers, compressed members claiming gigabytes, plain pickles as `.pt`) make
`placer traces import` exit 1 with exactly one `error:` line naming the file, no traceback,
within TIME_BOUND seconds, under an address-space limit, writing nothing.

The commands run in one child process (tests/hostile_worker.py) that sets RLIMIT_AS to
HEADROOM bytes above what importing placer and torch took (4 GB in all with the CPU build of
torch), so a memory blow-up fails there, not in pytest, and fails the test.
The suite runs a fixed-seed sample (CASES examples per class); a larger run:

    PLACER_HOSTILE_CASES=1000 python -m pytest tests/test_hostile_properties.py -n 0 -q
"""

from __future__ import annotations

import io
import json
import os
import pickle
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from importer_files import MOE_LAYERS, NUM_LAYERS, TOP_K, write_config
from test_hostile_files import sglang_response

REPO = Path(__file__).resolve().parent.parent
HEADROOM = 2 << 30  # address space the cases may take beyond placer's and torch's imports
TIME_BOUND = 20.0   # seconds a case may take on a loaded 2-core CI box (each takes < 1 s)
CASES = int(os.environ.get("PLACER_HOSTILE_CASES", "25"))
SETTINGS = settings(max_examples=CASES, deadline=None, derandomize=True, database=None,
                    suppress_health_check=list(HealthCheck))


class Worker:
    """The child process running `placer` commands under RLIMIT_AS (hostile_worker.py)."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(REPO / "tests" / "hostile_worker.py"), str(HEADROOM)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO), "MALLOC_ARENA_MAX": "2"})

    def run(self, *args: object) -> dict:
        self.proc.stdin.write(json.dumps([str(a) for a in args]) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        assert line, f"the worker died (exit {self.proc.wait()}) on placer {args}"
        return json.loads(line)

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


@pytest.fixture(scope="module")
def worker():
    w = Worker()
    yield w
    w.close()


def clean(result: dict, args: list) -> None:
    """The contract: no traceback, within TIME_BOUND, and exit 0 or one `error:` line (exit 1;
    2 for click's usage errors, placer.cli)."""
    assert result["traceback"] is None, (args, result["traceback"])
    assert result["seconds"] < TIME_BOUND, (args, result["seconds"])
    if result["code"] != 0:
        lines = result["stderr"].splitlines()
        assert result["code"] in (1, 2) and len(lines) == 1 and lines[0].startswith("error: "), \
            (args, result)


def listing(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def refused(worker: Worker, root: Path, source: Path, *extra: object,
            must_fail: bool = True) -> str | None:
    """Import `source` (inside `root`) into root/o and check the contract: exit 1, one
    `error:` line naming the source, nothing on stdout, no traceback, within TIME_BOUND, and
    nothing written. Returns the error line (None: the import succeeded, where `must_fail`
    is False: the hostile file was valid after all)."""
    before = listing(root)
    result = worker.run("traces", "import", source, "--out", root / "o", *extra)
    assert result["traceback"] is None, result["traceback"]
    assert result["seconds"] < TIME_BOUND, result
    if result["code"] == 0 and not must_fail:
        return None
    assert result["code"] == 1, result
    lines = result["stderr"].splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result["stderr"]
    assert source.name in lines[0], lines[0]
    assert result["stdout"] == "", result["stdout"]
    assert listing(root) == before
    return lines[0]


# --- bytes that are not UTF-8 in a JSONL -------------------------------------------------------

GOOD_LINE = json.dumps(sglang_response(np.random.default_rng(0), 3, 2)).encode() + b"\n"
# never UTF-8 whatever surrounds them (a lone \x80 or \xc3 may complete the noise's sequence)
NOT_UTF8 = st.sampled_from([b"\xff", b"\xfe", b"\xc0\xaf", b"\xc1", b"\xed\xa0\x80", b"\xf5",
                            b"\xf8\x88\x80\x80\x80"])


@SETTINGS
@given(before=st.integers(0, 3), noise=st.binary(max_size=80), at=st.integers(0, 80),
       bad=NOT_UTF8, after=st.binary(max_size=40))
def test_bytes_that_are_not_utf8_in_a_jsonl(worker, before: int, noise: bytes, at: int,
                                            bad: bytes, after: bytes) -> None:
    """Valid responses, then a line of random bytes holding a sequence that is never UTF-8:
    the error names the file, that line and the offset of the first bad byte in the file."""
    noise = noise.replace(b"\n", b" ")
    line = noise[:at] + bad + after.replace(b"\n", b" ")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        config = write_config(root / "model")
        path = root / "r.jsonl"
        path.write_bytes(GOOD_LINE * before + line + b"\n")
        try:
            line.decode("utf-8")
        except UnicodeDecodeError as exc:
            offset, byte = len(GOOD_LINE) * before + exc.start, line[exc.start]
        # --format: noise starting b"GGUF" is taken for an imatrix (detection by magic)
        error = refused(worker, root, path, "--format", "sglang-http", "--config", config)
        assert error == (f"error: {path}:{before + 1}: not UTF-8 text (byte 0x{byte:02x} at "
                         f"byte offset {offset})"), error


# --- garbage .npy headers ----------------------------------------------------------------------

def npy(header: bytes, data: bytes, version: bytes = b"\x01\x00",
        length: int | None = None) -> bytes:
    width = 2 if version == b"\x01\x00" else 4
    size = len(header) if length is None else length
    return b"\x93NUMPY" + version + (size % (1 << 8 * width)).to_bytes(width, "little") + \
        header + data


texts = st.text(alphabet=st.sampled_from(list("{}()[]':,. \n\\\"#0123456789abdefiorstuxLN<|"
                                              "_-")), max_size=120)
literal_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.text(max_size=6)
    | st.sampled_from(["<i8", "|u1", "<f4", "|O", "V8", "<U4", "(2,3)i4", "<i3", "S0", "<M8"]),
    lambda inner: st.lists(inner, max_size=3).map(tuple) | st.lists(inner, max_size=3),
    max_leaves=5)


@st.composite
def npy_files(draw) -> bytes:
    """A .npy file whose header is garbage: a header cut short, random text or bytes, a dict
    of wrong fields or values, a header length past the file, a version numpy never wrote,
    or a shape claiming other than the data (up to 10**15 rows)."""
    kind = draw(st.sampled_from(["cut", "text", "bytes", "fields", "length", "version",
                                 "shape"]))
    data = bytes(draw(st.integers(0, 96)))
    fields = {"descr": "<i4", "fortran_order": False, "shape": (3, NUM_LAYERS, TOP_K)}
    if kind == "cut":  # numpy's parser: tokenize.TokenError, "EOF in multi-line statement"
        text = repr(fields)
        return npy(text[:draw(st.integers(1, len(text) - 1))].encode() + b"\n", data)
    if kind == "text":
        return npy(draw(texts).encode(), data)
    if kind == "bytes":
        return npy(draw(st.binary(max_size=120)), data)
    if kind == "length":
        return npy(b"{'descr': '<i8'", data, length=draw(st.integers(200, 2**16 - 1)))
    if kind == "version":
        return npy(b"{}", data, version=bytes(draw(st.lists(st.integers(0, 255), min_size=2,
                                                             max_size=2))))
    if kind == "fields":
        key = draw(st.sampled_from(["descr", "fortran_order", "shape", "extra"]))
        fields[key] = draw(literal_values)
    else:
        fields["shape"] = tuple(draw(st.lists(st.integers(0, 10**15), min_size=1,
                                              max_size=4)))
    valid = (isinstance(fields["shape"], tuple) and "extra" not in fields
             and fields["descr"] in ("<i8", "|u1", "<f4", "<i4")
             and isinstance(fields["fortran_order"], bool)
             and all(isinstance(n, int) and not isinstance(n, bool) and n >= 0
                     for n in fields["shape"])
             and int(np.prod(fields["shape"], dtype=object)) * np.dtype(fields["descr"]).itemsize
             == len(data))
    assume(not valid)
    return npy(repr(fields).encode(), data)


@SETTINGS
@given(raw=npy_files(), fmt=st.sampled_from(["vllm", "tokens", "counts", None]))
def test_garbage_npy_headers(worker, raw: bytes, fmt: str | None) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        config = write_config(root / "model")
        path = root / "r.npy"
        path.write_bytes(raw)
        extra = ["--top-k", 2] if fmt in ("counts", None) else ["--config", config]
        refused(worker, root, path, *(["--format", fmt] if fmt else []), *extra)


# --- compressed members claiming gigabytes -----------------------------------------------------

def header_bytes(shape: tuple[int, ...], dtype: str = "<i4") -> bytes:
    text = repr({"descr": dtype, "fortran_order": False, "shape": shape})
    text += " " * (-(len(text) + 11) % 64) + "\n"
    return npy(text.encode(), b"")


def forged_npz(members: list[tuple[str, bytes, int]], method: int) -> bytes:
    """A zip whose member `name` holds `raw` compressed with `method` but whose local and
    central headers claim `claimed` bytes inflated (what a zip bomb looks like before it is
    inflated: the directory is all a reader has)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=method) as zf:
        for name, raw, _ in members:
            zf.writestr(name, raw)
    out = bytearray(buf.getvalue())
    with zipfile.ZipFile(io.BytesIO(bytes(out))) as zf:
        infos, at = zf.infolist(), zf.start_dir
    for info, (_, _, claimed) in zip(infos, members, strict=True):
        size = min(claimed, 2**32 - 2).to_bytes(4, "little")  # 2**32 - 1 would mean zip64
        out[info.header_offset + 22:info.header_offset + 26] = size
        assert out[at:at + 4] == b"PK\x01\x02"
        out[at + 24:at + 28] = size
        at += 46 + sum(int.from_bytes(out[at + i:at + i + 2], "little") for i in (28, 30, 32))
    return bytes(out)


@SETTINGS
@given(rows=st.integers(10**6, 10**12), layers=st.sampled_from([NUM_LAYERS, len(MOE_LAYERS),
                                                                 7]),
       method=st.sampled_from([zipfile.ZIP_DEFLATED, zipfile.ZIP_BZIP2, zipfile.ZIP_LZMA]),
       extra_member=st.booleans(), fmt=st.sampled_from(["tokens", "vllm"]),
       payload=st.integers(0, 4096))
def test_compressed_members_claiming_gigabytes(worker, rows: int, layers: int, method: int,
                                               extra_member: bool, fmt: str,
                                               payload: int) -> None:
    """An .npz member of a few KB whose header claims `rows` rows: refused before inflating
    (by the inflation bound, the header against the member's size, or the model's shape)."""
    shape = (rows, layers, TOP_K)
    raw = header_bytes(shape) + bytes(payload)
    claimed = len(header_bytes(shape)) + rows * layers * TOP_K * 4
    members = [("expert_ids.npy", raw, claimed)]
    if extra_member:
        members.insert(0, ("seq_lens.npy", header_bytes((1,), "<i8") + bytes(8),
                           len(header_bytes((1,), "<i8")) + 8))
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        config = write_config(root / "model")
        path = root / "r.npz"
        path.write_bytes(forged_npz(members, method))
        refused(worker, root, path, "--format", fmt, "--config", config)


def test_a_real_deflate_bomb_is_refused_before_inflating(worker, tmp_path: Path) -> None:
    """Not forged: 200 MB of zeros deflated to 195 KB (a ratio of 1000), in the model's shape
    exactly: refused by the inflation bound before a byte of it is inflated."""
    rows = 2**23
    shape = (rows, len(MOE_LAYERS), TOP_K)
    config = write_config(tmp_path / "model")
    path = tmp_path / "r.npz"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf, \
            zf.open("expert_ids.npy", "w", force_zip64=True) as member:
        member.write(header_bytes(shape, "<i4"))
        chunk = bytes(8 << 20)
        left = rows * len(MOE_LAYERS) * TOP_K * 4
        while left:
            member.write(chunk[:min(left, len(chunk))])
            left -= min(left, len(chunk))
    assert path.stat().st_size < 1 << 20
    error = refused(worker, tmp_path, path, "--config", config)
    assert "refused before inflating it" in error


# --- plain pickles as .pt ----------------------------------------------------------------------

picklable = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8)
    | st.binary(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner,
                                                                max_size=3)
    | st.lists(inner, max_size=3).map(tuple), max_leaves=8)


@SETTINGS
@given(value=picklable, how=st.sampled_from(["pickle", "legacy torch.save", "bytes"]),
       protocol=st.integers(0, pickle.HIGHEST_PROTOCOL), noise=st.binary(max_size=64))
def test_plain_pickles_as_pt(worker, value: object, how: str, protocol: int,
                             noise: bytes) -> None:
    """A pickle (any protocol), torch's legacy non-zip format or random bytes named .pt: one
    line saying it is not a readable torch.save file, none of torch's own text."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        config = write_config(root / "model")
        path = root / "d.pt"
        if how == "pickle":
            path.write_bytes(pickle.dumps({"records": value, "logical_count": value},
                                          protocol=protocol))
        elif how == "legacy torch.save":
            torch.save({"logical_count": torch.zeros(2, 3), "x": value}, path,
                       _use_new_zipfile_serialization=False)
        else:
            assume(not noise.startswith(b"PK"))
            path.write_bytes(noise)
        error = refused(worker, root, path, "--config", config)
        assert "not a readable torch.save file" in error and "PyTorch" not in error


# --- TensorRT-LLM statistics: safetensors read by the safetensors library -------------------

def rank_file() -> bytes:
    from safetensors.numpy import save

    return save({f"10_{layer}": np.arange(1, 9, dtype=np.int64) for layer in MOE_LAYERS})


RANK = rank_file()


@SETTINGS
@given(fault=st.sampled_from(["length", "truncate", "flip", "header"]),
       length=st.integers(0, 2**64 - 1), cut=st.integers(0, len(RANK) - 1),
       flips=st.lists(st.tuples(st.integers(0, len(RANK) - 1), st.integers(1, 255)),
                      min_size=1, max_size=4),
       header=st.binary(max_size=200))
def test_mutated_trtllm_rank_files(worker, fault: str, length: int, cut: int,
                                   flips: list[tuple[int, int]], header: bytes) -> None:
    """A rank<r>.safetensors with a lying header length, cut short, bytes flipped or a
    random header: one line or (where the mutation left it valid) a trace."""
    raw = bytearray(RANK)
    if fault == "length":
        raw[:8] = length.to_bytes(8, "little")
    elif fault == "flip":
        for at, mask in flips:
            raw[at] ^= mask
    elif fault == "header":
        raw = bytearray(len(header).to_bytes(8, "little") + header + RANK[-24 * 8:])
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        config = write_config(root / "model")
        stats = root / "stats"
        stats.mkdir()
        (stats / "meta_info.json").write_text(json.dumps({"num_experts": 8,
                                                          "num_experts_per_token": TOP_K}))
        (stats / "rank0.safetensors").write_bytes(bytes(raw[:cut] if fault == "truncate"
                                                        else raw))
        refused(worker, root, stats, "--config", config, must_fail=fault in (
            "truncate", "header") or (fault == "length" and raw[:8] != RANK[:8]))


class Unlisted:
    """A class torch.load(weights_only=True) does not allow."""


@pytest.mark.parametrize("how", ["an unlisted global", "a member claiming gigabytes"])
def test_torch_zips_that_torch_would_refuse_or_inflate(worker, tmp_path: Path,
                                                       how: str) -> None:
    """A torch.save zip whose pickle names a global torch refuses gets our words, not torch's
    multi-line text; one whose member claims gigabytes is refused before torch allocates it."""
    config = write_config(tmp_path / "model")
    path = tmp_path / "d.pt"
    if how == "an unlisted global":
        torch.save({"logical_count": torch.zeros(2, 3), "x": Unlisted()}, path)
        needle = "its pickle builds objects other than tensors and plain containers"
    else:
        torch.save({"logical_count": torch.zeros(2, 3)}, path)
        with zipfile.ZipFile(path) as zf:
            members = [(i.filename, zf.read(i), len(zf.read(i))) for i in zf.infolist()]
        members[-1] = (*members[-1][:2], 3 << 30)
        path.write_bytes(forged_npz(members, zipfile.ZIP_STORED))
        needle = "refused before inflating it"
    error = refused(worker, tmp_path, path, "--config", config)
    assert needle in error and "PyTorch" not in error, error
