"""Count-only engine formats: llama.cpp imatrix GGUF (keys and tensors as imatrix.cpp
`save_imatrix` writes them) and TensorRT-LLM expert statistics (meta_info.json and
rank<r>.safetensors of int64 [E] under "{iter}_{layer}", as expert_statistic.py writes them)
import to the exact counts; auto-detection; count matrices without selections are refused."""

from __future__ import annotations

import json
import struct

import numpy as np
import pyarrow.parquet as pq
import torch
from cli_errors import assert_one_line_error
from gguf import GGUFWriter
from importer_files import (
    EXPERTS,
    MOE_LAYERS,
    TOP_K,
    random_routing,
    sequences,
    trace_rows,
    write_config,
)
from safetensors.torch import save_file

from traces.storing.profile import load_profile
from traces.storing.schema import METADATA_KEY

CHUNKS, CHUNK_SIZE = 3, 512


def imatrix_counts(rng: np.random.Generator, tokens: int = CHUNKS * CHUNK_SIZE,
                   layers=MOE_LAYERS) -> dict[int, np.ndarray]:
    """Per MoE block, counts of `tokens` tokens each picking TOP_K distinct experts."""
    out = {}
    for layer in layers:
        picks = np.argsort(rng.random((tokens, EXPERTS)), axis=1)[:, :TOP_K]
        out[layer] = np.bincount(picks.ravel(), minlength=EXPERTS)
    return out


def write_imatrix(path, counts: dict[int, np.ndarray], tensor: str = "ffn_gate_exps",
                  chunks: int = CHUNKS) -> None:
    """An imatrix GGUF as llama-imatrix writes it (llama.cpp 0c1e5709, tools/imatrix/
    imatrix.cpp save_imatrix): general.type, imatrix.* keys, and per weight `.in_sum2` (ggml
    ne [n_embd, n_mat]) and `.counts` (ne [1, n_mat]), F32; a dense tensor's counts are
    its tokens."""
    writer = GGUFWriter(path, arch="llama")
    del writer.kv_data[0]["general.architecture"]  # imatrix.cpp writes no architecture
    writer.add_string("general.type", "imatrix")
    writer.add_array("imatrix.datasets", ["chat.txt"])
    writer.add_uint32("imatrix.chunk_count", chunks)
    writer.add_uint32("imatrix.chunk_size", CHUNK_SIZE)
    writer.add_tensor("blk.0.ffn_up.weight.counts",
                      np.array([[chunks * CHUNK_SIZE]], np.float32))
    writer.add_tensor("blk.0.ffn_up.weight.in_sum2", np.ones((1, 16), np.float32))
    for layer, selected in sorted(counts.items()):
        for name in (tensor, "ffn_down_exps"):
            base = f"blk.{layer}.{name}.weight"
            writer.add_tensor(f"{base}.in_sum2", np.ones((len(selected), 16), np.float32))
            writer.add_tensor(f"{base}.counts", selected.astype(np.float32).reshape(-1, 1))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def write_legacy_imatrix(path) -> None:
    """`--output-format dat` (save_imatrix_legacy): int32 entries; per entry int32 name length,
    name, int32 ncall, int32 nval, float32[nval]; int32 chunks; int32 length + dataset."""
    name = b"blk.1.ffn_gate_exps.weight"
    values = np.ones(EXPERTS * 16, np.float32).tobytes()
    path.write_bytes(struct.pack("<ii", 1, len(name)) + name
                     + struct.pack("<ii", 3, EXPERTS * 16) + values
                     + struct.pack("<ii", CHUNKS, 8) + b"chat.txt")


def test_imatrix_counts(tmp_path, cli):
    rng = np.random.default_rng(7)
    config = write_config(tmp_path / "model")
    counts = imatrix_counts(rng)
    write_imatrix(tmp_path / "imatrix.gguf", counts, tensor="ffn_gate_up_exps")
    result = cli("traces", "import", tmp_path / "imatrix.gguf", "--out", tmp_path / "a",
                 "--config", config)
    assert "note: llama-imatrix counts come from prompt processing only" in result.stdout
    assert "prefill only" in result.stdout
    profile = load_profile(tmp_path / "a")
    np.testing.assert_array_equal(profile.counts, np.stack(list(counts.values())))
    assert profile.top_k == TOP_K and not profile.per_token
    assert profile.moe_layers == MOE_LAYERS and profile.tokens == CHUNKS * CHUNK_SIZE
    meta = json.loads(pq.read_schema(tmp_path / "a" / "counts.parquet").metadata[METADATA_KEY])
    assert meta["phases"] == "prefill" and "prompt processing only" in meta["note"]
    assert meta["decoder_layers"] == list(MOE_LAYERS) and meta["chunk_size"] == CHUNK_SIZE
    # Without a model, --top-k gives k; a model with other MoE layers is refused.
    cli("traces", "import", tmp_path / "imatrix.gguf", "--out", tmp_path / "b", "--top-k", 2)
    np.testing.assert_array_equal(load_profile(tmp_path / "b").counts, profile.counts)
    write_imatrix(tmp_path / "shifted.gguf", {layer - 1: c for layer, c in counts.items()})
    assert_one_line_error(cli("traces", "import", tmp_path / "shifted.gguf", "--out",
                              tmp_path / "c", "--config", config, ok=False),
                          "expected the model's MoE layers [1, 2, 3]")
    bad = {"model.gguf": ("llama", "blk.1.ffn_gate_exps.weight", (8, 4), "expected 'imatrix'"),
           "flipped.gguf": ("imatrix", "blk.1.ffn_gate_exps.weight.counts", (1, 8),
                            "expected [1, n_expert]"),
           "converted.gguf": ("imatrix", "blk.1.ffn_gate_exps.weight.counts", (1, 1),
                              "a single count comes from a legacy .dat")}
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


