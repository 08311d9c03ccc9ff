"""`placer traces import --format tokens`: the plain per-token form (traces/importers/tokens.py)
round-trips to trace rows, imports the real ESFT routing, and refuses bad files in one line."""

from __future__ import annotations

import json

import numpy as np
import pytest
from cli_errors import assert_one_line_error
from importer_files import (
    EXPERTS,
    MOE_LAYERS,
    SHARED_DATA,
    TOP_K,
    random_routing,
    sequences,
    trace_rows,
    write_config,
)

from traces.storing.profile import load_profile

ESFT = SHARED_DATA / "routing" / "esft-deepseek-v2-lite"


def test_tokens_round_trip(tmp_path, cli):
    rng = np.random.default_rng(0)
    config = write_config(tmp_path / "model")
    seq_lens = np.array([5, 1, 7], dtype=np.int64)
    experts = random_routing(rng, int(seq_lens.sum())).astype(np.int16)
    weights = rng.random(experts.shape).astype(np.float32)
    np.savez(tmp_path / "hook.npz", expert_ids=experts, seq_lens=seq_lens, weights=weights)
    out = tmp_path / "out"
    result = cli("traces", "import", tmp_path / "hook.npz", "--out", out, "--config", config,
                 "--json")
    summary = json.loads(result.output)
    assert summary["per_token"] and summary["sequences"] == 3 and summary["tokens"] == 13
    rows = trace_rows(out)
    n, layers = len(experts), len(MOE_LAYERS)
    np.testing.assert_array_equal(rows["experts"], experts.reshape(n * layers, TOP_K))
    np.testing.assert_array_equal(np.stack(rows["weights"]), weights.reshape(n * layers, TOP_K))
    np.testing.assert_array_equal(rows["layer"], np.tile(MOE_LAYERS, n))
    np.testing.assert_array_equal(sequences(rows), np.repeat(np.arange(3), seq_lens * layers))
    pos = np.concatenate([np.arange(s) for s in seq_lens])
    np.testing.assert_array_equal(rows["pos"], np.repeat(pos, layers))
    assert set(rows["phase"]) == {"decode"} and set(rows["token"]) == {-1}
    # A .npy of expert ids alone is one sequence (the format must be named: 3-D is ambiguous).
    np.save(tmp_path / "ids.npy", experts.astype(np.int64))
    cli("traces", "import", tmp_path / "ids.npy", "--format", "tokens", "--out",
        tmp_path / "npy", "--config", config)
    plain = trace_rows(tmp_path / "npy")
    np.testing.assert_array_equal(plain["experts"], rows["experts"])
    assert set(sequences(plain)) == {0} and set(plain["weights"]) == {None}


@pytest.mark.skipif(not ESFT.is_dir(), reason="../shared/data/routing not present")
def test_real_esft_routing_imports(tmp_path, cli):
    source = ESFT / "summary.npz"
    cli("traces", "import", source, "--out", tmp_path / "esft", "--config",
        ESFT / "config.json")
    data = np.load(source)
    ids = data["expert_ids"].astype(np.int64)
    expected = np.stack([np.bincount(ids[:, i].ravel(), minlength=64)
                         for i in range(ids.shape[1])])
    profile = load_profile(tmp_path / "esft")
    np.testing.assert_array_equal(profile.counts, expected)
    assert profile.moe_layers == tuple(range(1, 27)) and profile.top_k == 6
    assert profile.tokens == len(ids) and profile.sequences == len(data["seq_lens"])


def test_bad_token_files(tmp_path, cli):
    config = write_config(tmp_path / "model")
    rng = np.random.default_rng(1)
    good = random_routing(rng, 4)
    np.savez(tmp_path / "nokey.npz", ids=good)
    np.savez(tmp_path / "layers.npz", expert_ids=good[:, :2])
    np.savez(tmp_path / "range.npz", expert_ids=np.where(good == 0, EXPERTS, good))
    np.savez(tmp_path / "lens.npz", expert_ids=good, seq_lens=np.array([3, 3]))
    np.savez(tmp_path / "floats.npz", expert_ids=good.astype(np.float32))
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    cases = [("nokey.npz", ["--format", "tokens"], "no expert_ids array"),
             ("layers.npz", [], "expected [tokens, 3 MoE layers, top-k 2]"),
             ("range.npz", [], f"expected [0, {EXPERTS})"),
             ("lens.npz", [], "summing to the 4 tokens"),
             ("floats.npz", [], "expected integers"),
             ("junk.npz", ["--format", "tokens"], "not a readable"),
             ("nokey.npz", [], "give --format")]
    for name, extra, needle in cases:
        result = cli("traces", "import", tmp_path / name, "--out", tmp_path / "o", "--config",
                     config, *extra, ok=False)
        assert_one_line_error(result, needle)
        assert not (tmp_path / "o").exists() or not any((tmp_path / "o").iterdir())
    np.savez(tmp_path / "ok.npz", expert_ids=good)
    options = [([], "needs --model CKPT or --config"),
               (["--config", config, "--top-k", 3], "--top-k 3 differs from the model's 2"),
               (["--config", config, "--tokens", 9], "--tokens is for count matrices"),
               (["--config", config, "--model", tmp_path], "not both"),
               (["--config", config, "--prompt-lens", config], "--prompt-lens is for the vllm")]
    for extra, needle in options:
        assert_one_line_error(cli("traces", "import", tmp_path / "ok.npz", "--out",
                                  tmp_path / "o", *extra, ok=False), needle)
