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
from traces.writer import TraceWriter

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