def test_imatrix_is_told_by_its_magic_not_its_name(tmp_path, cli):
    """`llama-imatrix -o x.dat` writes GGUF; `--save-frequency 2` writes `x.gguf.at_2`; both
    import (detected), and the legacy `--output-format dat` is refused in one line."""
    counts = imatrix_counts(np.random.default_rng(3))
    write_imatrix(tmp_path / "x.dat", counts)
    cli("traces", "import", tmp_path / "x.dat", "--out", tmp_path / "a", "--top-k", TOP_K)
    np.testing.assert_array_equal(load_profile(tmp_path / "a").counts,
                                  np.stack(list(counts.values())))
    assert load_profile(tmp_path / "a").name == "x"
    write_imatrix(tmp_path / "x.gguf.at_2", counts, chunks=CHUNKS)
    cli("traces", "import", tmp_path / "x.gguf.at_2", "--out", tmp_path / "b", "--top-k", TOP_K)
    assert load_profile(tmp_path / "b").name == "x"
    write_legacy_imatrix(tmp_path / "old.dat")
    for source in (tmp_path / "old.dat", tmp_path / "legacy"):
        if source.suffix != ".dat":
            source.mkdir()
            (tmp_path / "old.dat").rename(source / "old.dat")
        assert_one_line_error(cli("traces", "import", source, "--out", tmp_path / "c",
                                  "--format", "imatrix", "--top-k", TOP_K, ok=False),
                              "legacy llama-imatrix .dat", "no per-expert counts",
                              "--output-format gguf")
    (tmp_path / "junk.dat").write_bytes(b"\xff" * 64)
    assert_one_line_error(cli("traces", "import", tmp_path / "junk.dat", "--out", tmp_path / "d",
                              "--top-k", TOP_K, ok=False), "no GGUF magic")


def test_imatrix_totals_are_checked_against_the_chunks(tmp_path, cli):
    """Every MoE block counts chunk_count x chunk_size x k selections; a snapshot written
    mid-chunk counts fewer (noted); unequal blocks, totals off k, or more tokens than the
    chunks hold are refused."""
    rng = np.random.default_rng(5)
    lagging = imatrix_counts(rng, tokens=CHUNKS * CHUNK_SIZE - 100)
    write_imatrix(tmp_path / "x.gguf.at_3", lagging)
    result = cli("traces", "import", tmp_path / "x.gguf.at_3", "--out", tmp_path / "a",
                 "--top-k", TOP_K)
    assert "counts cover 1436 tokens" in result.stdout and "a snapshot" in result.stdout
    assert load_profile(tmp_path / "a").tokens == CHUNKS * CHUNK_SIZE - 100
    cases = {
        "unequal": ({**imatrix_counts(rng), 2: imatrix_counts(rng, 100, (2,))[2]},
                    "counted different totals"),
        "odd": ({layer: c + (np.arange(EXPERTS) == 0) for layer, c in
                 imatrix_counts(rng).items()}, "not a multiple of top-k 2"),
        "merged": (imatrix_counts(rng, tokens=(CHUNKS + 2) * CHUNK_SIZE),
                   "counts of 2560 tokens (top-k 2) but imatrix.chunk_count 3"),
    }
    for name, (counts, needle) in cases.items():
        write_imatrix(tmp_path / f"{name}.gguf", counts)
        assert_one_line_error(cli("traces", "import", tmp_path / f"{name}.gguf", "--out",
                                  tmp_path / name, "--top-k", TOP_K, ok=False), needle)
        assert not (tmp_path / name).exists()


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


