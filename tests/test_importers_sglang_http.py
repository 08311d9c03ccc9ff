"""`placer traces import --format sglang-http`: saved /generate responses whose
`meta_info["routed_experts"]` is the base64 of int32 (prompt + completion - 1, layers, width)
bytes, as SGLang's detokenizer_manager.py / routed_experts_capturer.py write it (see
traces/importers/sglang.py), round-trip to trace rows: one sequence per response, prompt rows
prefill, generated rows decode."""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest
from cli_errors import assert_one_line_error
from importer_files import (
    EXPERTS,
    MOE_LAYERS,
    NUM_LAYERS,
    TOP_K,
    random_routing,
    sequences,
    trace_rows,
    write_config,
)

from traces.collect import ModelIdentity
from traces.errors import TraceError
from traces.importers.sglang import decode_routed_experts


def response(rng: np.random.Generator, prompt: int, completion: int, width: int = TOP_K
             ) -> tuple[dict, np.ndarray, list[int]]:
    """(/generate response, its routed experts of the MoE layers, output_ids)."""
    tokens = prompt + completion - 1
    routed = np.zeros((tokens, NUM_LAYERS, width), dtype=np.int32)
    routed[:, list(MOE_LAYERS), :TOP_K] = random_routing(rng, tokens)
    routed[:, list(MOE_LAYERS), TOP_K:] = EXPERTS  # fused shared experts sit past the routed
    output_ids = rng.integers(0, 256, completion).tolist()
    meta = {"id": f"req{prompt}", "finish_reason": {"type": "length", "length": completion},
            "prompt_tokens": prompt, "completion_tokens": completion, "cached_tokens": 0,
            "routed_experts": base64.b64encode(routed.tobytes()).decode("utf-8")}
    return ({"text": "...", "output_ids": output_ids, "meta_info": meta},
            routed[:, list(MOE_LAYERS), :TOP_K], output_ids)


def test_sglang_http_round_trip(tmp_path, cli):
    rng = np.random.default_rng(5)
    config = write_config(tmp_path / "model")
    made = [response(rng, 4, 3), response(rng, 2, 5, width=TOP_K + 1), response(rng, 6, 1)]
    lines = [json.dumps(made[0][0]), json.dumps([made[1][0], made[2][0]])]  # one batched line
    (tmp_path / "responses.jsonl").write_text("\n".join(lines) + "\n")
    out = tmp_path / "out"
    cli("traces", "import", tmp_path / "responses.jsonl", "--out", out, "--config", config)
    rows = trace_rows(out)
    layers = len(MOE_LAYERS)
    experts = np.concatenate([m[1] for m in made])
    np.testing.assert_array_equal(rows["experts"], experts.reshape(-1, TOP_K))
    lengths = np.array([len(m[1]) for m in made])
    np.testing.assert_array_equal(sequences(rows), np.repeat(np.arange(3), lengths * layers))
    prompts = [4, 2, 6]
    phase = np.concatenate([np.where(np.arange(n) < p, "prefill", "decode")
                            for n, p in zip(lengths, prompts, strict=True)])
    np.testing.assert_array_equal(rows["phase"], np.repeat(phase, layers))
    token = np.concatenate([[-1] * p + m[2][:-1] for p, m in zip(prompts, made, strict=True)])
    np.testing.assert_array_equal(rows["token"], np.repeat(token, layers))
    np.testing.assert_array_equal(
        rows["pos"], np.repeat(np.concatenate([np.arange(n) for n in lengths]), layers))


def test_bad_sglang_http_files(tmp_path, cli):
    rng = np.random.default_rng(6)
    config = write_config(tmp_path / "model")
    good, _, _ = response(rng, 3, 2)
    short = json.loads(json.dumps(good))
    short["meta_info"]["completion_tokens"] = 3
    missing = {"text": "", "meta_info": {"prompt_tokens": 3, "completion_tokens": 2}}
    wide, _, _ = response(rng, 3, 2, width=TOP_K + 2)  # the config's model has 1 shared expert
    cases = {"short": (json.dumps(short), "expected 5 tokens (prompt + completion - 1)"),
             "wide": (json.dumps(wide), "(or top-k + 1 columns with fused shared experts)"),
             "missing": (json.dumps(missing), "no meta_info.routed_experts"),
             "notjson": ("{oops", "not valid JSON")}
    for name, (line, needle) in cases.items():
        (tmp_path / f"{name}.jsonl").write_text(line + "\n")
        result = cli("traces", "import", tmp_path / f"{name}.jsonl", "--out", tmp_path / "o",
                     "--config", config, ok=False)
        assert_one_line_error(result, needle)
        assert not any(tmp_path.glob("o/*.parquet*"))


def test_decode_routed_experts_wants_exactly_the_rows_that_ran():
    """prompt + completion - 1 rows, no more; top_k or top_k + shared columns when the shared
    experts are known; the message names no place (each caller prefixes its own)."""
    rng = np.random.default_rng(7)
    identity = ModelIdentity("f", NUM_LAYERS, MOE_LAYERS, EXPERTS, TOP_K)
    meta = response(rng, 3, 2, width=TOP_K + 1)[0]["meta_info"]
    routed = base64.b64decode(meta["routed_experts"])
    got = decode_routed_experts(meta["routed_experts"], 3, 2, identity, shared_experts=1)
    assert got.shape == (4, len(MOE_LAYERS), TOP_K)
    row = len(routed) // 4
    cases = [(routed + routed[-row:], 1, "expected 4 tokens (prompt + completion - 1)"),
             (routed, 2, "(or top-k + 2 columns with fused shared experts)")]
    for raw, shared, words in cases:
        with pytest.raises(TraceError, match="^meta_info.routed_experts holds ") as error:
            decode_routed_experts(base64.b64encode(raw).decode(), 3, 2, identity, shared)
        assert words in str(error.value)
