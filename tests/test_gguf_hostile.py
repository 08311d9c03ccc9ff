"""GGUF metadata built to hurt (issue 35): arrays claiming billions of elements, arrays nested
in arrays, huge string lengths, tensor counts larger than the file, tensor infos out of range.
`placer inspect FILE.gguf` and `placer traces import FILE --format imatrix` refuse each in one
`error:` line naming the file and the field, exit 1, within seconds and 3 GiB of address
space, and write nothing (the `gguf` package's reader took 45-60 s and ended in MemoryError or
SystemError on such files)."""

from __future__ import annotations

import os
import struct
import tempfile
from pathlib import Path

import numpy as np
import pytest
from bounded_cli import run_bounded
from cli_errors import assert_one_line_error
from gguf import GGUFReader, GGUFWriter
from gguf_files import names_gguf, write_moe_gguf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from traces.formats.gguf_header import KEEP_ARRAY, KEEP_TOTAL, read_gguf_header

UINT8, UINT32, STRING, ARRAY, UINT64 = 0, 4, 8, 9, 10
SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<B", 10: "<Q",
          11: "<q", 12: "<d"}
HUGE = [2**30 + 1, 2**32, 2**40, 2**62, 2**64 - 1, 10**9, 10**7]
EXAMPLES = int(os.environ.get("PLACER_HOSTILE_EXAMPLES", "2"))  # x FILES files each
FILES = 30
SECONDS = 10.0  # per command: a hang detector, far above the milliseconds a refusal takes


def gguf_string(raw: bytes, claim: int | None = None) -> bytes:
    return struct.pack("<Q", len(raw) if claim is None else claim) + raw


def header(n_tensors: int, n_kv: int, version: int = 3) -> bytes:
    return b"GGUF" + struct.pack("<I", version) + struct.pack("<QQ", n_tensors % 2**64,
                                                               n_kv % 2**64)


def kv(key: str, kind: int, payload: bytes) -> bytes:
    return gguf_string(key.encode()) + struct.pack("<I", kind) + payload


def array(element: int, count: int, items: bytes = b"") -> bytes:
    return struct.pack("<IQ", element, count) + items


def tensor_info(name: str, ne: list[int], ggml_type: int, offset: int) -> bytes:
    return (gguf_string(name.encode()) + struct.pack("<I", len(ne))
            + b"".join(struct.pack("<q", n) for n in ne) + struct.pack("<IQ", ggml_type, offset))


def refusals(paths: list[Path], out_root: Path) -> list[dict]:
    """Both GGUF readers' commands on each path, run bounded; every result checked: exit 1,
    one `error:` line naming the file, nothing else printed, in time, nothing written."""
    commands = []
    for i, path in enumerate(paths):
        commands += [["inspect", str(path)],
                     ["traces", "import", str(path), "--format", "imatrix", "--top-k", "2",
                      "--out", str(out_root / f"out{i}")]]
    results = run_bounded(commands)
    for r in results:
        lines = r["stderr"].splitlines()
        assert r["exit_code"] == 1 and r["exception"] == "SystemExit", r
        assert len(lines) == 1 and lines[0].startswith("error: "), r
        assert r["args"][-1 if r["args"][0] == "inspect" else 2] in lines[0], r
        assert r["stdout"] == "" and r["seconds"] < SECONDS, r
    assert not [p for p in out_root.iterdir() if p.name.startswith("out")]
    return results