def test_stats_name_decoder_layers_alike(tmp_path, cli):
    """A model whose decoder layer 0 is dense: `traces stats` of an imatrix import and of
    per-token rows of the same routing name layers [1, 2, 3] alike, say the imatrix's phase,
    and give the same per-expert counts (--json)."""
    config = write_config(tmp_path / "model")
    routing = random_routing(np.random.default_rng(9), CHUNKS * CHUNK_SIZE)
    np.savez(tmp_path / "rows.npz", expert_ids=routing)
    counts = {layer: np.bincount(routing[:, i].ravel(), minlength=EXPERTS)
              for i, layer in enumerate(MOE_LAYERS)}
    write_imatrix(tmp_path / "imatrix.gguf", counts)
    cli("traces", "import", tmp_path / "rows.npz", "--out", tmp_path / "rows", "--config", config)
    cli("traces", "import", tmp_path / "imatrix.gguf", "--out", tmp_path / "imat", "--top-k",
        TOP_K)
    rows, imat = (json.loads(cli("traces", "stats", tmp_path / d, "--json").stdout)
                  for d in ("rows", "imat"))
    assert rows["moe_layers"] == imat["moe_layers"] == list(MOE_LAYERS)
    assert [e["layer"] for e in rows["layers"]] == [e["layer"] for e in imat["layers"]]
    assert [e["counts"] for e in rows["layers"]] == [e["counts"] for e in imat["layers"]] \
        == [c.tolist() for c in counts.values()]
    assert imat["phases"] == {"prefill": CHUNKS * CHUNK_SIZE, "decode": 0}
    assert rows["phases"] == {"prefill": 0, "decode": CHUNKS * CHUNK_SIZE}
    text = cli("traces", "stats", tmp_path / "imat").stdout
    assert "prefill 1536, decode 0" in text


def write_raw_statistics(directory, raw: dict[tuple[int, int, int], list[np.ndarray]],
                         num_ids: int = EXPERTS) -> None:
    """EXPERT_STATISTIC_PATH as TensorRT-LLM 7ce477f3 writes it from the MoE calls `raw`
    {(rank, iter, layer): [int32 [tokens, k] ids of each call]}: the counts sum every call
    (int64 [num_ids] under "{iter}_{layer}" in rank{r}.safetensors), the raw file keeps the
    last call's ids (int32 [tokens, k] in rank{r}_raw.safetensors)."""
    directory.mkdir()
    (directory / "meta_info.json").write_text(
        json.dumps({"num_experts": num_ids, "num_experts_per_token": TOP_K}))
    for rank in sorted({r for r, _, _ in raw}):
        mine = {(it, layer): calls for (r, it, layer), calls in raw.items() if r == rank}
        save_file({f"{it}_{layer}": torch.from_numpy(np.bincount(
            np.concatenate(calls).ravel(), minlength=num_ids).astype(np.int64))
            for (it, layer), calls in mine.items()}, directory / f"rank{rank}.safetensors")
        save_file({f"{it}_{layer}": torch.from_numpy(calls[-1].astype(np.int32))
                   for (it, layer), calls in mine.items()},
                  directory / f"rank{rank}_raw.safetensors")


def raw_calls(rng: np.random.Generator, layers=(*MOE_LAYERS, 4), chunked: int = 10
              ) -> dict[tuple[int, int, int], list[np.ndarray]]:
    """Two ranks x two iterations; iteration `chunked` runs its MoE twice (chunking), layer 4
    is the MTP layer (decoder layer num_hidden_layers)."""
    out = {}
    for rank in range(2):
        for it, tokens in ((10, 6), (11, 3)):
            calls = 2 if it == chunked else 1
            routing = [random_routing(rng, tokens, len(layers)) for _ in range(calls)]
            for i, layer in enumerate(layers):
                out[rank, it, layer] = [r[:, i] for r in routing]
    return out


