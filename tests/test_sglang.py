"""`placer traces import` of SGLang expert-distribution dumps, built to SGLang's format.

The dumps are made as sglang 0.5.23's `python/sglang/srt/eplb/expert_distribution.py` writes
them (`_StatAccumulator.dump`, `_DetailAccumulator.dump`, `_DetailSinglePassGatherer.collect`;
keys, shapes and dtypes as documented in traces/importers/sglang.py): stat dumps hold `rank`,
`logical_count` (int32 [buffer, decoder layers, logical experts]) and
`average_utilization_rate_over_window`; per_pass / per_token dumps hold `records` and
`last_physical_to_logical_map` (int64 [decoder layers, physical experts]). The per-token dump is
made from a real trace collected by `placer collect`, routed through a physical map with
redundant replicas, and must import back to the same rows.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from placer.checkpoint.inventory import read_inventory
from traces.storing.profile import load_profile

pytest_plugins = ["fixtures_models"]  # trace_models, collected, placer_run

EXTEND, DECODE = 1, 2  # sglang ForwardMode.EXTEND / .DECODE
REDUNDANT = 3  # physical replicas beyond the logical experts, per layer


def physical_map(num_layers: int, num_experts: int, seed: int) -> np.ndarray:
    """[num_layers, num_experts + REDUNDANT] int64: a per-layer permutation of the logical
    experts plus REDUNDANT replicas, as EPLB lays them out."""
    rng = np.random.default_rng(seed)
    return np.stack([np.concatenate([rng.permutation(num_experts),
                                     rng.integers(0, num_experts, REDUNDANT)])
                     for _ in range(num_layers)]).astype(np.int64)


def token_rows(trace_dir: Path) -> dict[str, np.ndarray]:
    """Every row of the traces in `trace_dir`, sorted by (seq_id, pos, layer)."""
    table = pq.read_table(sorted(trace_dir.rglob("*.parquet")))
    cols = {name: table.column(name).to_numpy() for name in ("seq_id", "pos", "token", "layer")}
    cols["phase"] = np.array(table.column("phase").to_pylist())
    cols["experts"] = np.array(table.column("experts").to_pylist())
    order = np.lexsort((cols["layer"], cols["pos"], cols["seq_id"]))
    return {name: col[order] for name, col in cols.items()}


def row_multiset(rows: dict[str, np.ndarray]) -> Counter:
    """(pos, token, phase, layer, sorted experts) of every row: what an import must keep."""
    return Counter(zip(rows["pos"].tolist(), rows["token"].tolist(), rows["phase"].tolist(),
                       rows["layer"].tolist(), map(tuple, np.sort(rows["experts"], axis=1)),
                       strict=True))


def per_token_dump(rows: dict[str, np.ndarray], num_layers: int, p2l: np.ndarray,
                   path: Path, seed: int) -> Path:
    """Write `rows` as an SGLang per_token dump: prefill tokens in EXTEND passes of two
    sequences each (extend_seq_lens), decode tokens in DECODE passes of one token per
    sequence; each logical expert is sent to a random one of its physical replicas."""
    rng = np.random.default_rng(seed)
    layers = sorted(set(rows["layer"].tolist()))
    key = rows["seq_id"] * 10_000 + rows["pos"]
    tokens, first = np.unique(key, return_index=True)
    experts = rows["experts"].reshape(len(tokens), len(layers), -1)
    seq, pos = rows["seq_id"][first], rows["pos"][first]
    token, phase = rows["token"][first], rows["phase"][first]
    replicas = [[np.flatnonzero(p2l[layer] == e) for e in range(int(p2l.max()) + 1)]
                for layer in range(num_layers)]

    def record(pass_id: int, picked: np.ndarray, mode: int, lens: list[int] | None) -> dict:
        ids = np.full((num_layers, len(picked), 8), -1, dtype=np.int32)
        for column, layer in enumerate(layers):
            for t, i in enumerate(picked):
                chosen = [rng.choice(replicas[layer][e]) for e in experts[i, column]]
                ids[layer, t, :len(chosen)] = chosen
        return {"forward_pass_id": pass_id, "rank": 0, "gatherer_key": "primary",
                "global_physical_count": torch.from_numpy(
                    np.stack([np.bincount(ids[layer][ids[layer] >= 0],
                                          minlength=p2l.shape[1]) for layer in range(num_layers)]
                             ).astype(np.int32)),
                "input_ids": token[picked].tolist(), "positions": pos[picked].tolist(),
                "extend_seq_lens": lens, "forward_mode": mode,
                "topk_ids_of_layer": torch.from_numpy(ids)}

    records = []
    prefill_seqs = [s for s in np.unique(seq) if ((seq == s) & (phase == "prefill")).any()]
    for pair in range(0, len(prefill_seqs), 2):
        parts = [np.flatnonzero((seq == s) & (phase == "prefill"))
                 for s in prefill_seqs[pair:pair + 2]]
        records.append(record(len(records), np.concatenate(parts), EXTEND,
                              [len(p) for p in parts]))
    decode = np.flatnonzero(phase == "decode")
    for step in np.unique(pos[decode]):
        records.append(record(len(records), decode[pos[decode] == step], DECODE, None))
    torch.save({"records": records,
                "last_physical_to_logical_map": torch.from_numpy(p2l)}, path)
    return path


def stat_dump(counts: np.ndarray, path: Path, buffer: int = 5) -> Path:
    """An SGLang stat dump whose circular buffer of passes sums to `counts` [layers, E]
    (split at random over the first buffer - 1 slots; the last slot unused, zero)."""
    rng = np.random.default_rng(1)
    passes = np.zeros((buffer, *counts.shape), dtype=np.int32)
    for index in np.ndindex(counts.shape):
        passes[(slice(0, buffer - 1), *index)] = rng.multinomial(counts[index],
                                                                 [1 / (buffer - 1)] * (buffer - 1))
    torch.save({"rank": 0, "logical_count": torch.from_numpy(passes),
                "average_utilization_rate_over_window": 0.83}, path)
    return path


@pytest.fixture(scope="module")
def deepseek(trace_models):
    """The tiny DeepSeek-V3 checkpoint (a dense first layer) and its identity."""
    model = trace_models["deepseek_v3"]
    return model, read_inventory(model).identity()


def test_per_token_dump_imports_to_the_same_rows(deepseek, collected, tmp_path, placer_run):
    model, ident = deepseek
    source = collected[("deepseek_v3", "generate")]
    rows = token_rows(source)
    assert {"prefill", "decode"} <= set(rows["phase"].tolist())
    p2l = physical_map(ident.num_layers, ident.experts_per_layer, seed=3)
    dump = per_token_dump(rows, ident.num_layers, p2l, tmp_path / "rec_0.pt", seed=4)
    out = tmp_path / "imported"
    result = placer_run("traces", "import", dump, "--out", out, "--model", model)
    assert "per token" in result.output
    imported = token_rows(out)
    assert row_multiset(imported) == row_multiset(rows)
    meta = load_profile(out, phase=None)
    assert meta.per_token and meta.fingerprint == ident.fingerprint
    np.testing.assert_array_equal(meta.counts, load_profile(source, phase=None).counts)
    # One extend segment is one sequence: its tokens share a seq_id, in position order.
    prefill = imported["phase"] == "prefill"
    for s in np.unique(imported["seq_id"][prefill]):
        pos = imported["pos"][imported["seq_id"] == s][::len(ident.moe_layers)]
        np.testing.assert_array_equal(pos, np.arange(len(pos)))
    # The imported trace is a profile the solver takes with this model.
    plan = tmp_path / "plan.json"
    placer_run("solve", "--model", model, "--hardware", "1x-rtx4090", "--traces", out,
               "--offload", "0.3", "--solver", "greedy", "--out", plan)
    assert plan.is_file()


def test_stat_dump_counts_and_model_checks(deepseek, collected, tmp_path, placer_run):
    model, ident = deepseek
    counts = np.zeros((ident.num_layers, ident.experts_per_layer), dtype=np.int64)
    moe = list(ident.moe_layers)
    counts[moe] = load_profile(collected[("deepseek_v3", "score")]).counts
    dump = stat_dump(counts, tmp_path / "expert_distribution_recorder_1.pt")
    without = tmp_path / "plain"
    placer_run("traces", "import", dump, "--out", without, "--top-k", ident.top_k,
               "--tag", "prod")
    profile = load_profile(without)
    assert not profile.per_token and profile.name == "prod"
    np.testing.assert_array_equal(profile.counts, counts[moe])
    assert profile.tokens == -(-counts.sum(axis=1).max() // ident.top_k)
    with_model = tmp_path / "checked"
    result = placer_run("traces", "import", dump, "--out", with_model, "--model", model, "--json")
    summary = json.loads(result.output)
    assert len(summary["moe_layers"]) == len(moe) and summary["per_token"] is False
    assert summary["top_k"] == ident.top_k and Path(summary["path"]).is_file()
    np.testing.assert_array_equal(load_profile(with_model).counts, counts[moe])
    # A dump of another model (more experts) is refused with one line naming both shapes.
    other = stat_dump(np.ones((ident.num_layers, 2 * ident.experts_per_layer), np.int64),
                      tmp_path / "other.pt")
    result = placer_run("traces", "import", other, "--out", tmp_path / "x", "--model", model,
                        ok=False)
    assert result.exit_code == 1 and "experts, the model" in result.output
    assert not (tmp_path / "x").exists()


def test_per_pass_dumps_of_two_ranks_sum(deepseek, tmp_path, placer_run):
    _, ident = deepseek
    p2l = physical_map(ident.num_layers, ident.experts_per_layer, seed=5)
    rng = np.random.default_rng(6)
    expected = np.zeros((ident.num_layers, ident.experts_per_layer), dtype=np.int64)
    dumps = tmp_path / "dumps"
    dumps.mkdir()
    for rank in range(2):
        records = []
        for pass_id in range(4):
            physical = rng.integers(0, 9, p2l.shape).astype(np.int32)
            physical[[layer for layer in range(ident.num_layers)
                      if layer not in ident.moe_layers]] = 0
            for layer, slot in np.ndindex(p2l.shape):
                expected[layer, p2l[layer, slot]] += physical[layer, slot]
            records.append({"forward_pass_id": pass_id, "rank": rank,
                            "gatherer_key": "primary",
                            "global_physical_count": torch.from_numpy(physical)})
        torch.save({"records": records, "last_physical_to_logical_map": torch.from_numpy(p2l)},
                   dumps / f"expert_distribution_recorder_9.5_{rank}.pt")
    out = tmp_path / "summed"
    placer_run("traces", "import", dumps, "--out", out, "--top-k", ident.top_k)
    np.testing.assert_array_equal(load_profile(out).counts, expected[list(ident.moe_layers)])


def test_bad_dumps_get_one_line_errors(deepseek, tmp_path, placer_run):
    model, ident = deepseek
    (tmp_path / "junk.pt").write_bytes(b"not a torch file")
    torch.save([1, 2, 3], tmp_path / "list.pt")
    torch.save({"foo": torch.zeros(2)}, tmp_path / "keys.pt")
    p2l = physical_map(ident.num_layers, ident.experts_per_layer, seed=0)
    bad_ids = torch.full((ident.num_layers, 1, 8), -1, dtype=torch.int32)
    bad_ids[ident.moe_layers[0], 0, 0] = p2l.shape[1]  # beyond the physical experts
    torch.save({"records": [{"forward_pass_id": 0, "rank": 0, "gatherer_key": "primary",
                             "global_physical_count": torch.zeros(p2l.shape, dtype=torch.int32),
                             "input_ids": [5], "positions": [0], "extend_seq_lens": None,
                             "forward_mode": DECODE, "topk_ids_of_layer": bad_ids}],
                "last_physical_to_logical_map": torch.from_numpy(p2l)}, tmp_path / "fused.pt")
    np.save(tmp_path / "m.npy", np.ones((2, 8), dtype=np.int64))
    cases = [(["junk.pt"], ["--top-k", 2], "not a readable torch.save file"),
             (["list.pt"], ["--top-k", 2], "expected a dict"),
             (["keys.pt"], ["--top-k", 2], "not an SGLang expert distribution dump"),
             (["fused.pt"], ["--model", model], "shared-experts fusion"),
             (["junk.pt", "m.npy"], ["--top-k", 2], "different formats"),
             (["m.npy"], [], "--top-k (or --model or --config)"),
             (["m.npy"], ["--model", model, "--top-k", 3], "differs from the model's")]
    for names, extra, needle in cases:
        result = placer_run("traces", "import", *[tmp_path / n for n in names], "--out",
                            tmp_path / "o", *extra, ok=False)
        lines = result.output.strip().splitlines()
        assert result.exit_code == 1 and len(lines) == 1 and needle in lines[0], result.output
