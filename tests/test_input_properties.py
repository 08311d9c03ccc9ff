"""Property: whatever is wrong with a checkpoint's config.json, its safetensors headers or a
trace's Parquet bytes, `placer inspect` and `placer traces stats` either succeed (the input
was still valid) or exit 1 with one line on stderr starting `error:`, never a traceback
(issue 16). Inputs that are invalid by construction must give that error."""

from __future__ import annotations

import functools
import json
import struct
import tempfile
from pathlib import Path

import click
import numpy as np
import typer
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from placer.checkpoint.config import CONFIG_INTS
from placer.checkpoint.header import DTYPE_BITS
from traces.storing.writer import TraceWriter

SETTINGS = settings(max_examples=20, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow])
LAYERS, EXPERTS, HIDDEN, INTER = 2, 4, 8, 4

CONFIG = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
          "num_hidden_layers": LAYERS, "hidden_size": HIDDEN, "intermediate_size": 16,
          "moe_intermediate_size": INTER, "num_experts": EXPERTS, "num_experts_per_tok": 2,
          "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 4,
          "vocab_size": 16, "decoder_sparse_step": 1, "mlp_only_layers": [],
          "torch_dtype": "float32"}


def tensors() -> dict[str, tuple[str, list[int]]]:
    """{name: (dtype, shape)} of a 2-layer, 4-expert qwen3_moe-style checkpoint."""
    out = {"model.embed_tokens.weight": ("F32", [16, HIDDEN])}
    for layer in range(LAYERS):
        out[f"model.layers.{layer}.mlp.gate.weight"] = ("F32", [EXPERTS, HIDDEN])
        for e in range(EXPERTS):
            p = f"model.layers.{layer}.mlp.experts.{e}"
            out |= {f"{p}.gate_proj.weight": ("BF16", [INTER, HIDDEN]),
                    f"{p}.up_proj.weight": ("BF16", [INTER, HIDDEN]),
                    f"{p}.down_proj.weight": ("BF16", [HIDDEN, INTER])}
    return out


def header_and_data() -> tuple[dict, bytes]:
    header, pos = {"__metadata__": {"format": "pt"}}, 0
    for name, (dtype, shape) in tensors().items():
        n = int(np.prod(shape)) * DTYPE_BITS[dtype] // 8
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [pos, pos + n]}
        pos += n
    return header, np.random.default_rng(0).integers(0, 256, pos, np.uint8).tobytes()


def safetensors_bytes(header: dict | bytes, data: bytes, length: int | None = None) -> bytes:
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<Q", len(raw) if length is None else length) + raw + data


def checkpoint(root: Path, config: object = CONFIG, shard: bytes | None = None) -> Path:
    root.mkdir(parents=True)
    (root / "config.json").write_text(json.dumps(config))
    (root / "model.safetensors").write_bytes(shard if shard is not None
                                             else safetensors_bytes(*header_and_data()))
    return root


def assert_clean(result, *, must_fail: bool) -> None:
    """Exit 0 (unless `must_fail`) or exit 1 with one `error:` line on stderr; no traceback."""
    assert result.exception is None or isinstance(result.exception, SystemExit), \
        f"traceback: {result.exception!r}\n{result.output}"
    assert "Traceback" not in result.output
    if result.exit_code == 0 and not must_fail:
        return
    assert result.exit_code == 1, result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr


@functools.cache
def placer_command() -> click.Command:
    """The real app (`placer.cli.app`) as the click command typer's CliRunner builds from it
    on every call: built once here, since building it is most of an invocation's time."""
    from placer.cli import app

    return typer.main.get_command(app)


def invoke(*args: object):
    return CliRunner().invoke(placer_command(), [str(a) for a in args], prog_name="placer")


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats() | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner,
                                                                max_size=3),
    max_leaves=6)
not_a_count = json_values.filter(lambda v: v is not None and not (  # null means absent
    isinstance(v, int) and not isinstance(v, bool) and v >= 0))