def test_trtllm_raw_rows(tmp_path, cli):
    """rank<r>_raw.safetensors (never read as counts) become one sequence per (iteration,
    rank), the last MoE call's rows; the import says how much of the counts they cover; the
    MTP layer is dropped; without a model the counts are stored."""
    rng = np.random.default_rng(11)
    config = write_config(tmp_path / "model")
    calls = raw_calls(rng)
    write_raw_statistics(tmp_path / "stats", calls)
    result = cli("traces", "import", tmp_path / "stats", "--out", tmp_path / "a", "--config",
                 config)
    assert "per-token rows of 4 (iteration, rank) batches cover 36 of the 60 selections" \
        in result.stdout
    assert "layers [4] (>= num_hidden_layers 4: MTP) dropped" in result.stdout
    assert "these ids are its slots" in result.stdout  # as many ids as experts: say so
    rows = trace_rows(tmp_path / "a")
    assert set(rows["phase"]) == {"decode"} and set(rows["token"]) == {-1}
    seq = sequences(rows)
    for number, (it, rank) in enumerate([(10, 0), (10, 1), (11, 0), (11, 1)]):
        for layer in MOE_LAYERS:
            mine = (seq == number) & (rows["layer"] == layer)
            np.testing.assert_array_equal(rows["experts"][mine], calls[rank, it, layer][-1])
            np.testing.assert_array_equal(rows["pos"][mine], np.arange(mine.sum()))
    counted = cli("traces", "import", tmp_path / "stats", "--out", tmp_path / "b")
    assert "give --model or --config to import them as rows" in counted.stdout
    profile = load_profile(tmp_path / "b")
    assert profile.moe_layers == (*MOE_LAYERS, 4) and not profile.per_token
    np.testing.assert_array_equal(profile.counts[0], sum(
        np.bincount(np.concatenate(c).ravel(), minlength=EXPERTS)
        for (_, _, layer), c in calls.items() if layer == 1))


def test_trtllm_slots(tmp_path, cli):
    """With the load balancer on the ids are slots: more slots than experts are refused
    unless --load-balancer maps them (counts and rows); a balancer that moves experts, or
    misses one, is refused."""
    rng = np.random.default_rng(12)
    config = write_config(tmp_path / "model")
    slots = EXPERTS + 4
    assignment = {layer: [(s * 3 + layer) % EXPERTS for s in range(slots)]
                  for layer in MOE_LAYERS}

    def replica_slots(tokens: int, layer: int) -> np.ndarray:
        """[tokens, k] slots of k distinct experts each (the engine routes each selected
        expert to one of its replicas: two replicas of one expert are never both taken)."""
        rows = []
        for _ in range(tokens):
            taken: dict[int, int] = {}
            for slot in rng.permutation(slots):
                taken.setdefault(assignment[layer][slot], int(slot))
            rows.append(list(taken.values())[:TOP_K])
        return np.array(rows, dtype=np.int32)

    calls = {key: [replica_slots(len(c[0]), key[2])]
             for key, c in raw_calls(rng, MOE_LAYERS, 0).items()}
    write_raw_statistics(tmp_path / "stats", calls, num_ids=slots)
    assert_one_line_error(cli("traces", "import", tmp_path / "stats", "--out", tmp_path / "a",
                              "--config", config, ok=False),
                          "num_experts 12, the model has 8 experts", "--load-balancer")
    yaml_lines = [f"num_slots: {slots}", "layer_updates_per_iter: 0",
                  "initial_global_assignments:"]
    yaml_lines += [f"  {layer}: {experts}" for layer, experts in assignment.items()]
    (tmp_path / "eplb.yaml").write_text("\n".join(yaml_lines) + "\n")
    cli("traces", "import", tmp_path / "stats", "--out", tmp_path / "a", "--config", config,
        "--load-balancer", tmp_path / "eplb.yaml")
    rows = trace_rows(tmp_path / "a")
    for layer in MOE_LAYERS:
        raw = np.concatenate([calls[r, it, layer][0] for it in (10, 11) for r in range(2)])
        np.testing.assert_array_equal(rows["experts"][rows["layer"] == layer],
                                      np.asarray(assignment[layer])[raw])
    cli("traces", "import", tmp_path / "stats", "--out", tmp_path / "b", "--load-balancer",
        tmp_path / "eplb.yaml")
    mapped = np.stack([np.bincount(np.asarray(assignment[layer])[np.concatenate(
        [calls[r, it, layer][0] for it in (10, 11) for r in range(2)]).ravel()],
        minlength=EXPERTS) for layer in MOE_LAYERS])
    np.testing.assert_array_equal(load_profile(tmp_path / "b").counts, mapped)
    bad = {"online.yaml": ("layer_updates_per_iter: 2", "only a static one"),
           "missing.yaml": (f"  1: {[0] * slots}", "does not hold each of the 8 experts")}
    for name, (line, needle) in bad.items():
        text = "\n".join(yaml_lines).replace("layer_updates_per_iter: 0", line) \
            if "layer_updates" in line else "\n".join([*yaml_lines[:3], line, *yaml_lines[4:]])
        (tmp_path / name).write_text(text + "\n")
        assert_one_line_error(cli("traces", "import", tmp_path / "stats", "--out",
                                  tmp_path / "c", "--config", config, "--load-balancer",
                                  tmp_path / name, ok=False), needle)
    assert_one_line_error(cli("traces", "import", tmp_path / "rows.npz", "--out", tmp_path / "d",
                              "--format", "tokens", "--load-balancer", tmp_path / "eplb.yaml",
                              ok=False), "--load-balancer is for the trtllm format")
