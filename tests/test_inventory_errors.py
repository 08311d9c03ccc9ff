"""Bad checkpoints get one clear line and exit 1, never a traceback."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import pytest
from cli_errors import assert_one_line_error


def copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def single_file(ckpt: Path) -> Path:
    return ckpt / "model.safetensors"


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


# --- issue 16: checkpoints used without being checked -----------------------------------------


def rewrite_header(path: Path, edit) -> None:
    """Replace the safetensors header of `path` by `edit(header)` (a dict, or raw bytes),
    keeping the data section: offsets are relative to it."""
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = edit(json.loads(data[8:8 + n]))
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data[8 + n:])


def edit_json(path: Path, edit) -> None:
    path.write_text(json.dumps(edit(json.loads(path.read_text()))))


def test_second_copy_of_a_shard_is_refused(cli, tiny_models, tmp_path: Path) -> None:
    ckpt = copy(tiny_models["olmoe"], tmp_path / "c")
    shutil.copy(single_file(ckpt), ckpt / "model-copy.safetensors")
    assert_one_line_error(cli("inspect", ckpt, ok=False), "model-copy.safetensors",
                          "model.safetensors", "both")


def test_index_names_the_copy_to_read(cli, tiny_models, tmp_path: Path) -> None:
    """With an index, a tensor held by two files is read from the file the index names."""
    from placer.checkpoint.inventory import read_inventory

    ckpt = copy(tiny_models["mixtral"], tmp_path / "c")
    index = ckpt / "model.safetensors.index.json"
    weight_map = json.loads(index.read_text())["weight_map"]
    name = next(k for k in sorted(weight_map) if ".experts.5." in k)
    shutil.copy(ckpt / weight_map[name], ckpt / "copy.safetensors")
    before = read_inventory(ckpt)
    edit_json(index, lambda d: {**d, "weight_map": {**d["weight_map"], name: "copy.safetensors"}})
    after = read_inventory(ckpt)
    moved = [(ex.layer, ex.expert, r.file) for ex in after.experts for r in ex.tensors
             if r.name == name]
    assert len(moved) == 1 and moved[0][2] == "copy.safetensors"
    assert after.fingerprint == before.fingerprint
    assert after.expert_bytes_total == before.expert_bytes_total


def test_index_entry_for_a_tensor_no_file_holds(cli, tiny_models, tmp_path: Path) -> None:
    ckpt = copy(tiny_models["mixtral"], tmp_path / "c")
    index = ckpt / "model.safetensors.index.json"
    shard = sorted(set(json.loads(index.read_text())["weight_map"].values()))[0]
    edit_json(index, lambda d: {**d, "weight_map": {**d["weight_map"],
                                                    "model.layers.0.ghost.weight": shard}})
    assert_one_line_error(cli("inspect", ckpt, ok=False), "model.layers.0.ghost.weight", shard)


@pytest.mark.parametrize("where", ["parent", "absolute", "subdir"])
def test_index_naming_a_file_outside_is_refused(cli, tiny_models, tmp_path: Path,
                                                where: str) -> None:
    ckpt = copy(tiny_models["mixtral"], tmp_path / "c")
    index = ckpt / "model.safetensors.index.json"
    weight_map = json.loads(index.read_text())["weight_map"]
    shard = sorted(set(weight_map.values()))[0]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    shutil.copy(ckpt / shard, elsewhere / "model.safetensors")
    (ckpt / "sub").mkdir()
    shutil.copy(ckpt / shard, ckpt / "sub" / "model.safetensors")
    target = {"parent": "../elsewhere/model.safetensors",
              "absolute": str(elsewhere / "model.safetensors"),
              "subdir": "sub/model.safetensors"}[where]
    edit_json(index, lambda d: {**d, "weight_map": {k: target if v == shard else v
                                                    for k, v in d["weight_map"].items()}})
    assert_one_line_error(cli("inspect", ckpt, ok=False), target, "not a file name inside")


def _drop(name: str):
    return lambda header: {k: v for k, v in header.items() if k != name}


def _reshape(name: str):
    def edit(header: dict) -> dict:
        entry = header[name]
        rows, cols = entry["shape"]
        # same bytes, another shape: the file stays consistent, the expert does not
        return {**header, name: {**entry, "shape": [rows * cols]}}
    return edit


@pytest.mark.parametrize("fault,needle", [("missing", "is missing"), ("shape", "expert 0's is")])
def test_expert_unlike_its_layer_is_refused(cli, tiny_models, tmp_path: Path, fault: str,
                                            needle: str) -> None:
    ckpt = copy(tiny_models["qwen3_moe"], tmp_path / "c")
    data = single_file(ckpt).read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    name = next(k for k in json.loads(data[8:8 + n])
                if ".layers.1.mlp.experts.3.up_proj" in k)
    rewrite_header(single_file(ckpt), _drop(name) if fault == "missing" else _reshape(name))
    assert_one_line_error(cli("inspect", ckpt, ok=False), "layer 1 expert 3", "up_proj.weight",
                          needle)


def test_top_k_above_expert_count_is_refused(cli, tiny_models, tmp_path: Path) -> None:
    ckpt = copy(tiny_models["olmoe"], tmp_path / "c")
    edit_json(ckpt / "config.json", lambda c: {**c, "num_experts_per_tok": 9})
    assert_one_line_error(cli("inspect", ckpt, ok=False), "9", "only 8")


@pytest.mark.parametrize("edit,needle", [
    (lambda c: [c], "expected a JSON object"),
    (lambda c: {**c, "num_hidden_layers": [3]}, "num_hidden_layers"),
    (lambda c: {**c, "num_experts": "8"}, "num_experts"),
    (lambda c: {**c, "num_experts_per_tok": True}, "num_experts_per_tok"),
    (lambda c: {**c, "hidden_size": 32.5}, "hidden_size"),
    (lambda c: {**c, "num_hidden_layers": -3}, "num_hidden_layers"),
    (lambda c: {**c, "architectures": "OlmoeForCausalLM"}, "architectures"),
], ids=["list", "layers-list", "experts-str", "topk-bool", "hidden-float", "negative", "archs"])
def test_config_values_of_the_wrong_type(cli, tiny_models, tmp_path: Path, edit,
                                         needle: str) -> None:
    ckpt = copy(tiny_models["olmoe"], tmp_path / "c")
    edit_json(ckpt / "config.json", edit)
    assert_one_line_error(cli("inspect", ckpt, ok=False), "config.json", needle)
    assert_one_line_error(cli("inspect", "--config", ckpt / "config.json", ok=False),
                          "config.json", needle)


def test_config_not_utf8(cli, tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_bytes(b'{"model_type": "\xff\xfe"}')
    assert_one_line_error(cli("inspect", "--config", path, ok=False),
                          "not UTF-8 text (byte 0xff at byte offset 16)")


def _first_tensor(header: dict) -> str:
    return next(k for k in header if k != "__metadata__")


@pytest.mark.parametrize("edit,needle", [
    (lambda h: {**h, _first_tensor(h): {**h[_first_tensor(h)], "dtype": ["F32"]}}, "dtype"),
    (lambda h: {**h, _first_tensor(h): {**h[_first_tensor(h)], "dtype": 5}}, "dtype"),
    (lambda h: {**h, _first_tensor(h): {**h[_first_tensor(h)], "dtype": "F33"}}, "'F33'"),
    (lambda h: {**h, _first_tensor(h): {**h[_first_tensor(h)], "shape": "32"}}, "shape"),
    (lambda h: {**h, _first_tensor(h): {**h[_first_tensor(h)], "shape": [2.5]}}, "shape"),
    (lambda h: {**h, _first_tensor(h): {**h[_first_tensor(h)], "data_offsets": [0]}},
     "data_offsets"),
    (lambda h: {**h, "__metadata__": ["pt"]}, "__metadata__"),
    (lambda h: {**h, "__metadata__": {"format": 1}}, "__metadata__"),
    (lambda h: json.dumps(h)[:-1].encode() + b', "__metadata__": {}}', "twice"),
], ids=["dtype-list", "dtype-int", "dtype-unknown", "shape-str", "shape-float",
        "offsets-short", "metadata-list", "metadata-int", "duplicate-key"])
def test_header_values_of_the_wrong_type(cli, tiny_models, tmp_path: Path, edit,
                                         needle: str) -> None:
    ckpt = copy(tiny_models["olmoe"], tmp_path / "c")
    rewrite_header(single_file(ckpt), edit)
    assert_one_line_error(cli("inspect", ckpt, ok=False), "model.safetensors", needle)


def small_config(**overrides) -> dict:
    """A qwen3_moe-style config: 2 layers, 4 experts of 64 x 32 projections."""
    return {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
            "num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 128,
            "moe_intermediate_size": 32, "num_experts": 4, "num_experts_per_tok": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 100,
            **overrides}


@pytest.mark.parametrize("key", ["torch_dtype", "dtype"])
def test_config_estimate_follows_the_declared_dtype(cli, tmp_path: Path, key: str) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(small_config(**{key: "float32"})))
    inv = json.loads(cli("inspect", "--config", path, "--json").output)
    assert inv["bytes_per_expert"] == {"min": 3 * 64 * 32 * 4, "max": 3 * 64 * 32 * 4}
    assert {t["dtype"] for t in inv["experts"][0]["tensors"]} == {"F32"}
    explicit = json.loads(cli("inspect", "--config", path, "--json", "--expert-dtype", "bf16"
                              ).output)
    assert explicit["bytes_per_expert"]["min"] == 3 * 64 * 32 * 2


def test_config_estimate_table_has_no_none(cli, tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(small_config()))
    out = cli("inspect", "--config", path).output
    assert "None" not in out and "(estimated from" in out
    assert "up_proj.weight" in out and "offset" not in out


def test_config_unknown_torch_dtype_needs_an_explicit_dtype(cli, tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(small_config(torch_dtype="int8")))
    assert_one_line_error(cli("inspect", "--config", path, ok=False), "'int8'", "--expert-dtype")
    cli("inspect", "--config", path, "--expert-dtype", "fp8", "--dense-dtype", "bf16")


@pytest.mark.parametrize("name", ["config.json", "model.safetensors",
                                  "model.safetensors.index.json"])
def test_unreadable_checkpoint_file_is_one_line(cli, tiny_models, tmp_path: Path, monkeypatch,
                                                name: str) -> None:
    from unreadable import deny_reads

    ckpt = copy(tiny_models["mixtral" if name.endswith("index.json") else "olmoe"],
                tmp_path / "c")
    deny_reads(monkeypatch, ckpt / name)
    assert_one_line_error(cli("inspect", ckpt, ok=False), f"permission denied: {ckpt / name}")


def test_checkpoint_path_that_is_a_file(cli, tiny_models, tmp_path: Path) -> None:
    ckpt = copy(tiny_models["olmoe"], tmp_path / "c")
    assert_one_line_error(cli("inspect", ckpt / "config.json", ok=False),
                          f"{ckpt / 'config.json'} is not a directory")


@pytest.mark.parametrize("dtype", ["", "int3"])
def test_config_estimate_refuses_an_unknown_expert_dtype(cli, tmp_path: Path, dtype: str) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(small_config()))
    assert_one_line_error(cli("inspect", "--config", path, "--expert-dtype", dtype, ok=False),
                          f"unknown dtype {dtype!r}")