@SETTINGS
@given(key=st.sampled_from(sorted(k for k in CONFIG_INTS if k in CONFIG)), value=not_a_count)
def test_config_counts_of_the_wrong_type(key: str, value: object) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = checkpoint(Path(tmp) / "c", {**CONFIG, key: value})
        assert_clean(invoke("inspect", ckpt), must_fail=True)
        assert_clean(invoke("inspect", "--config", ckpt / "config.json"), must_fail=True)


@SETTINGS
@given(config=st.one_of(
    json_values.filter(lambda v: not isinstance(v, dict)),
    st.tuples(st.sampled_from(sorted(CONFIG) + ["text_config", "quantization_config",
                                                "first_k_dense_replace", "dtype"]),
              json_values | st.integers(0, 2**40)).map(lambda kv: {**CONFIG, kv[0]: kv[1]})))
def test_mutated_config(config: object) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = checkpoint(Path(tmp) / "c", config)
        must_fail = not isinstance(config, dict)
        assert_clean(invoke("inspect", ckpt), must_fail=must_fail)
        assert_clean(invoke("inspect", "--config", ckpt / "config.json"), must_fail=must_fail)


names = sorted(tensors())
header_faults = st.one_of(
    st.tuples(st.just("dtype"), st.sampled_from(names),
              json_values.filter(lambda v: not (isinstance(v, str) and v in DTYPE_BITS))),
    st.tuples(st.just("shape"), st.sampled_from(names), json_values),
    st.tuples(st.just("data_offsets"), st.sampled_from(names),
              st.lists(st.integers(-10, 6000), min_size=0, max_size=3) | json_values),
    st.tuples(st.just("entry"), st.sampled_from(names), json_values),
    st.tuples(st.just("__metadata__"), st.just(""),
              json_values.filter(lambda v: not (isinstance(v, dict) and all(
                  isinstance(x, str) for x in v.values())) and v is not None)),
)


@SETTINGS
@given(fault=header_faults)
def test_mutated_header_values(fault: tuple[str, str, object]) -> None:
    kind, name, value = fault
    header, data = header_and_data()
    if kind == "__metadata__":
        header["__metadata__"] = value
    elif kind == "entry":
        header[name] = value
    else:
        header[name] = {**header[name], kind: value}
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = checkpoint(Path(tmp) / "c", shard=safetensors_bytes(header, data))
        assert_clean(invoke("inspect", ckpt), must_fail=kind in ("dtype", "__metadata__"))


@SETTINGS
@given(length=st.integers(0, 2**64 - 1), cut=st.integers(0, 40_000),
       flips=st.lists(st.tuples(st.integers(0, 40_000), st.integers(1, 255)), max_size=4),
       fault=st.sampled_from(["length", "truncate", "flip"]))
def test_mutated_header_bytes(length: int, cut: int, flips: list[tuple[int, int]],
                              fault: str) -> None:
    header, data = header_and_data()
    good = safetensors_bytes(header, data)
    if fault == "length":
        shard = safetensors_bytes(header, data, length)
        must_fail = length != len(good) - 8 - len(data)
    elif fault == "truncate":
        shard, must_fail = good[:cut % len(good)], True
    else:  # bytes flipped inside the header (data bytes are not checked by inspect)
        raw = bytearray(good)
        end = len(good) - len(data)
        for at, mask in flips:
            raw[at % end] ^= mask
        shard, must_fail = bytes(raw), False
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = checkpoint(Path(tmp) / "c", shard=shard)
        assert_clean(invoke("inspect", ckpt), must_fail=must_fail)


