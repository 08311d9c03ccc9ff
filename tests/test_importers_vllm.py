"""`placer traces import --format vllm`: per-request `CompletionOutput.routed_experts` arrays
(int32 [prompt + output - 1, num_hidden_layers, k], dense layers 0, as vLLM's
routed_experts_capturer.py and scheduler.py `_get_routed_experts` produce them; see
traces/importers/vllm.py) round-trip to trace rows with their sequences and phases."""

from __future__ import annotations

import json

import numpy as np
from cli_errors import assert_one_line_error
from importer_files import (
    MOE_LAYERS,
    NUM_LAYERS,
    TOP_K,
    random_routing,
    sequences,
    trace_rows,
    write_config,
)

PROMPTS, OUTPUTS = {"r0": 5, "r1": 3, "r2": 8}, {"r0": 4, "r1": 1, "r2": 6}


def routed_experts(rng: np.random.Generator, tokens: int) -> np.ndarray:
    """[tokens, NUM_LAYERS, TOP_K] int32 as vLLM returns it: 0 in the dense layer."""
    out = np.zeros((tokens, NUM_LAYERS, TOP_K), dtype=np.int32)
    out[:, list(MOE_LAYERS)] = random_routing(rng, tokens)
    return out


def test_vllm_round_trip(tmp_path, cli):
    rng = np.random.default_rng(3)
    config = write_config(tmp_path / "model")
    arrays = {name: routed_experts(rng, PROMPTS[name] + OUTPUTS[name] - 1) for name in PROMPTS}
    (tmp_path / "dir").mkdir()
    for name, array in arrays.items():
        np.save(tmp_path / "dir" / f"{name}.npy", array)
    np.savez(tmp_path / "all.npz", **arrays)
    (tmp_path / "prompts.json").write_text(json.dumps(PROMPTS))
    layers = len(MOE_LAYERS)
    expected_phase = np.concatenate([np.where(np.arange(len(a)) < PROMPTS[n], "prefill",
                                              "decode") for n, a in arrays.items()])
    for source in (tmp_path / "dir", tmp_path / "all.npz"):
        out = tmp_path / f"out-{source.stem}"
        cli("traces", "import", source, "--format", "vllm", "--out", out, "--config", config,
            "--prompt-lens", tmp_path / "prompts.json")
        rows = trace_rows(out)
        experts = np.concatenate([a[:, list(MOE_LAYERS)] for a in arrays.values()])
        np.testing.assert_array_equal(rows["experts"], experts.reshape(-1, TOP_K))
        np.testing.assert_array_equal(rows["layer"], np.tile(MOE_LAYERS, len(experts)))
        lengths = np.array([len(a) for a in arrays.values()])
        np.testing.assert_array_equal(sequences(rows), np.repeat(np.arange(3), lengths * layers))
        np.testing.assert_array_equal(
            rows["pos"], np.repeat(np.concatenate([np.arange(n) for n in lengths]), layers))
        np.testing.assert_array_equal(rows["phase"], np.repeat(expected_phase, layers))
    cli("traces", "import", tmp_path / "all.npz", "--format", "vllm", "--out",
        tmp_path / "plain", "--config", config)
    assert set(trace_rows(tmp_path / "plain")["phase"]) == {"decode"}


def test_bad_vllm_files(tmp_path, cli):
    rng = np.random.default_rng(4)
    config = write_config(tmp_path / "model")
    good = routed_experts(rng, 6)
    dense = good.copy()
    dense[2, 0, 1] = 3
    np.savez(tmp_path / "dense.npz", r0=dense)
    np.savez(tmp_path / "layers.npz", r0=good[:, 1:])
    np.savez(tmp_path / "ok.npz", r0=good)
    (tmp_path / "long.json").write_text(json.dumps({"r0": 7}))
    (tmp_path / "other.json").write_text(json.dumps({"r9": 2}))
    cases = [("dense.npz", [], "decoder layers [0] hold routed experts"),
             ("layers.npz", [], f"expected [tokens, {NUM_LAYERS} decoder layers"),
             ("ok.npz", ["--prompt-lens", tmp_path / "long.json"], "only 6 routed rows"),
             ("ok.npz", ["--prompt-lens", tmp_path / "other.json"], "no prompt length for"),
             ("ok.npz", ["--prompt-lens", tmp_path / "none.json"], "file not found")]
    for name, extra, needle in cases:
        result = cli("traces", "import", tmp_path / name, "--format", "vllm", "--out",
                     tmp_path / "o", "--config", config, *extra, ok=False)
        assert_one_line_error(result, needle)
        assert not any(tmp_path.glob("o/*.parquet*"))
    assert_one_line_error(cli("traces", "import", tmp_path / "ok.npz", "--out", tmp_path / "o",
                              "--config", config, ok=False), "give --format")
