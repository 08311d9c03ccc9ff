"""Bad checkpoints get one clear line and exit 1, never a traceback."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import pytest


def copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def single_file(ckpt: Path) -> Path:
    return ckpt / "model.safetensors"


def assert_one_line_error(result, *needles: str) -> None:
    assert result.exit_code == 1, result.output
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_missing_dir(cli, tmp_path: Path) -> None:
    assert_one_line_error(cli("inspect", tmp_path / "nope", ok=False), "not found")


def test_no_config(cli, tiny_models, tmp_path: Path) -> None:
    ckpt = copy(tiny_models["qwen3_moe"], tmp_path / "c")
    (ckpt / "config.json").unlink()
    assert_one_line_error(cli("inspect", ckpt, ok=False), "config.json")


def test_not_moe(cli, tmp_path: Path) -> None:
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model("llama", vocab_size=64, hidden_size=16, intermediate_size=32,
                                  num_hidden_layers=1, num_attention_heads=2)
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path / "llama")
    assert_one_line_error(cli("inspect", tmp_path / "llama", ok=False), "not an MoE model")


def test_truncated_header(cli, tiny_models, tmp_path: Path) -> None:
    ckpt = copy(tiny_models["olmoe"], tmp_path / "c")
    data = single_file(ckpt).read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    single_file(ckpt).write_bytes(data[: 8 + n // 2])
    assert_one_line_error(cli("inspect", ckpt, ok=False), "model.safetensors", "header")


def test_truncated_data(cli, tiny_models, tmp_path: Path) -> None:
    ckpt = copy(tiny_models["olmoe"], tmp_path / "c")
    data = single_file(ckpt).read_bytes()
    single_file(ckpt).write_bytes(data[:-100])
    assert_one_line_error(cli("inspect", ckpt, ok=False), "truncated")


def test_header_lies_about_sizes(cli, tiny_models, tmp_path: Path) -> None:
    ckpt = copy(tiny_models["olmoe"], tmp_path / "c")
    data = single_file(ckpt).read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    name = next(k for k in header if ".experts.3." in k)
    header[name]["shape"] = [d * 2 for d in header[name]["shape"]]
    raw = json.dumps(header).encode()
    single_file(ckpt).write_bytes(struct.pack("<Q", len(raw)) + raw + data[8 + n:])
    assert_one_line_error(cli("inspect", ckpt, ok=False), name, "needs")


def test_index_names_missing_shard(cli, tiny_models, tmp_path: Path) -> None:
    ckpt = copy(tiny_models["mixtral"], tmp_path / "c")
    victim = sorted(ckpt.glob("model-*.safetensors"))[1]
    victim.unlink()
    assert_one_line_error(cli("inspect", ckpt, ok=False), "missing shard", victim.name)


@pytest.mark.parametrize("args", [[], ["x", "--config", "y"]])
def test_needs_exactly_one_source(cli, args) -> None:
    assert_one_line_error(cli("inspect", *args, ok=False), "--config")
