"""The inventory of a GGUF model (issue 32): llama.cpp's fused expert tensors of any ggml type
reduce to exact per-expert byte ranges, split files read as one model, and a tiny Hugging Face
model written as safetensors and as an F32 GGUF is the same MoE model."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from cli_errors import assert_one_line_error
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType, GGUFWriter
from gguf_files import PROJECTIONS, row_bytes, write_moe_gguf
from safetensors.numpy import load_file

from placer.checkpoint.inventory import read_inventory
from placer.checkpoint.tiny import build_tiny_model

T = GGMLQuantizationType


def inspect_json(cli, path: Path) -> dict:
    return json.loads(cli("inspect", path, "--json").stdout)


def file_bytes(path: Path, offset: int, length: int) -> bytes:
    with path.open("rb") as f:
        f.seek(offset)
        return f.read(length)


def test_quantized_experts_are_exact_byte_ranges(cli, tmp_path: Path) -> None:
    """Q4_K gate, Q6_K up, MXFP4 down: each expert's bytes are the size arithmetic of its
    three slices, and the bytes at each range are exactly the bytes written for that expert
    (ggml's ne order: the expert is the outermost dimension)."""
    path = tmp_path / "m.gguf"
    hidden, ff, experts = 256, 512, 4
    data = write_moe_gguf(path, hidden=hidden, ff=ff, experts=experts, layers=3,
                          dense_layers=(0,), types=(T.Q4_K, T.Q6_K, T.MXFP4))
    d = inspect_json(cli, path)
    expected = (ff * row_bytes(T.Q4_K, hidden) + ff * row_bytes(T.Q6_K, hidden)
                + hidden * row_bytes(T.MXFP4, ff))
    assert expected == ff * hidden // 256 * 144 + ff * hidden // 256 * 210 + hidden * ff // 32 * 17
    assert (d["moe_layers"], d["dense_layers"], d["experts_per_layer"], d["top_k"]) == \
        ([1, 2], [0], experts, 2)
    assert d["bytes_per_expert"] == {"min": expected, "max": expected}
    assert d["expert_bytes_total"] == 2 * experts * expected
    written_dense = sum(a.nbytes for n, a in data.items() if "_exps." not in n)
    assert d["dense_bytes"] == written_dense
    assert d["files"] == [{"name": "m.gguf", "size": path.stat().st_size}]
    for ex in d["experts"]:
        assert [t["name"] for t in ex["tensors"]] == sorted(
            f"blk.{ex['layer']}.{p}.weight" for p in PROJECTIONS)
        for t in ex["tensors"]:
            assert file_bytes(path, t["offset"], t["length"]) == \
                data[t["name"]][ex["expert"]].tobytes()
            assert t["fused_shape"][0] == experts
    down = next(t for t in d["experts"][0]["tensors"] if "down" in t["name"])
    assert (down["dtype"], down["shape"]) == ("MXFP4", [hidden, ff])


@pytest.mark.parametrize("kind", sorted(GGML_QUANT_SIZES, key=int), ids=lambda k: k.name)
def test_every_ggml_type(tmp_path: Path, kind: GGMLQuantizationType) -> None:
    """Every type of gguf's GGML_QUANT_SIZES: expert bytes = rows x row bytes of the type."""
    block, size = GGML_QUANT_SIZES[kind]
    hidden = ff = 256  # a whole number of blocks of every type
    path = tmp_path / "m.gguf"
    write_moe_gguf(path, layers=1, hidden=hidden, ff=ff, types=(kind, kind, kind))
    inv = read_inventory(path)
    per = 3 * ff * (hidden // block) * size
    assert inv.expert_bytes().tolist() == [[per] * 4]
    assert {t.dtype for e in inv.experts for t in e.tensors} == {kind.name}


def test_biases_and_shared_experts(cli, tmp_path: Path) -> None:
    """gpt-oss's expert biases (ne {n_ff, n_expert}) are the experts'; a shared expert is
    dense and counted from expert_shared_count."""
    path = tmp_path / "m.gguf"
    data = write_moe_gguf(path, biases=True, shared=True, types=(T.MXFP4,) * 3)
    d = inspect_json(cli, path)
    ex = d["experts"][5]  # layer 1, expert 1
    names = [t["name"] for t in ex["tensors"]]
    assert names == sorted(f"blk.1.{p}.{s}" for p in PROJECTIONS for s in ("weight", "bias"))
    for t in ex["tensors"]:
        assert file_bytes(path, t["offset"], t["length"]) == data[t["name"]][1].tobytes()
    assert d["shared_experts"] == 1
    assert d["dense_bytes"] == sum(a.nbytes for n, a in data.items() if "_exps." not in n)


def test_mtp_blocks_are_left_out(tmp_path: Path) -> None:
    """The last nextn_predict_layers blocks (multi-token prediction), which llama.cpp does not
    load by default, are not layers of the model: neither experts nor dense bytes."""
    path = tmp_path / "m.gguf"
    data = write_moe_gguf(path, layers=3, nextn=1)
    inv = read_inventory(path)
    assert (inv.num_layers, inv.moe_layers) == (2, (0, 1))
    assert inv.dense_bytes == sum(a.nbytes for n, a in data.items()
                                  if "_exps." not in n and not n.startswith("blk.2."))


def test_split_files_read_as_one_model(cli, tmp_path: Path) -> None:
    """gguf's split writer (llama-gguf-split's layout): the first part reads every part,
    the fingerprint is the whole file's; a missing part and a later part are refused."""
    whole = tmp_path / "whole" / "m.gguf"
    whole.parent.mkdir()
    data = write_moe_gguf(whole)
    split_dir = tmp_path / "split"
    split_dir.mkdir()
    write_moe_gguf(split_dir / "m.gguf", split_max_tensors=4)
    parts = sorted(p.name for p in split_dir.iterdir())
    assert len(parts) >= 3 and parts[0] == f"m-00001-of-{len(parts):05d}.gguf", parts
    one, many = read_inventory(whole), read_inventory(split_dir / parts[0])
    assert many.fingerprint == one.fingerprint
    assert [f.name for f in many.files] == parts
    assert (many.expert_bytes() == one.expert_bytes()).all()
    assert many.dense_bytes == one.dense_bytes
    for ex in many.experts:
        for t in ex.tensors:
            assert file_bytes(split_dir / t.file, t.offset, t.length) == \
                data[t.name][ex.expert].tobytes()
    assert len({t.file for ex in many.experts for t in ex.tensors}) > 1
    assert_one_line_error(cli("inspect", split_dir / parts[1], ok=False),
                          f"is part 2 of {len(parts)}: give the first part", parts[0])
    (split_dir / parts[-1]).unlink()
    assert_one_line_error(cli("inspect", split_dir / parts[0], ok=False),
                          f"split part {len(parts)} of {len(parts)} is missing", parts[-1])


def test_fingerprint_follows_tensors_and_architecture(tmp_path: Path) -> None:
    a, b, c = (tmp_path / f"{n}.gguf" for n in "abc")
    write_moe_gguf(a, seed=0)
    write_moe_gguf(b, seed=1)  # other bytes, same model
    write_moe_gguf(c, types=(T.Q4_K, T.Q6_K, T.Q4_K))  # another quantization
    assert read_inventory(a).fingerprint == read_inventory(b).fingerprint
    assert read_inventory(a).fingerprint != read_inventory(c).fingerprint


def test_not_a_moe_and_wrong_expert_counts_are_one_line(cli, tmp_path: Path) -> None:
    dense = tmp_path / "dense.gguf"
    writer = GGUFWriter(dense, "llama")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((4, 32), dtype=np.float32))
    for step in (writer.write_header_to_file, writer.write_kv_data_to_file,
                 writer.write_tensors_to_file, writer.close):
        step()
    assert_one_line_error(cli("inspect", dense, ok=False), "not an MoE model", "expert_count")
    wrong = tmp_path / "wrong.gguf"
    write_moe_gguf(wrong, experts=4, top_k=6)
    assert_one_line_error(cli("inspect", wrong, ok=False), "expert_used_count 6")
    assert_one_line_error(cli("inspect", tmp_path / "absent.gguf", ok=False),
                          "GGUF file not found")


def test_solve_and_import_take_a_gguf(cli, tmp_path: Path) -> None:
    """`traces import --model m.gguf` checks counts against the GGUF's shape, `solve --model
    m.gguf` plans from its sizes; emit refuses a GGUF in one line."""
    path = tmp_path / "m.gguf"
    write_moe_gguf(path)
    inv = read_inventory(path)
    np.save(tmp_path / "wrong.npy", np.ones((3, 4), np.int64))
    assert_one_line_error(cli("traces", "import", tmp_path / "wrong.npy", "--format", "counts",
                              "--model", path, "--out", tmp_path / "w", ok=False), "wrong.npy")
    np.save(tmp_path / "counts.npy", np.array([[30, 10, 12, 8], [5, 25, 20, 10]]))
    cli("traces", "import", tmp_path / "counts.npy", "--format", "counts", "--model", path,
        "--out", tmp_path / "counts")
    per = int(inv.expert_bytes()[0, 0])
    cli("solve", "--hardware", "1x-rtx4090", "--model", path, "--out", tmp_path / "plan.json",
        "--budget", str(5 * per), "--traces", tmp_path / "counts", "--cache", "0", "--json")
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert plan["model"]["fingerprint"] == inv.fingerprint
    assert_one_line_error(cli("emit", "--plan", tmp_path / "plan.json", "--model", path, "--out",
                              tmp_path / "placed", ok=False), "is a GGUF model")
    assert not (tmp_path / "placed").exists()


HF_TO_GGUF = {"gate_proj": "ffn_gate_exps", "w1": "ffn_gate_exps", "up_proj": "ffn_up_exps",
              "w3": "ffn_up_exps", "down_proj": "ffn_down_exps", "w2": "ffn_down_exps"}
GGUF_ARCH = {"qwen3_moe": "qwen3moe", "mixtral": "llama", "deepseek_v3": "deepseek2"}


def convert_to_f32_gguf(checkpoint: Path, out: Path) -> None:
    """The checkpoint as llama.cpp's converter lays it out (experts stacked into fused
    `blk.L.ffn_*_exps.weight`, shared experts as `ffn_*_shexp`), every tensor F32."""
    config = json.loads((checkpoint / "config.json").read_text())
    inv = read_inventory(checkpoint)
    tensors = {}
    for p in sorted(checkpoint.glob("*.safetensors")):
        tensors.update(load_file(p))
    writer = GGUFWriter(out, GGUF_ARCH[config["model_type"]])
    writer.add_block_count(inv.num_layers)
    writer.add_expert_count(inv.experts_per_layer)
    writer.add_expert_used_count(inv.top_k)
    writer.add_expert_shared_count(inv.shared_experts)
    expert_names = {t.name for e in inv.experts for t in e.tensors}
    for layer in inv.moe_layers:
        first = inv.expert(layer, 0)
        for t in first.tensors:
            proj = HF_TO_GGUF[t.name.split(".")[-2]]
            stacked = np.stack([tensors[r.name] for e in range(inv.experts_per_layer)
                                for r in inv.expert(layer, e).tensors
                                if r.name.split(".")[-2] == t.name.split(".")[-2]])
            writer.add_tensor(f"blk.{layer}.{proj}.weight", stacked.astype(np.float32))
    for name, array in tensors.items():
        if name in expert_names:
            continue
        parts = name.split(".")
        if "shared_experts" in parts:
            name = f"blk.{parts[2]}.ffn_{parts[-2].split('_')[0]}_shexp.weight"
        writer.add_tensor(name, array.astype(np.float32))
    for step in (writer.write_header_to_file, writer.write_kv_data_to_file,
                 writer.write_tensors_to_file, writer.close):
        step()


@pytest.mark.parametrize("arch", sorted(GGUF_ARCH))
def test_a_tiny_model_as_safetensors_and_gguf_is_one_moe_model(tmp_path: Path,
                                                               arch: str) -> None:
    ckpt = build_tiny_model(arch, tmp_path / arch, texts=["a tiny corpus"] * 4, vocab=300)
    convert_to_f32_gguf(ckpt, tmp_path / "m.gguf")
    hf, gg = read_inventory(ckpt), read_inventory(tmp_path / "m.gguf")
    assert (gg.num_layers, gg.moe_layers, gg.experts_per_layer, gg.top_k,
            gg.shared_experts) == (hf.num_layers, hf.moe_layers, hf.experts_per_layer,
                                   hf.top_k, hf.shared_experts)
    assert (gg.expert_bytes() == hf.expert_bytes()).all()  # F32 on both sides
    assert gg.dense_bytes == hf.dense_bytes
    for layer in hf.moe_layers:
        for e in (0, hf.experts_per_layer - 1):
            want = b"".join(file_bytes(ckpt / r.file, r.offset, r.length)
                            for r in sorted(hf.expert(layer, e).tensors,
                                            key=lambda r: HF_TO_GGUF[r.name.split(".")[-2]]))
            got = b"".join(file_bytes(tmp_path / r.file, r.offset, r.length)
                           for r in gg.expert(layer, e).tensors)
            assert got == want


@pytest.mark.parametrize("dtype", ["q4_k", "q6_k", "iq4_xs", "q8_0", "q2_k", "mxfp4", "f16"])
def test_config_estimates_in_ggml_types(cli, tmp_path: Path, dtype: str) -> None:
    """--expert-dtype with a ggml type: each expert is gate, up (moe_intermediate rows of
    hidden) and down (hidden rows of moe_intermediate) in whole blocks of the type."""
    hidden, inter = 512, 256
    config = tmp_path / "config.json"
    config.write_text(json.dumps({
        "model_type": "qwen3_moe", "num_hidden_layers": 2, "hidden_size": hidden,
        "moe_intermediate_size": inter, "intermediate_size": 1024, "num_experts": 8,
        "num_experts_per_tok": 2, "vocab_size": 64, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 128}))
    d = json.loads(cli("inspect", "--config", config, "--expert-dtype", dtype, "--json").stdout)
    block, size = GGML_QUANT_SIZES[T[dtype.upper()]]
    per = 2 * inter * (hidden // block) * size + hidden * (inter // block) * size
    assert d["bytes_per_expert"] == {"min": per, "max": per}
    assert d["estimated"]
    bf16 = json.loads(cli("inspect", "--config", config, "--json").stdout)
    assert bf16["dense_bytes"] == d["dense_bytes"]  # --expert-dtype leaves dense tensors


def test_config_estimate_refuses_rows_that_are_not_whole_blocks(cli, tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps({
        "model_type": "qwen3_moe", "num_hidden_layers": 1, "hidden_size": 512,
        "moe_intermediate_size": 1408, "num_experts": 4, "num_experts_per_tok": 2,
        "vocab_size": 64, "num_attention_heads": 4}))
    assert_one_line_error(cli("inspect", "--config", config, "--expert-dtype", "q4_k",
                              ok=False), "q4_k stores rows in blocks of 256 elements",
                          "down_proj has rows of 1408")
    assert_one_line_error(cli("inspect", "--config", config, "--expert-dtype", "q4_z",
                              ok=False), "unknown dtype 'q4_z'", "iq4_xs")



def gguf_with(path: Path, keys: dict[str, object], tensors: dict[str, np.ndarray]) -> Path:
    """A GGUF of arch qwen3moe holding `keys` (typed as GGUFWriter types Python values) and
    F32 `tensors`."""
    writer = GGUFWriter(path, "qwen3moe")
    for key, value in keys.items():
        writer.add_key_value(key, value, GGUFValueType.get_type(value))
    for name, array in tensors.items():
        writer.add_tensor(name, array)
    for step in (writer.write_header_to_file, writer.write_kv_data_to_file,
                 writer.write_tensors_to_file, writer.close):
        step()
    return path


GOOD = {"qwen3moe.block_count": 1, "qwen3moe.expert_count": 4,
        "qwen3moe.expert_used_count": 2}
EXPERTS = {"blk.0.ffn_gate_exps.weight": np.zeros((4, 8, 32), np.float32)}


@pytest.mark.parametrize(("keys", "tensors", "needle"), [
    ({**GOOD, "qwen3moe.expert_count": "4"}, EXPERTS,
     "qwen3moe.expert_count is '4', expected an integer in [1, 32767]"),
    ({**GOOD, "qwen3moe.block_count": 10**6}, EXPERTS, "qwen3moe.block_count is 1000000"),
    ({**GOOD, "qwen3moe.expert_count": 3}, EXPERTS,
     "expert tensor 'blk.0.ffn_gate_exps.weight' has ggml ne [32, 8, 4], expected the "
     "outermost (last) to be expert_count 3"),
    (GOOD, {"blk.0.ffn_gate_exps.weight": np.zeros((4,), np.float32)}, "has ggml ne [4]"),
    (GOOD, {"blk.3.ffn_gate_exps.weight": np.zeros((4, 8, 32), np.float32)},
     "is in block 3 but block_count is 1"),
    ({**GOOD, "split.count": 2, "split.no": 0}, EXPERTS, "but its name is not"),
    ({**GOOD, "qwen3moe.nextn_predict_layers": 1}, EXPERTS, "leaves no layer of the 1"),
], ids=["count-type", "blocks", "experts", "1-d", "block", "split-name", "nextn"])
def test_metadata_that_contradicts_the_tensors_is_one_line(cli, tmp_path: Path, keys: dict,
                                                            tensors: dict, needle: str) -> None:
    path = gguf_with(tmp_path / "m.gguf", keys, tensors)
    assert_one_line_error(cli("inspect", path, ok=False), str(path), needle)