def trace_bytes() -> bytes:
    """A small per-token trace (several row groups) as Parquet bytes."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "t.parquet"
        meta = {"kind": "tokens", "fingerprint": "0" * 16, "num_layers": 2, "moe_layers": [0, 1],
                "experts_per_layer": 8, "top_k": 2, "tag": "t"}
        rng = np.random.default_rng(0)
        n = 600
        with TraceWriter(path, tag="t", top_k=2, meta=meta, row_group_rows=150) as w:
            w.write(np.arange(n) // 20, np.arange(n) % 20 // 2, rng.integers(0, 99, n),
                    np.ones(n, np.int32), np.arange(n) % 2,
                    np.stack([rng.permutation(8)[:2] for _ in range(n)]), None)
            w.close()
        return path.read_bytes()


TRACE = trace_bytes()


@SETTINGS
@given(flips=st.lists(st.tuples(st.integers(0, len(TRACE) - 1), st.integers(1, 255),
                                st.integers(1, 64)), min_size=1, max_size=3),
       cut=st.none() | st.integers(0, len(TRACE) - 1))
def test_corrupted_trace_bytes(flips: list[tuple[int, int, int]], cut: int | None) -> None:
    raw = bytearray(TRACE)
    for at, mask, span in flips:
        for i in range(at, min(at + span, len(raw))):
            raw[i] ^= mask
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "tr"
        root.mkdir()
        (root / "t.parquet").write_bytes(bytes(raw[:cut]) if cut is not None else bytes(raw))
        assert_clean(invoke("traces", "stats", root), must_fail=cut is not None)


# --- issue 27: sizes from headers, nesting depth, huge integers, in every file reader --------

def npy_bytes(shape: tuple[int, ...], dtype: str, data: int) -> bytes:
    """A .npy file whose header claims `shape` of `dtype`, followed by `data` zero bytes."""
    header = str({"descr": dtype, "fortran_order": False, "shape": shape})
    header += " " * (-(len(header) + 11) % 64) + "\n"
    return (b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header.encode()
            + bytes(data))


def importer_config(root: Path) -> Path:
    from importer_files import write_config

    return write_config(root / "model")


@SETTINGS
@given(shape=st.lists(st.integers(0, 10**15), min_size=1, max_size=3).map(tuple),
       dtype=st.sampled_from(["<i8", "<i4", "|u1", "<f8", "<u2"]), data=st.integers(0, 256),
       how=st.sampled_from(["counts .npy", "vllm .npy", "tokens .npz member"]))
def test_array_sizes_from_headers(shape: tuple[int, ...], dtype: str, data: int,
                                  how: str) -> None:
    """Whatever a .npy header (or an .npz member's) claims, the importer compares it with the
    bytes there are before it allocates anything: one line or success, never MemoryError."""
    import zipfile

    claimed = int(np.prod(shape, dtype=object)) * np.dtype(dtype).itemsize
    raw = npy_bytes(shape, dtype, data)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        config = importer_config(root)
        if how == "tokens .npz member":
            path = root / "r.npz"
            with zipfile.ZipFile(path, "w") as zf:
                zf.writestr("expert_ids.npy", raw)
            extra = ["--config", config]
        else:
            path = root / "r.npy"
            path.write_bytes(raw)
            extra = ["--top-k", 2] if how == "counts .npy" else ["--format", "vllm", "--config",
                                                                config]
        result = invoke("traces", "import", path, "--out", root / "o", *extra)
        assert_clean(result, must_fail=claimed != data)
        if result.exit_code:
            assert not (root / "o").exists()


NEST = {"[": "]", '{"a": ': "}"}


def nested(depth: int, opener: str) -> str:
    return opener * depth + "1" + NEST[opener] * depth


def readers(root: Path, value: str) -> list[tuple[list, Path]]:
    """(placer argv, file holding `value`) for each JSON or TOML reader placer has: a
    checkpoint's config.json and safetensors header, SGLang responses, vLLM prompt lengths,
    TensorRT-LLM's meta_info.json, a hardware spec, a plan, a placed manifest. An integer
    `value` stands where an integer belongs (a data offset, a count); a nested one where any
    value may be."""
    config = importer_config(root)
    out = []
    ckpt = checkpoint(root / "c1")
    (ckpt / "config.json").write_text(json.dumps(CONFIG)[:-1] + f', "extra": {value}}}')
    out.append((["inspect", ckpt], ckpt / "config.json"))
    header, data = header_and_data()
    raw = json.dumps(header)
    raw = raw.replace('"data_offsets": [0,', f'"data_offsets": [{value},', 1)
    ckpt2 = checkpoint(root / "c2", shard=safetensors_bytes(raw.encode(), data))
    out.append((["inspect", ckpt2], ckpt2 / "model.safetensors"))
    (root / "r.jsonl").write_text('{"meta_info": {"prompt_tokens": ' + value + "}}\n")
    out.append((["traces", "import", root / "r.jsonl", "--config", config], root / "r.jsonl"))
    np.save(root / "r.npy", np.zeros((2, 4, 2), np.int32) + [0, 1])
    (root / "lens.json").write_text('{"r": ' + value + "}")
    out.append((["traces", "import", root / "r.npy", "--format", "vllm", "--config", config,
                 "--prompt-lens", root / "lens.json"], root / "lens.json"))
    stats = root / "stats"
    stats.mkdir()
    (stats / "meta_info.json").write_text('{"num_experts": ' + value + "}")
    (stats / "rank0.safetensors").write_bytes(b"")
    out.append((["traces", "import", stats, "--format", "trtllm"], stats / "meta_info.json"))
    toml_value = value.replace('{"a": ', "{a = ")
    toml = f"cards = {value}" if value.isdigit() else f"cards = 1\nextra = {toml_value}"
    (root / "box.toml").write_text(f"name = \"x\"\n{toml}\n")
    out.append((["hardware", "show", root / "box.toml"], root / "box.toml"))
    (root / "plan.json").write_text('{"format": ' + value + "}")
    out.append((["export", "llamacpp", root / "plan.json"], root / "plan.json"))
    (root / "placed").mkdir()
    (root / "placed" / "manifest.json").write_text('{"format": ' + value + "}")
    out.append((["verify", root / "placed", "--model", ckpt], root / "placed" / "manifest.json"))
    return out


@settings(SETTINGS, max_examples=8)
@given(depth=st.integers(65, 20000), opener=st.sampled_from(sorted(NEST)))
def test_nesting_depth_in_every_reader(depth: int, opener: str) -> None:
    """JSON or TOML nested past 64 levels (thousands, where the parsers recursed out) is one
    line naming the file in every reader."""
    with tempfile.TemporaryDirectory() as tmp:
        for args, path in readers(Path(tmp), nested(depth, opener)):
            result = invoke(*args, "--out", Path(tmp) / "o") if args[0] == "traces" \
                else invoke(*args)
            assert_clean(result, must_fail=True)
            assert path.name in result.stderr, (args, result.stderr)


@settings(SETTINGS, max_examples=8)
@given(digits=st.integers(21, 6000))
def test_huge_integers_in_every_reader(digits: int) -> None:
    """Integers past 20 digits (beyond any count or offset; past 4300, int() itself refuses)
    are one line in every reader."""
    with tempfile.TemporaryDirectory() as tmp:
        for args, path in readers(Path(tmp), "9" * digits):
            result = invoke(*args, "--out", Path(tmp) / "o") if args[0] == "traces" \
                else invoke(*args)
            assert_clean(result, must_fail=True)
            assert path.name in result.stderr or "box.toml" in " ".join(map(str, args)), \
                (args, result.stderr)


def test_bytes_that_are_not_utf8_in_every_reader() -> None:
    """A byte that is never UTF-8 at the start of each reader's text (a safetensors header:
    after its length) is one line naming the file, the byte and its offset."""
    with tempfile.TemporaryDirectory() as tmp:
        for args, path in readers(Path(tmp), "1"):
            raw = path.read_bytes()
            if path.suffix == ".safetensors":
                size = struct.unpack("<Q", raw[:8])[0]
                raw = struct.pack("<Q", size + 1) + b"\xff" + raw[8:]
            else:
                raw = b"\xff" + raw
            path.write_bytes(raw)
            result = invoke(*args, "--out", Path(tmp) / "o") if args[0] == "traces" \
                else invoke(*args)
            assert_clean(result, must_fail=True)
            assert path.name in result.stderr and "not UTF-8 text (byte 0xff at byte offset " \
                "0)" in result.stderr, (args, result.stderr)
