"""Bounded memory at any trace size (issue #53 item 9): the static statistics are streamed
(read in chunks of any size, they are the whole trace's exactly), and a trace set over the
replay bound is replayed on a seeded sample of whole sequences, said in solve's and
evaluate's output. The bound is made tiny here (the real one is benchmarks/bench_scale.py's)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from test_evaluate import BOX, CONFIG, LAYERS, TOP_K, random_seqs, write_trace

from placer.predict import evaluate
from traces.storing import dataset, sample
from traces.storing.profile import every_token_steps, load_profile, sequence_counts
from traces.storing.sample import replay_sample

LENGTHS = [9, 14, 5, 11, 8, 13, 6, 10, 12, 7, 9, 15]  # 119 tokens in 12 sequences
PER_TOKEN = len(LAYERS) * TOP_K
BOUND = 40 * PER_TOKEN  # 40 tokens of selections: a few whole sequences


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("bounded")
    (root / "config.json").write_text(json.dumps(CONFIG))
    seqs = random_seqs(LENGTHS, seed=5)
    return {"root": root, "seqs": seqs,
            "calib": write_trace(root / "calib", seqs, run_id=4),
            "held": write_trace(root / "held", random_seqs(LENGTHS, seed=6), run_id=5)}


def test_static_statistics_in_tiny_chunks_equal_the_whole(traces, monkeypatch):
    whole, (ids, per_seq) = load_profile(traces["calib"]), sequence_counts(traces["calib"])
    monkeypatch.setattr(dataset, "BATCH_ROWS", 5)  # rows a batch holds at most
    seen = [len(b["seq_id"]) for b in dataset.stream_rows(
        dataset.open_traces(traces["calib"]), ["seq_id"], None, None, None)]
    assert max(seen) <= 5 and sum(seen) == sum(LENGTHS) * len(LAYERS)
    chunked, (chunk_ids, chunk_seq) = load_profile(traces["calib"]), sequence_counts(
        traces["calib"])
    np.testing.assert_array_equal(chunked.counts, whole.counts)
    assert (chunked.tokens, chunked.sequences) == (whole.tokens, whole.sequences) == (
        sum(LENGTHS), len(LENGTHS))
    np.testing.assert_array_equal(chunk_ids, ids)
    np.testing.assert_array_equal(chunk_seq, per_seq)
    want = np.zeros_like(whole.counts)
    for s in traces["seqs"]:
        for layer in range(len(LAYERS)):
            np.add.at(want[layer], s[:, layer].ravel(), 1)
    np.testing.assert_array_equal(whole.counts, want)


def test_the_sample_is_whole_sequences_seeded_and_bounded(traces):
    assert replay_sample(traces["calib"], 0) is None  # within the real bound: every token
    assert replay_sample(traces["calib"], 0, max_selections=sum(LENGTHS) * PER_TOKEN) is None
    got = replay_sample(traces["calib"], 3, max_selections=BOUND)
    assert got == replay_sample(traces["calib"], 3, max_selections=BOUND)
    others = {replay_sample(traces["calib"], s, max_selections=BOUND).seq_ids for s in range(6)}
    assert len(others) > 1  # the seed picks the sample
    lengths = dict(zip(((4 << 32) + np.arange(len(LENGTHS))).tolist(), LENGTHS, strict=True))
    assert got.seq_ids <= set(lengths) and 1 <= got.sequences < len(LENGTHS)
    assert got.tokens == sum(lengths[s] for s in got.seq_ids)
    # within the bound, and stopped only by a sequence that would not fit (<= 15 tokens)
    assert BOUND // PER_TOKEN - max(LENGTHS) < got.tokens <= BOUND // PER_TOKEN
    assert (got.of_tokens, got.of_sequences) == (sum(LENGTHS), len(LENGTHS))
    steps = every_token_steps(traces["calib"], 1, seq_ids=set(got.seq_ids))
    kept, counts = np.unique(steps.seqs[:, 0], return_counts=True)  # every token of each
    assert {int(s): int(n) for s, n in zip(kept, counts, strict=True)} == {
        s: lengths[s] for s in got.seq_ids}


def test_solve_and_evaluate_say_their_sample(traces, cli, monkeypatch, tmp_path):
    monkeypatch.setattr(sample, "MAX_REPLAY_SELECTIONS", BOUND)
    monkeypatch.setattr(evaluate, "REPLAY_SELECTIONS", BOUND)
    plan = tmp_path / "plan.json"
    args = ["solve", "--config", traces["root"] / "config.json", "--hardware", BOX,
            "--traces", traces["calib"], "--offload", "0.5", "--concurrency", "1,2",
            "--solver", "greedy", "--out", plan]
    text = cli(*args).output
    (calib,) = json.loads(plan.read_text())["calibration"]
    want = replay_sample(traces["calib"], 0, max_selections=BOUND).json()
    assert calib["replay_sample"] == want and calib["tokens"] == sum(LENGTHS)
    assert f"replayed a seeded sample of {want['sequences']} whole sequences" in " ".join(
        text.split())
    report = json.loads(cli("evaluate", plan, "--traces", traces["held"], "--concurrency",
                            "1,2", "--oracle-time-limit", "1", "--json").output)
    (said,) = report["replay_samples"]
    held = replay_sample(traces["held"], 0, max_selections=BOUND)
    assert said == {"traces": str(traces["held"]), **held.json()}
    assert "sample of whole sequences" in report["replay"]
    assert {r["tokens"] for r in report["results"] if r["concurrency"] == 1} == {held.tokens}
    assert any("replayed a seeded sample" in n for n in report["notes"])
    monkeypatch.setattr(evaluate, "REPLAY_SELECTIONS", 10 ** 8)  # within it: no sample
    report = json.loads(cli("evaluate", plan, "--traces", traces["held"], "--concurrency", "1",
                            "--oracle-time-limit", "1", "--json").output)
    assert report["replay_samples"] == [] and report["replay"] == "every held-out token"
    assert report["results"][0]["tokens"] == sum(LENGTHS)