CASES = {
    "array of a billion UINT64": (
        header(0, 1) + kv("tokenizer.ggml.scores", ARRAY, array(UINT64, 10**9)),
        "key 'tokenizer.ggml.scores' (array of 1000000000 UINT64) needs 8000000000 bytes"),
    "array past llama.cpp's 2**30": (
        header(0, 1) + kv("a", ARRAY, array(UINT8, 2**40)),
        "key 'a' claims 1099511627776 UINT8 elements, more than the 2**30"),
    "array of arrays": (
        header(0, 1) + kv("nested", ARRAY, array(ARRAY, 3, array(UINT8, 1, b"x") * 3)),
        "key 'nested' is an array of arrays"),
    "strings claiming exabytes": (
        header(0, 1) + kv("general.name", STRING, gguf_string(b"abc", 2**60)),
        "key 'general.name' claims 1152921504606846976 bytes, more than the 2**30"),
    "a billion strings": (
        header(0, 1) + kv("tokenizer.ggml.tokens", ARRAY, array(STRING, 10**9)),
        "is longer than the 2097152 strings"),
    "more keys than the file holds": (header(0, 1000), "key-value count 1000 needs"),
    "2**40 keys": (header(0, 2**40), "key-value count is 1099511627776; placer reads"),
    "more tensors than the file holds": (header(1000, 0), "tensor count 1000 needs"),
    "2**63 - 1 tensors": (header(2**63 - 1, 0), "tensor count is 9223372036854775807"),
    "a negative dimension": (
        header(1, 0) + tensor_info("t", [4, -1], 0, 0), "tensor 't' has dimensions [4, -1]"),
    "dimensions past int64": (
        header(1, 0) + tensor_info("t", [2**62, 2**62], 0, 0), "past int64"),
    "five dimensions": (
        header(1, 0) + tensor_info("t", [1] * 5, 0, 0), "has 5 dimensions"),
    "an unknown ggml type": (
        header(1, 0) + tensor_info("t", [4], 99, 0), "has ggml type 99"),
    "a row that is not whole blocks": (
        header(1, 0) + tensor_info("t", [100, 2], 12, 0), "Q4_K with rows of 100 elements"),
    "data past the end of the file": (
        header(1, 0) + tensor_info("t", [2**40], 0, 0), "ends past the end of the file"),
    "an offset out of place": (
        header(1, 0) + tensor_info("t", [4], 0, 2**63), "has data offset 9223372036854775808"),
    "a tensor name past GGML_MAX_NAME": (
        header(1, 0) + tensor_info("n" * 64, [4], 0, 0), "name is 64 bytes"),
    "an unknown value type": (header(0, 1) + kv("k", 77, b""), "GGUF value type 77"),
    "an alignment of another type": (header(0, 1) + kv("general.alignment", UINT64,
                                                       struct.pack("<Q", 32)),
                                     "key 'general.alignment' is UINT64; gguf.cpp requires"),
    "an alignment of 48": (header(0, 1) + kv("general.alignment", UINT32, struct.pack("<I", 48)),
                           "general.alignment is 48, expected a power of 2"),
    "an empty key": (header(0, 1) + kv("", UINT8, b"x"), "key #0 is empty"),
    "a key twice": (header(0, 2) + kv("a", UINT8, b"x") * 2, "key 'a' appears twice"),
    "a key claiming terabytes": (header(0, 1) + gguf_string(b"k", 2**40), "key #0"),
    "the other byte order": (b"GGUF" + struct.pack(">I", 3) + bytes(16), "other byte order"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_hostile_class_is_one_line(tmp_path: Path, name: str) -> None:
    raw, needle = CASES[name]
    path = tmp_path / "hostile.gguf"
    path.write_bytes(raw + bytes(64))
    with pytest.raises(ValueError, match="hostile.gguf: ") as caught:
        read_gguf_header(path, ValueError)
    assert needle in str(caught.value)


def test_the_classes_through_both_commands_bounded(tmp_path: Path) -> None:
    """Every class above through `inspect` and the imatrix importer, in a child limited to
    3 GiB of address space."""
    paths = []
    for i, (raw, _) in enumerate(CASES.values()):
        paths.append(tmp_path / f"h{i}.gguf")
        paths[-1].write_bytes(raw + bytes(64))
    results = refusals(paths, tmp_path)
    for r, (_, needle) in zip(results[::2], CASES.values(), strict=True):
        assert needle in r["stderr"], r


def test_the_reader_agrees_with_gguf_on_a_real_layout(tmp_path: Path) -> None:
    """On a file GGUFWriter wrote (tokenizer arrays, quantized fused experts, biases), every
    field placer keeps and every tensor's ne, type, offset and size equal gguf's reader."""
    path = tmp_path / "m.gguf"
    write_moe_gguf(path, biases=True, shared=True)
    mine, theirs = read_gguf_header(path, ValueError), GGUFReader(path)
    assert [(t.name, list(t.ne), t.ggml_type, t.offset, t.nbytes) for t in mine.tensors] == [
        (t.name, t.shape.tolist(), t.tensor_type, t.data_offset, t.n_bytes)
        for t in theirs.tensors]
    for key, value in mine.fields.items():
        if isinstance(value, (int, float, str)):
            assert theirs.fields[key].contents() == value, key
    assert str(mine.fields["tokenizer.ggml.tokens"]) == "<5000 x STRING>"
    assert mine.data_start == theirs.data_offset


def test_decoded_metadata_is_bounded(tmp_path: Path) -> None:
    """Gigabytes of metadata would be gigabytes of Python objects: past KEEP_TOTAL bytes,
    values are counted, not decoded."""
    items = np.arange(KEEP_ARRAY, dtype="<u8").tobytes()
    keys = KEEP_TOTAL // (KEEP_ARRAY * 8) + 8
    path = tmp_path / "wide.gguf"
    path.write_bytes(header(0, keys) + b"".join(kv(f"k{i}", ARRAY, array(UINT64, KEEP_ARRAY,
                                                                          items))
                                                 for i in range(keys)))
    fields = read_gguf_header(path, ValueError).fields
    kept = [k for k, v in fields.items() if isinstance(v, list)]
    assert len(kept) == KEEP_TOTAL // (KEEP_ARRAY * 8) and fields["k0"][-1] == KEEP_ARRAY - 1
    assert str(fields[f"k{keys - 1}"]) == f"<{KEEP_ARRAY} x UINT64>"


def test_a_truncated_imatrix_is_one_line(cli, tmp_path: Path) -> None:
    writer = GGUFWriter(tmp_path / "i.gguf", arch="llama")
    writer.add_string("general.type", "imatrix")
    writer.add_tensor("blk.1.ffn_gate_exps.weight.counts", np.ones((8, 1), np.float32))
    for step in (writer.write_header_to_file, writer.write_kv_data_to_file,
                 writer.write_tensors_to_file, writer.close):
        step()
    raw = (tmp_path / "i.gguf").read_bytes()
    (tmp_path / "cut.gguf").write_bytes(raw[:-40])
    assert_one_line_error(cli("traces", "import", tmp_path / "cut.gguf", "--format", "imatrix",
                              "--top-k", "2", "--out", tmp_path / "o", ok=False),
                          "cut.gguf", "blk.1.ffn_gate_exps.weight.counts", "ends past the end")
    assert not (tmp_path / "o").exists()


# Hypothesis: random key-value sections and tensor infos with hostile counts, types, nesting.

counts = st.integers(0, 4) | st.sampled_from(HUGE)
value_types = st.integers(0, 12) | st.integers(13, 2**32 - 1)


def payload(data: st.DataObject, kind: int, depth: int = 0) -> bytes:
    """Bytes of a value of GGUF type `kind` (no type code), lengths and counts maybe lies."""
    if kind in SCALAR:
        size = struct.calcsize(SCALAR[kind])
        return data.draw(st.binary(min_size=size, max_size=size))
    if kind == STRING:
        raw = data.draw(st.binary(max_size=8))
        return gguf_string(raw, data.draw(st.none() | counts))
    if kind == ARRAY:
        element = data.draw(value_types if depth < 3 else st.sampled_from(sorted(SCALAR)))
        claim = data.draw(counts)
        items = [payload(data, element, depth + 1) for _ in range(data.draw(st.integers(0, 3)))]
        return array(element, claim, b"".join(items))
    return data.draw(st.binary(max_size=16))  # an unknown type: whatever follows


def hostile_file(data: st.DataObject) -> bytes:
    entries = []
    for _ in range(data.draw(st.integers(0, 4))):
        key = data.draw(st.sampled_from(["general.alignment", "split.count", "general.type",
                                         "tokenizer.ggml.tokens", ""]) | st.text(max_size=6))
        kind = data.draw(value_types)
        entries.append(kv(key, kind, payload(data, kind)))
    tensors = [tensor_info(data.draw(st.text(max_size=70)),
                           data.draw(st.lists(st.integers(-2**63, 2**63 - 1) | st.integers(0, 64),
                                              max_size=5)),
                           data.draw(st.integers(0, 45) | st.integers(0, 2**32 - 1)),
                           data.draw(st.integers(0, 2**64 - 1) | st.just(0)))
               for _ in range(data.draw(st.integers(0, 3)))]
    n_kv = data.draw(st.just(len(entries)) | counts)
    n_tensors = data.draw(st.just(len(tensors)) | counts)
    version = data.draw(st.sampled_from([3] * 12 + [2, 1, 0, 4, 3 << 24]))  # mostly past it
    tail = data.draw(st.binary(max_size=64))
    return header(n_tensors, n_kv, version) + b"".join(entries) + b"".join(tensors) + tail


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_random_hostile_headers_are_one_line_in_bounded_memory(data: st.DataObject) -> None:
    """FILES generated files per example, every one refused by both commands as
    `refusals` checks (none is a valid MoE model or imatrix: they hold no expert tensors)."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        paths = []
        for i in range(FILES):
            paths.append(root / f"g{i}.gguf")
            paths[-1].write_bytes(hostile_file(data))
        refusals(paths, root)


# Issue 44, class 7: layer names and split parts as strictly as llama.cpp loads them.

@pytest.mark.parametrize(("names", "index"), [
    (["blk.0.ffn_gate_exps.weight", "blk.1.ffn_gate_exps.weight",
      "blk.01.ffn_gate_exps.weight"], "01"),
    (["blk.0.ffn_gate_exps.weight", "blk.00.ffn_up_exps.weight"], "00"),
    (["blk.0.ffn_gate_exps.weight", "blk.\u0661.ffn_gate_exps.weight"], "\u0661"),  # Arabic 1
    (["blk.0.ffn_gate_exps.weight", "blk.\uff11.ffn_gate_exps.weight"], "\uff11"),  # fullwidth
    (["blk.0.ffn_gate_exps.weight", "blk.+1.ffn_gate_exps.weight"], "+1"),
    (["blk.0.ffn_gate_exps.weight", "blk. 1.ffn_gate_exps.weight"], " 1"),
], ids=["leading-zero", "double-zero", "arabic-indic", "fullwidth", "plus", "space"])
def test_layer_indices_are_the_decimal_llamacpp_writes(cli, tmp_path: Path, names: list[str],
                                                       index: str) -> None:
    """llama.cpp names block tensors `blk.%d.NAME` and finds them by that name: `blk.01`
    beside `blk.1` (read as layer 1 twice) or a digit that is not ASCII (int() reads it) is a
    tensor llama.cpp never loads. One line naming the tensor, from `inspect` and from the
    header reader every GGUF command uses."""
    path = names_gguf(tmp_path / "m.gguf", names)
    result = cli("inspect", path, ok=False)
    assert_one_line_error(result, "m.gguf", f"layer index {index!r} is not the decimal "
                          "llama.cpp writes")
    with pytest.raises(ValueError, match="is not the decimal llama.cpp writes"):
        read_gguf_header(path, ValueError)


def test_canonical_layer_indices_read_as_before(cli, tmp_path: Path) -> None:
    path = names_gguf(tmp_path / "m.gguf", [f"blk.{i}.ffn_gate_exps.weight" for i in (0, 1)])
    assert cli("inspect", path).exit_code == 0


def split_model(directory: Path, **kwargs) -> list[Path]:
    """A tiny MoE GGUF split as llama-gguf-split lays it out (4 tensors a part): its parts."""
    directory.mkdir()
    write_moe_gguf(directory / "m.gguf", split_max_tensors=4, **kwargs)
    return sorted(directory.iterdir())


def set_u16(path: Path, key: str, value: int) -> None:
    """Overwrite the UINT16 value of metadata `key` in place (llama-gguf-split's split.*)."""
    raw = bytearray(path.read_bytes())
    name = struct.pack("<Q", len(key)) + key.encode() + struct.pack("<I", 2)  # UINT16
    at = raw.index(name) + len(name)
    raw[at:at + 2] = struct.pack("<H", value)
    path.write_bytes(bytes(raw))


def test_part_1_tampered_to_split_count_1_is_not_read_alone(cli, tmp_path: Path) -> None:
    """Part 1 of 4 claiming split.count 1 was read as the whole model (its quarter of the
    tensors); its name and its split.tensors.count both say otherwise."""
    parts = split_model(tmp_path / "s")
    set_u16(parts[0], "split.count", 1)
    assert_one_line_error(cli("inspect", parts[0], ok=False), parts[0].name,
                          "split.count is 1 but split.tensors.count is 13 and it holds 4")
    alone = tmp_path / "m.gguf"
    parts[0].rename(alone)
    assert_one_line_error(cli("inspect", alone, ok=False), "m.gguf", "split.tensors.count is 13",
                          "read alone it would be part of the model")
    named = tmp_path / "n-00001-of-00002.gguf"
    names_gguf(named, ["blk.0.ffn_gate_exps.weight"], blocks=1)
    assert_one_line_error(cli("inspect", named, ok=False), "named part 1 of 2 but split.count "
                          "is missing")


def test_a_part_of_another_model_is_refused(cli, tmp_path: Path) -> None:
    """A part of another model's split (same layout, other sizes) in place of part 2: its
    expert tensors are not this model's shape. A part whose split.tensors.count differs, or
    that carries other metadata, is refused too."""
    ours = split_model(tmp_path / "a")
    theirs = split_model(tmp_path / "b", hidden=512, seed=1)
    assert cli("inspect", ours[0]).exit_code == 0
    original = ours[1].read_bytes()
    ours[1].write_bytes(theirs[1].read_bytes())
    assert_one_line_error(cli("inspect", ours[0], ok=False), ours[1].name,
                          "embedding_length is 256: a part of another model")
    ours[1].write_bytes(original)
    other = split_model(tmp_path / "c", layers=3)  # more tensors: split.tensors.count 19
    ours[3].write_bytes(other[3].read_bytes())
    set_u16(ours[3], "split.count", 4)
    assert_one_line_error(cli("inspect", ours[0], ok=False), ours[3].name,
                          "split.tensors.count is")
