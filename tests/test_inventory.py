"""The inventory against the real tensors of real (tiny) checkpoints of five architectures."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import numpy as np
import pytest
from safetensors import safe_open

from placer.checkpoint.estimate import estimate_inventory
from placer.checkpoint.inventory import read_inventory
from placer.checkpoint.sparse import write_sparse_checkpoint
from placer.checkpoint.tiny import ARCHITECTURES, quantize_layout

REPO = Path(__file__).resolve().parent.parent


def real_tensors(checkpoint: Path) -> dict[str, np.ndarray]:
    """Every tensor of a checkpoint as raw bytes (uint8), read with safetensors itself."""
    out = {}
    for path in checkpoint.glob("*.safetensors"):
        with safe_open(path, "pt") as f:
            for name in f.keys():
                t = f.get_tensor(name).contiguous()
                out[name] = t.view(-1).view(__import__("torch").uint8).numpy()
    return out


def assert_ranges_match(checkpoint: Path) -> None:
    """Every expert byte range in the inventory holds exactly that expert's tensor bytes."""
    inv = read_inventory(checkpoint)
    tensors = real_tensors(checkpoint)
    covered = {}
    for ex in inv.experts:
        for r in ex.tensors:
            with open(checkpoint / r.file, "rb") as f:
                f.seek(r.offset)
                on_disk = np.frombuffer(f.read(r.length), dtype=np.uint8)
            expected = tensors[r.name][r.tensor_offset:r.tensor_offset + r.length]
            assert np.array_equal(on_disk, expected), (ex.layer, ex.expert, r.name)
            covered[r.name] = covered.get(r.name, 0) + r.length
    for name, nbytes in covered.items():  # fused tensors are covered exactly, no gap, no overlap
        assert nbytes == tensors[name].size, name
    dense = {t.name for t in inv.dense_tensors}
    assert dense | set(covered) == set(tensors) and not dense & set(covered)
    assert inv.dense_bytes == sum(tensors[n].size for n in dense)


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_inventory_matches_real_tensors(tiny_models: dict[str, Path], arch: str) -> None:
    assert_ranges_match(tiny_models[arch])


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_inspect_json_contract(tiny_models: dict[str, Path], cli, arch: str) -> None:
    out = json.loads(cli("inspect", tiny_models[arch], "--json").stdout)
    config = json.loads((tiny_models[arch] / "config.json").read_text())
    first_moe = config.get("first_k_dense_replace", 0)
    assert out["moe_layers"] == list(range(first_moe, config["num_hidden_layers"]))
    assert out["dense_layers"] == list(range(first_moe))
    assert out["experts_per_layer"] == 8 and out["top_k"] == 2
    assert len(out["experts"]) == 8 * len(out["moe_layers"])
    assert out["expert_bytes_total"] == sum(e["bytes"] for e in out["experts"])
    e = out["experts"][3]
    assert (e["layer"], e["expert"]) == (out["moe_layers"][0], 3)
    assert e["bytes"] == sum(t["length"] for t in e["tensors"])
    for t in e["tensors"]:
        assert {"name", "file", "offset", "length", "dtype", "shape"} <= set(t)
        assert (tiny_models[arch] / t["file"]).is_file()


def test_fused_names_and_shapes(tiny_models: dict[str, Path]) -> None:
    inv = read_inventory(tiny_models["gpt_oss"])
    names = [r.name for r in inv.expert(0, 5).tensors]
    assert names == [f"model.layers.0.mlp.experts.{n}" for n in
                     ("down_proj", "down_proj_bias", "gate_up_proj", "gate_up_proj_bias")]
    gate_up = inv.expert(0, 5).tensors[2]
    assert gate_up.fused_shape == (8, 32, 128) and gate_up.shape == (32, 128)
    assert gate_up.tensor_offset == 5 * gate_up.length


def test_deepseek_dense_layers_and_shared_experts(tiny_models: dict[str, Path]) -> None:
    inv = read_inventory(tiny_models["deepseek_v3"])
    assert inv.moe_layers == (1, 2) and inv.dense_layers == (0,) and inv.shared_experts == 1
    dense = {t.name for t in inv.dense_tensors}
    assert "model.layers.1.mlp.shared_experts.up_proj.weight" in dense
    assert "model.layers.1.mlp.gate.e_score_correction_bias" in dense


def test_sharded_checkpoint(tiny_models: dict[str, Path]) -> None:
    inv = read_inventory(tiny_models["mixtral"])
    assert len(inv.files) > 1 and (tiny_models["mixtral"] / "model.safetensors.index.json").exists()
    assert len({r.file for e in inv.experts for r in e.tensors}) > 1


@pytest.mark.parametrize("arch,kind", [("deepseek_v3", "fp8"), ("gpt_oss", "mxfp4")])
def test_quantized_layouts(tiny_models: dict[str, Path], tmp_path: Path, arch: str, kind: str
                           ) -> None:
    quantized = quantize_layout(tiny_models[arch], tmp_path / kind, kind)
    assert_ranges_match(quantized)
    inv = read_inventory(quantized)
    dtypes = {r.name.rsplit(".", 1)[-1] if kind == "fp8" else r.name.rsplit("_", 1)[-1]: r.dtype
              for r in inv.experts[0].tensors}
    if kind == "fp8":
        assert dtypes == {"weight": "F8_E4M3", "weight_scale_inv": "F32"}
    else:
        assert dtypes == {"blocks": "U8", "scales": "U8", "bias": "F32"}


def test_sparse_deepseek_v3_sized_checkpoint_reads_only_headers(tmp_path: Path) -> None:
    config_path = REPO / "examples" / "deepseek-v3" / "config.json"
    estimated = estimate_inventory(config_path, "fp8", "fp8")
    ckpt = write_sparse_checkpoint(estimated, tmp_path / "dsv3",
                                   json.loads(config_path.read_text()), shards=64)
    on_disk = sum(p.stat().st_size for p in ckpt.glob("*.safetensors"))
    assert on_disk > 600e9  # the apparent size of DeepSeek-V3 in FP8
    before = _bytes_read()
    inv = read_inventory(ckpt)
    read = _bytes_read() - before
    header_bytes = sum(8 + struct.unpack("<Q", p.open("rb").read(8))[0]
                       for p in ckpt.glob("*.safetensors"))
    assert read < header_bytes + 64 * 2**20  # headers, the index and config: nothing else
    assert len(inv.moe_layers) == 58 and inv.experts_per_layer == 256 and inv.top_k == 8
    assert inv.dense_layers == (0, 1, 2)
    assert inv.expert_bytes_total == estimated.expert_bytes_total
    assert inv.dense_bytes == estimated.dense_bytes
    assert inv.fingerprint == estimated.fingerprint  # same names, dtypes, shapes


def _bytes_read() -> int:
    for line in Path(f"/proc/{os.getpid()}/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("no rchar in /proc/self/io")


def test_estimate_mxfp4_expert_bytes() -> None:
    inv = estimate_inventory(REPO / "examples" / "deepseek-v3" / "config.json", "mxfp4")
    hidden, inter = 7168, 2048
    per_matrix = hidden * inter // 2 + hidden * inter // 32  # 4-bit values + one scale per 32
    assert inv.experts[0].bytes == 3 * per_matrix
    assert inv.estimated and inv.experts[0].tensors[0].file is None
