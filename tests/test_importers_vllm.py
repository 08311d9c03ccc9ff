"""`placer traces import --format vllm`: per-request `CompletionOutput.routed_experts` arrays
([prompt + output - 1 - start, num_hidden_layers, k], dense layers 0, uint8 where the experts
fit, as vLLM 0.33.0's routed_experts_capturer.py and aux_output_connector produce them; see
traces/importers/vllm.py) round-trip to trace rows with their sequences, positions and
phases, also when the request skipped prompt tokens (routed_experts_prompt_start)."""

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


def test_vllm_routed_experts_prompt_start(tmp_path, cli):
    """A request with routed_experts_prompt_start S returns positions [S, P + C - 1): the start
    comes from --prompt-lens {"prompt", "completion"} (derived), its "start", or
    --prompt-start; positions and phases follow; rows that fit no start are refused."""
    rng = np.random.default_rng(5)
    config = write_config(tmp_path / "model")
    prompt, completion, start = 6, 3, 4
    full = routed_experts(rng, prompt + completion - 1).astype(np.uint8)  # <= 256 experts
    np.savez(tmp_path / "r.npz", r0=full[start:])
    lens = {"derived": {"r0": {"prompt": prompt, "completion": completion}},
            "given": {"r0": {"prompt": prompt, "start": start}}, "option": {"r0": prompt}}
    for name, value in lens.items():
        (tmp_path / f"{name}.json").write_text(json.dumps(value))
    runs = {"derived": ["--prompt-lens", tmp_path / "derived.json"],
            "given": ["--prompt-lens", tmp_path / "given.json"],
            "option": ["--prompt-lens", tmp_path / "option.json", "--prompt-start", start]}
    layers = len(MOE_LAYERS)
    for name, extra in runs.items():
        out = tmp_path / name
        result = cli("traces", "import", tmp_path / "r.npz", "--format", "vllm", "--out", out,
                     "--config", config, *extra)
        assert "1 of 1 requests start mid-prompt" in result.stdout
        rows = trace_rows(out)
        np.testing.assert_array_equal(rows["pos"], np.repeat(np.arange(start, 8), layers))
        np.testing.assert_array_equal(rows["phase"], np.repeat(
            ["prefill"] * 2 + ["decode"] * 2, layers))
        np.testing.assert_array_equal(rows["experts"],
                                      full[start:, list(MOE_LAYERS)].reshape(-1, TOP_K))
    (tmp_path / "bad.json").write_text(json.dumps({"r0": {"prompt": 2, "completion": 2}}))
    (tmp_path / "past.json").write_text(json.dumps({"r0": {"prompt": 3, "start": 4}}))
    (tmp_path / "odd.json").write_text(json.dumps({"r0": {"prompt": 3, "begin": 4}}))
    cases = [(["--prompt-lens", tmp_path / "bad.json"], "4 routed rows do not fit prompt 2"),
             (["--prompt-lens", tmp_path / "past.json"], "prompt start 4 is past the prompt"),
             (["--prompt-lens", tmp_path / "odd.json"], "expected prompt tokens >= 1 or an"),
             (["--prompt-lens", tmp_path / "derived.json", "--prompt-start", 1],
              "4 routed rows, expected prompt 6 + completion 3 - 1 - start 1 = 7")]
    for extra, needle in cases:
        assert_one_line_error(cli("traces", "import", tmp_path / "r.npz", "--format", "vllm",
                                  "--out", tmp_path / "o", "--config", config, *extra,
                                  ok=False), needle)
    assert_one_line_error(cli("traces", "import", tmp_path / "r.npz", "--format", "tokens",
                              "--out", tmp_path / "o", "--config", config, "--prompt-start", 1,
                              ok=False), "--prompt-start is for the vllm and sglang-http")
