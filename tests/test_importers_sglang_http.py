"""`placer traces import --format sglang-http`: saved /generate responses whose
`meta_info["routed_experts"]` is the base64 of int32 (prompt + completion - 1, layers, width)
bytes, as SGLang's detokenizer_manager.py / routed_experts_capturer.py write it (see
traces/importers/sglang.py), round-trip to trace rows: one sequence per response, prompt rows
prefill, generated rows decode."""

from __future__ import annotations

import base64
import json

import numpy as np
import pyarrow.parquet as pq
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

from traces.errors import TraceError
from traces.importers.sglang_http import decode_routed_experts
from traces.storing.schema import ModelIdentity


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
    short["meta_info"]["completion_tokens"] = 6  # 4 rows of 8 that ran: a start past the prompt
    missing = {"text": "", "meta_info": {"prompt_tokens": 3, "completion_tokens": 2}}
    wide, _, _ = response(rng, 3, 2, width=TOP_K + 2)  # the config's model has 1 shared expert
    cases = {"short": (json.dumps(short), "expected prompt + completion - 1 = 8 tokens less a "
                                          "start within the prompt"),
             "wide": (json.dumps(wide), "(or top-k + 1 columns with fused shared experts)"),
             "missing": (json.dumps(missing), "no meta_info.routed_experts"),
             "notjson": ("{oops", "not valid JSON")}
    for name, (line, needle) in cases.items():
        (tmp_path / f"{name}.jsonl").write_text(line + "\n")
        result = cli("traces", "import", tmp_path / f"{name}.jsonl", "--out", tmp_path / "o",
                     "--config", config, ok=False)
        assert_one_line_error(result, needle)
        assert not any(tmp_path.glob("o/*.parquet*"))


def test_decode_routed_experts_takes_the_rows_of_the_returned_tokens():
    """prompt + completion - 1 - start rows; with start not given it is derived (within the
    prompt); more rows than ran (sglang-kt's speculative overshoot) keep the first ones and
    count the rest; top_k or top_k + shared columns; the message names no place."""
    rng = np.random.default_rng(7)
    identity = ModelIdentity("f", NUM_LAYERS, MOE_LAYERS, EXPERTS, TOP_K)
    meta, experts, _ = response(rng, 3, 2, width=TOP_K + 1)
    routed = base64.b64decode(meta["meta_info"]["routed_experts"])
    got = decode_routed_experts(meta["meta_info"]["routed_experts"], 3, 2, identity,
                                shared_experts=1)
    assert got.experts.shape == (4, len(MOE_LAYERS), TOP_K) and (got.start, got.extra) == (0, 0)
    np.testing.assert_array_equal(got.experts, experts)
    row = len(routed) // 4

    def encoded(raw: bytes) -> str:
        return base64.b64encode(raw).decode()

    over = decode_routed_experts(encoded(routed + routed[-row:] * 2), 3, 2, identity, 1)
    assert (over.start, over.extra) == (0, 2)
    np.testing.assert_array_equal(over.experts, experts)
    late = decode_routed_experts(encoded(routed[2 * row:]), 3, 2, identity, 1, start=None)
    assert (late.start, late.extra) == (2, 0)
    np.testing.assert_array_equal(late.experts, experts[2:])
    assert decode_routed_experts(encoded(routed[2 * row:]), 3, 2, identity, 1, start=2).start == 2
    cases = [(routed[2 * row:], 1, 0, "expected 4 tokens (prompt + completion - 1)"),
             (routed[3 * row:], 1, 1, "expected 3 tokens (prompt + completion - 1 - start 1)"),
             (routed, 2, 0, "(or top-k + 2 columns with fused shared experts)"),
             (b"", 1, None, "less a start within the prompt")]
    for raw, shared, start, words in cases:
        with pytest.raises(TraceError, match="^meta_info.routed_experts holds ") as error:
            decode_routed_experts(encoded(raw), 3, 2, identity, shared, start=start)
        assert words in str(error.value)


def test_replies_that_start_mid_prompt_or_run_past_the_stop(tmp_path, cli):
    """A request with routed_experts_start_len S (SGLang 0.5.23) returns positions [S, P + C -
    1): positions and phases follow from S, derived or given by --prompt-start; a sglang-kt
    reply with rows past the stop keeps the returned tokens' rows; both are noted."""
    rng = np.random.default_rng(8)
    config = write_config(tmp_path / "model")
    made, start = response(rng, 5, 3), 2
    routed = np.frombuffer(base64.b64decode(made[0]["meta_info"]["routed_experts"]), np.int32)
    row = len(routed) // 7
    later = json.loads(json.dumps(made[0]))
    later["meta_info"]["routed_experts"] = base64.b64encode(
        routed[start * row:].tobytes()).decode()
    over = json.loads(json.dumps(made[0]))
    over["meta_info"]["routed_experts"] = base64.b64encode(
        np.concatenate([routed, routed[-row:]]).tobytes()).decode()
    (tmp_path / "later.jsonl").write_text(json.dumps(later) + "\n")
    (tmp_path / "over.jsonl").write_text(json.dumps(over) + "\n")
    for out, extra in (("a", []), ("b", ["--prompt-start", start])):
        result = cli("traces", "import", tmp_path / "later.jsonl", "--out", tmp_path / out,
                     "--config", config, *extra)
        assert "1 of 1 replies start mid-prompt" in result.stdout
        rows = trace_rows(tmp_path / out)
        layers = len(MOE_LAYERS)
        np.testing.assert_array_equal(rows["pos"], np.repeat(np.arange(start, 7), layers))
        np.testing.assert_array_equal(rows["phase"], np.repeat(
            ["prefill"] * 3 + ["decode"] * 2, layers))
        np.testing.assert_array_equal(rows["token"], np.repeat([-1] * 3 + made[2][:2], layers))
        np.testing.assert_array_equal(rows["experts"], made[1][start:].reshape(-1, TOP_K))
    assert_one_line_error(cli("traces", "import", tmp_path / "later.jsonl", "--out",
                              tmp_path / "c", "--config", config, "--prompt-start", 1, ok=False),
                          "expected 6 tokens (prompt + completion - 1 - start 1)")
    result = cli("traces", "import", tmp_path / "over.jsonl", "--out", tmp_path / "d",
                 "--config", config)
    assert "1 of 1 replies had 1 rows past prompt + completion - 1" in result.stdout
    np.testing.assert_array_equal(trace_rows(tmp_path / "d")["experts"],
                                  made[1].reshape(-1, TOP_K))
    meta = json.loads(pq.read_schema(next((tmp_path / "d").glob("*.parquet")))
                      .metadata[b"placer"])
    assert meta["extra_rows"] == 1 and meta["overshoot"] == 1 and "dropped" in meta["note"]


def test_positions_past_int32_are_refused_not_wrapped(tmp_path, cli):
    """A reply whose rows start mid-prompt of a prompt longer than int32 positions reach
    (`prompt_tokens` 2**40): one line, nothing written (positions used to wrap to 0, 1...)."""
    rng = np.random.default_rng(9)
    config = write_config(tmp_path / "model")
    made, _, _ = response(rng, 2, 3)
    made["meta_info"]["prompt_tokens"] = 2**40
    (tmp_path / "long.jsonl").write_text(json.dumps(made) + "\n")
    result = cli("traces", "import", tmp_path / "long.jsonl", "--out", tmp_path / "o",
                 "--config", config, ok=False)
    assert_one_line_error(result, "do not fit the trace's int32 pos (0..2147483647)")
    assert not any(tmp_path.glob("o/*.parquet*"))
