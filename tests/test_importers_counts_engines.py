"""Count-only engine formats: llama.cpp imatrix GGUF (keys and tensors as imatrix.cpp
`save_imatrix` writes them) and TensorRT-LLM expert statistics (meta_info.json and
rank<r>.safetensors of int64 [E] under "{iter}_{layer}", as expert_statistic.py writes them)
import to the exact counts; auto-detection; count matrices without selections are refused."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import torch
from cli_errors import assert_one_line_error
from gguf import GGUFWriter
from importer_files import (
    EXPERTS,
    MOE_LAYERS,
    TOP_K,
    write_config,
)
from safetensors.torch import save_file

from traces.profile import load_profile
from traces.schema import METADATA_KEY


def write_imatrix(path, counts: dict[int, np.ndarray], tensor: str = "ffn_gate_exps") -> None:
    """An imatrix GGUF as llama-imatrix writes it: general.type, imatrix.* keys, and per
    expert weight `.in_sum2` (ne [cols, n_expert]), `.counts` (ne [1, n_expert]), `.in_sum`."""
    writer = GGUFWriter(path, arch="llama")
    del writer.kv_data[0]["general.architecture"]  # imatrix.cpp writes no architecture
    writer.add_string("general.type", "imatrix")
    writer.add_array("imatrix.datasets", ["chat.txt"])
    writer.add_uint32("imatrix.chunk_count", 3)
    writer.add_uint32("imatrix.chunk_size", 512)
    for layer, selected in sorted(counts.items()):
        for name in (tensor, "ffn_down_exps"):
            base = f"blk.{layer}.{name}.weight"
            writer.add_tensor(f"{base}.in_sum2", np.ones((len(selected), 16), np.float32))
            writer.add_tensor(f"{base}.counts", selected.astype(np.float32).reshape(-1, 1))
            writer.add_tensor(f"{base}.in_sum", np.ones((len(selected), 16), np.float32))
    writer.add_tensor("blk.0.ffn_up.weight.counts", np.array([[1536.0]], np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_imatrix_counts(tmp_path, cli):
    rng = np.random.default_rng(7)
    config = write_config(tmp_path / "model")
    counts = {layer: rng.integers(1, 500, EXPERTS) for layer in MOE_LAYERS}
    write_imatrix(tmp_path / "imatrix.gguf", counts, tensor="ffn_gate_up_exps")
    result = cli("traces", "import", tmp_path / "imatrix.gguf", "--out", tmp_path / "a",
                 "--config", config)
    assert "note: llama-imatrix counts come from prompt processing only" in result.stdout
    profile = load_profile(tmp_path / "a")
    np.testing.assert_array_equal(profile.counts, np.stack(list(counts.values())))
    assert profile.top_k == TOP_K and not profile.per_token
    meta = json.loads(pq.read_schema(tmp_path / "a" / "counts.parquet").metadata[METADATA_KEY])
    assert meta["phases"] == "prefill" and "prompt processing only" in meta["note"]
    assert meta["decoder_layers"] == list(MOE_LAYERS) and meta["chunk_size"] == 512
    # Without a model, --top-k gives k; a model with other MoE layers is refused.
    cli("traces", "import", tmp_path / "imatrix.gguf", "--out", tmp_path / "b", "--top-k", 2)
    np.testing.assert_array_equal(load_profile(tmp_path / "b").counts, profile.counts)
    write_imatrix(tmp_path / "shifted.gguf", {layer - 1: c for layer, c in counts.items()})
    assert_one_line_error(cli("traces", "import", tmp_path / "shifted.gguf", "--out",
                              tmp_path / "c", "--config", config, ok=False),
                          "expected the model's MoE layers [1, 2, 3]")
    bad = {"model.gguf": ("llama", "blk.1.ffn_gate_exps.weight", (8, 4), "expected 'imatrix'"),
           "flipped.gguf": ("imatrix", "blk.1.ffn_gate_exps.weight.counts", (1, 8),
                            "expected [1, n_expert]")}
    for name, (kind, tensor, shape, needle) in bad.items():
        writer = GGUFWriter(tmp_path / name, arch="llama")
        writer.add_string("general.type", kind)
        writer.add_tensor(tensor, np.ones(shape, np.float32))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        assert_one_line_error(cli("traces", "import", tmp_path / name, "--out", tmp_path / "d",
                                  "--top-k", 2, ok=False), needle)


def write_statistics(directory, counts: dict[tuple[int, int, int], np.ndarray]) -> None:
    """EXPERT_STATISTIC_PATH as TensorRT-LLM writes it: {(rank, iter, layer): [E] counts}."""
    directory.mkdir()
    (directory / "meta_info.json").write_text(
        json.dumps({"num_experts": EXPERTS, "num_experts_per_token": TOP_K}))
    for rank in sorted({r for r, _, _ in counts}):
        save_file({f"{it}_{layer}": torch.from_numpy(c.astype(np.int64))
                   for (r, it, layer), c in counts.items() if r == rank},
                  directory / f"rank{rank}.safetensors")


def test_trtllm_counts(tmp_path, cli):
    rng = np.random.default_rng(8)
    config = write_config(tmp_path / "model")
    records = {(rank, it, layer): rng.integers(0, 50, EXPERTS)
               for rank in range(2) for it in (10, 11) for layer in MOE_LAYERS}
    write_statistics(tmp_path / "stats", records)
    cli("traces", "import", tmp_path / "stats", "--out", tmp_path / "a", "--config", config)
    expected = np.stack([sum(c for (_, _, layer), c in records.items() if layer == moe)
                         for moe in MOE_LAYERS])
    profile = load_profile(tmp_path / "a")
    np.testing.assert_array_equal(profile.counts, expected)
    assert profile.top_k == TOP_K and profile.name == "trtllm"
    cli("traces", "import", tmp_path / "stats", "--out", tmp_path / "b")  # k from meta_info
    np.testing.assert_array_equal(load_profile(tmp_path / "b").counts, expected)
    assert_one_line_error(cli("traces", "import", tmp_path / "stats", "--out", tmp_path / "c",
                              "--top-k", 3, ok=False), "differs from")
    (tmp_path / "stats" / "meta_info.json").write_text(
        json.dumps({"num_experts": EXPERTS + 4, "num_experts_per_token": TOP_K}))
    assert_one_line_error(cli("traces", "import", tmp_path / "stats", "--out", tmp_path / "d",
                              "--config", config, ok=False), "int64 [12]")


def test_count_matrices_without_selections_are_refused(tmp_path, cli):
    np.save(tmp_path / "zero.npy", np.zeros((3, EXPERTS), np.int64))
    row = np.ones((3, EXPERTS), np.int64)
    row[1] = 0
    np.save(tmp_path / "row.npy", row)
    for name, needle in [("zero.npy", "every count is zero"),
                         ("row.npy", "MoE layer row(s) [1] have no selection")]:
        result = cli("traces", "import", tmp_path / name, "--out", tmp_path / "o", "--top-k", 2,
                     ok=False)
        assert_one_line_error(result, needle)
        assert not any(tmp_path.glob("o/*.parquet*"))
    assert_one_line_error(cli("traces", "import", tmp_path, "--out", tmp_path / "o", ok=False),
                          "cannot tell the format of this directory")
