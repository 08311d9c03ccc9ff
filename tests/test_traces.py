"""Trace datasets: profiles, step sampling, folds, imports, stats, compatibility checks."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import duckdb
import numpy as np
import pyarrow.parquet as pq
import pytest
from cli_errors import assert_one_line_error

from traces.errors import TraceError
from traces.storing.dataset import check_compatible, check_fingerprint, check_shape
from traces.storing.profile import Profile, load_profile, sample_steps, split_sequences
from traces.storing.schema import PHASES
from traces.storing.writer import TraceWriter

pytest_plugins = ["fixtures_models"]  # the trace_models and collected fixtures

MOE_LAYERS = (1, 3, 5)
EXPERTS, TOP_K = 16, 2


def write_synthetic(out: Path, lengths: list[int], *, tag: str = "syn", run_id: int = 7,
                    fingerprint: str = "f00d", pos_step: int = 1, phase: str = "decode",
                    experts_of=None) -> Path:
    """A per-token trace in which sequence i selects experts {2i, 2i+1} mod E at every layer
    and position (or `experts_of(seq, pos, layer_ordinal) -> [k]`)."""
    out.mkdir(parents=True, exist_ok=True)
    meta = {"kind": "tokens", "fingerprint": fingerprint, "num_layers": 6,
            "moe_layers": list(MOE_LAYERS), "experts_per_layer": EXPERTS, "top_k": TOP_K,
            "tag": tag, "run_id": run_id}
    path = out / f"{tag}-{run_id:08x}.parquet"
    writer = TraceWriter(path, tag=tag, top_k=TOP_K, meta=meta, row_group_rows=50)
    for i, n in enumerate(lengths):
        seq = (run_id << 32) + i
        for p in range(n):
            pos = p * pos_step
            rows = [experts_of(i, pos, o) if experts_of else [(2 * i) % EXPERTS,
                                                              (2 * i + 1) % EXPERTS]
                    for o in range(len(MOE_LAYERS))]
            writer.write(np.full(3, seq), np.full(3, pos), np.full(3, 5),
                         np.full(3, PHASES.index(phase)), np.array(MOE_LAYERS),
                         np.array(rows), None)
    return writer.close()


def _direct_counts(trace_dir: Path, phase: str | None) -> tuple[np.ndarray, int, int]:
    """Counts [L, E], tokens and sequences computed by DuckDB straight from the Parquet."""
    where = f"WHERE phase = '{phase}'" if phase else ""
    glob = f"{trace_dir}/**/*.parquet"
    rows = duckdb.sql(f"SELECT layer, e, count(*) FROM (SELECT layer, unnest(experts) AS e "
                      f"FROM read_parquet('{glob}') {where}) GROUP BY layer, e").fetchall()
    meta = json.loads(pq.read_schema(next(trace_dir.rglob("*.parquet"))).metadata[b"placer"])
    counts = np.zeros((len(meta["moe_layers"]), meta["experts_per_layer"]), dtype=np.int64)
    for layer, expert, n in rows:
        counts[meta["moe_layers"].index(layer), expert] = n
    tokens, seqs = duckdb.sql(f"SELECT count(DISTINCT (seq_id, pos)), count(DISTINCT seq_id) "
                              f"FROM read_parquet('{glob}') {where}").fetchall()[0]
    return counts, tokens, seqs


@pytest.mark.parametrize("arch", ["qwen3_moe", "deepseek_v3"])
def test_profile_counts_equal_direct_count(arch, collected, monkeypatch):
    import traces.storing.dataset

    for mode, phase in [("score", "decode"), ("generate", "decode"), ("generate", None),
                        ("generate", "prefill")]:
        trace_dir = collected[(arch, mode)]
        counts, tokens, seqs = _direct_counts(trace_dir, phase)
        for batch_rows in (1 << 20, 7):  # one batch, and batches that split tokens/sequences
            monkeypatch.setattr(traces.storing.dataset, "BATCH_ROWS", batch_rows)
            profile = load_profile(trace_dir, phase=phase)
            assert profile.per_token and profile.top_k == 2 and profile.num_experts == 8
            np.testing.assert_array_equal(profile.counts, counts)
            assert (profile.tokens, profile.sequences) == (tokens, seqs)
            np.testing.assert_allclose(profile.frequency().sum(axis=1), 2.0)
    assert load_profile(collected[(arch, "score")]).moe_layers == (
        (1, 2) if arch == "deepseek_v3" else (0, 1, 2))


def test_profile_tags_seq_ids_and_decode_fallback(collected, tmp_path):
    score = collected[("qwen3_moe", "score")]
    both = load_profile(score)
    prose, random = load_profile(score, tags=["prose"]), load_profile(score, tags=["random"])
    assert (prose.name, random.name, both.name) == ("prose", "random", score.name)
    np.testing.assert_array_equal(prose.counts + random.counts, both.counts)
    assert random.tokens == 150 and prose.tokens + random.tokens == both.tokens
    folds = split_sequences(score, 3, seed=1)
    assert sum(len(f) for f in folds) == both.sequences
    assert not (folds[0] & folds[1]) and split_sequences(score, 3, seed=1) == folds
    parts = [load_profile(score, seq_ids=f) for f in folds]
    np.testing.assert_array_equal(sum(p.counts for p in parts), both.counts)
    assert sum(p.tokens for p in parts) == both.tokens
    assert max(len(f) for f in folds) - min(len(f) for f in folds) <= 1
    prefill_only = write_synthetic(tmp_path / "p", [4, 5], phase="prefill").parent
    assert load_profile(prefill_only).tokens == 9  # no decode rows: all rows
    with pytest.raises(TraceError, match="no trace rows"):
        load_profile(score, tags=["nope"])


def test_hive_partitions_are_read(collected, tmp_path):
    src = collected[("olmoe", "score")]
    for i, f in enumerate(sorted(src.glob("*.parquet"))):
        part = tmp_path / f"host=h{i}" / f"tag={f.name.split('-')[0]}"
        part.mkdir(parents=True)
        shutil.copy(f, part / f.name)
    np.testing.assert_array_equal(load_profile(tmp_path).counts, load_profile(src).counts)


def test_sample_steps_uses_distinct_sequences(tmp_path):
    trace = write_synthetic(tmp_path / "t", [3, 9, 1, 6, 4, 7, 2, 5]).parent
    steps = sample_steps(trace, batch=5, num_steps=200, seed=3)
    assert steps.shape == (200, 3, EXPERTS) and steps.dtype == bool
    # sequence i owns experts {2i, 2i+1}: 5 distinct sequences light exactly 10 experts
    assert np.all(steps.sum(axis=2) == 10)
    np.testing.assert_array_equal(steps, sample_steps(trace, 5, 200, seed=3))
    assert not np.array_equal(steps, sample_steps(trace, 5, 200, seed=4))
    with pytest.raises(TraceError, match="only 8 sequences"):
        sample_steps(trace, batch=9, num_steps=1)
    # longer sequences are in flight more often: P(seq 1, 9 tokens) > P(seq 2, 1 token)
    hits = steps[:, 0, :].reshape(200, 8, 2).all(axis=2).sum(axis=0)
    assert hits[1] > hits[2]


def test_sample_steps_gathers_the_sampled_tokens(tmp_path):
    # token at (seq i, pos p) selects experts {p mod E, (p + 1 + i) mod E}, pos with gaps
    def experts_of(i, pos, ordinal):
        return [pos % EXPERTS, (pos + 1 + i + ordinal) % EXPERTS]

    trace = write_synthetic(tmp_path / "t", [6, 6], pos_step=3, experts_of=experts_of).parent
    steps = sample_steps(trace, batch=1, num_steps=300, seed=0)
    valid = {tuple(sorted(experts_of(i, 3 * p, 0))) for i in range(2) for p in range(6)}
    for s in range(300):
        assert tuple(np.flatnonzero(steps[s, 0])) in valid
    seen = {tuple(np.flatnonzero(steps[s, 0])) for s in range(300)}
    assert len(seen) == len(valid)  # every token of both sequences gets sampled


def test_sample_steps_real_trace_and_restrictions(collected):
    trace = collected[("gpt_oss", "generate")]
    profile = load_profile(trace)
    steps = sample_steps(trace, batch=3, num_steps=50, seed=0)
    assert steps.shape == (50, 3, 8)
    per_layer = steps.sum(axis=2)
    assert per_layer.min() >= 2 and per_layer.max() <= 6
    assert np.all(steps.any(axis=0) <= (profile.counts > 0))  # only experts that occur
    folds = split_sequences(trace, 2, seed=0)
    restricted = sample_steps(trace, 2, 30, seed=0, seq_ids=folds[0])
    allowed = load_profile(trace, seq_ids=folds[0]).counts > 0
    assert np.all(restricted.any(axis=0) <= allowed)
    with pytest.raises(TraceError, match="trace directory"):
        sample_steps(profile, 2, 3)


def test_sample_steps_from_counts_is_gumbel_top_k(tmp_path, placer_run):
    counts = np.zeros((2, 6), dtype=np.int64)
    counts[0] = [50, 30, 20, 0, 0, 0]
    counts[1] = [10, 10, 10, 10, 10, 0]
    np.save(tmp_path / "c.npy", counts)
    placer_run("traces", "import", tmp_path / "c.npy", "--out", tmp_path / "d", "--top-k", 2)
    steps = sample_steps(tmp_path / "d", batch=1, num_steps=2000, seed=0)
    assert np.all(steps.sum(axis=2) == 2)  # one token: exactly top_k distinct experts
    assert not steps[:, 0, 3:].any()
    assert not steps[:, 1, 5].any()
    share = steps[:, 0, :3].mean(axis=0)
    assert share[0] > share[1] > share[2]
    profile = load_profile(tmp_path / "d")
    np.testing.assert_array_equal(sample_steps(profile, 4, 10, seed=2),
                                  sample_steps(tmp_path / "d", 4, 10, seed=2))


def test_import_round_trip_and_shape_checks(tmp_path, collected, placer_run):
    rng = np.random.default_rng(0)
    counts = rng.integers(0, 1000, size=(4, 8))
    np.save(tmp_path / "m.npy", counts)
    csv_path = tmp_path / "m.csv"
    csv_path.write_text(",".join(f"e{i}" for i in range(8)) + "\n"
                        + "\n".join(",".join(map(str, row)) for row in counts) + "\n")
    for source, out in [(tmp_path / "m.npy", tmp_path / "a"), (csv_path, tmp_path / "b")]:
        result = placer_run("traces", "import", source, "--out", out, "--tag", "other",
                            "--top-k", 2)
        assert "4 MoE layers x 8 experts" in result.output
        profile = load_profile(out)
        assert isinstance(profile, Profile) and not profile.per_token
        assert profile.fingerprint is None and profile.name == "other"
        np.testing.assert_array_equal(profile.counts, counts)
        assert profile.tokens == -(-counts.sum(axis=1).max() // 2)
        assert profile.moe_layers == (0, 1, 2, 3) and profile.top_k == 2
        check_shape(out, 4, 8)
        check_compatible(out, "any-fingerprint", [1, 2, 3, 4], 8)
        with pytest.raises(TraceError, match="4 MoE layers x 8 experts"):
            check_shape(out, 4, 16)
        with pytest.raises(TraceError, match="the model has 3 x 8"):
            check_compatible(out, "x", [0, 1, 2], 8)
        with pytest.raises(TraceError, match="without a model fingerprint"):
            check_fingerprint(out, "x")
    result = placer_run("traces", "import", tmp_path / "m.npy", "--out", tmp_path / "a",
                        "--top-k", 2, ok=False)
    assert_one_line_error(result, "already holds traces")
    result = placer_run("collect", "--model", "nowhere", "--corpus", csv_path, "--out",
                        tmp_path / "a", ok=False)
    assert result.exit_code == 1
    per_token = collected[("mixtral", "score")]
    check_shape(per_token, 3, 8)
    with pytest.raises(TraceError, match="3 MoE layers x 8 experts"):
        check_shape(per_token, 3, 9)


def test_import_bad_matrices(tmp_path, placer_run):
    np.save(tmp_path / "neg.npy", np.array([[1, -1], [2, 3]]))
    np.save(tmp_path / "frac.npy", np.array([[0.5, 1.0]]))
    np.save(tmp_path / "flat.npy", np.arange(5))
    (tmp_path / "ragged.csv").write_text("1,2,3\n4,5\n")
    (tmp_path / "m.txt").write_text("1,2\n")
    cases = [("neg.npy", "non-negative integers"), ("frac.npy", "non-negative integers"),
             ("flat.npy", "2-D"), ("ragged.csv", "equal length"), ("m.txt", "unknown count"),
             ("missing.npy", "not found")]
    for name, needle in cases:
        result = placer_run("traces", "import", tmp_path / name, "--out", tmp_path / "o",
                            "--top-k", 1, ok=False)
        assert_one_line_error(result, needle)
    np.save(tmp_path / "ok.npy", np.ones((2, 4), dtype=np.int64))
    assert_one_line_error(placer_run("traces", "import", tmp_path / "ok.npy", "--out",
                                      tmp_path / "o", "--top-k", 5, ok=False), "--top-k must be")


def test_fingerprint_check(collected, trace_models):
    from placer.checkpoint.inventory import read_inventory

    trace = collected[("qwen3_moe", "score")]
    own = read_inventory(trace_models["qwen3_moe"])
    other = read_inventory(trace_models["mixtral"])
    check_fingerprint(trace, own.fingerprint)
    check_compatible(trace, own.fingerprint, own.moe_layers, own.experts_per_layer)
    with pytest.raises(TraceError, match="another model"):
        check_fingerprint(trace, other.fingerprint)
    with pytest.raises(TraceError, match="another model"):
        check_compatible(trace, other.fingerprint, other.moe_layers, other.experts_per_layer)
    with pytest.raises(TraceError, match="not found"):
        check_fingerprint(trace / "nope", own.fingerprint)


def test_mixed_models_in_one_dir_refused(tmp_path):
    write_synthetic(tmp_path, [2], run_id=1, fingerprint="aaaa")
    write_synthetic(tmp_path, [2], run_id=2, fingerprint="bbbb")
    with pytest.raises(TraceError, match="different models"):
        load_profile(tmp_path)


def test_stats_json_and_heatmap(collected, tmp_path, placer_run):
    trace = collected[("qwen3_moe", "generate")]
    png = tmp_path / "heat.png"
    result = placer_run("traces", "stats", trace, "--json", "--plot", png)
    stats = json.loads(result.output)
    counts, tokens, seqs = _direct_counts(trace, None)
    assert (stats["tokens"], stats["sequences"]) == (tokens, seqs)
    prefill = _direct_counts(trace, "prefill")[1]
    assert stats["phases"] == {"prefill": prefill, "decode": tokens - prefill}
    assert stats["tags"] == {"vicuna_bench_questions": {"tokens": tokens, "sequences": seqs}}
    assert [entry["layer"] for entry in stats["layers"]] == [0, 1, 2]
    for entry, row in zip(stats["layers"], counts, strict=True):
        p = row / row.sum()
        assert entry["entropy_bits"] == pytest.approx(-(p[p > 0] * np.log2(p[p > 0])).sum())
        top = np.sort(row)[::-1]
        assert entry["hot_share"]["25%"] == pytest.approx(top[:2].sum() / row.sum())
        assert entry["hot_share"]["10%"] == pytest.approx(top[:1].sum() / row.sum())
        assert entry["hot_share"]["50%"] == pytest.approx(top[:4].sum() / row.sum())
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 2000
    score = collected[("qwen3_moe", "score")]
    stats = json.loads(placer_run("traces", "stats", score, "--json").output)
    assert stats["tags"]["random"] == {"tokens": 150, "sequences": 4}
    text = placer_run("traces", "stats", score).output
    assert "entropy" in text and "random" in text


def test_stats_of_imported_counts(tmp_path, placer_run):
    np.save(tmp_path / "c.npy", np.array([[4, 0, 0, 0], [1, 1, 1, 1]]))
    placer_run("traces", "import", tmp_path / "c.npy", "--out", tmp_path / "d", "--top-k", 1)
    stats = json.loads(placer_run("traces", "stats", tmp_path / "d", "--json").output)
    assert stats["kind"] == "counts" and stats["tokens"] == 4
    assert [e["entropy_bits"] for e in stats["layers"]] == [0.0, 2.0]


def test_stats_bad_inputs(tmp_path, placer_run):
    assert_one_line_error(placer_run("traces", "stats", tmp_path / "nope", ok=False), "not found")
    (tmp_path / "empty").mkdir()
    assert_one_line_error(placer_run("traces", "stats", tmp_path / "empty", ok=False),
                           "no traces")
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "x.parquet").write_text("not parquet")
    assert_one_line_error(placer_run("traces", "stats", tmp_path / "junk", ok=False),
                           "not a readable Parquet file")

