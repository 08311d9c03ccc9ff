"""llama.cpp itself, run from placer (the side environment `make llama-env` builds):
routing recorded through llama.cpp equals the Hugging Face collector's on the same tokens,
and placer's replay of llama.cpp's expert cache (solvers/llamacpp/lru.py) equals the hits
and misses the real cache makes and logs (Vulkan; Mesa's software device here)."""

from __future__ import annotations

import glob
import json
import tomllib

import numpy as np
import pyarrow.parquet as pq
import pytest
from llamacpp_boxes import write_one_card_spec
from mixed_corpus import rendered_record, write_mixed_corpus

from placer.hardware.spec import parse_spec
from placer.plan.solve import host_of
from solvers.llamacpp.lru import LlamaCppCache, cache_groups, group_slots, log_stats
from traces.llamacpp.cache import run_cache

pytest_plugins = ["gguf_models", "fixtures_models"]

TOP_K = 2  # the tiny models' routers (placer.checkpoint.tiny.build_tiny_model's default)
NEAR_TIE = 1e-4  # router probabilities closer than this may order either way in float32


def rows(trace_dir):
    """All rows of the trace files in `trace_dir` (in tag order) and their experts [N, k]."""
    import pandas as pd

    table = pd.concat([pq.read_table(f).to_pandas()
                       for f in sorted(glob.glob(f"{trace_dir}/*.parquet"))], ignore_index=True)
    return table, np.stack(table.experts.values)


def router_probs(model, token_ids, layer):
    """[T, E] softmax of the Hugging Face router at `layer` for one sequence."""
    import torch

    with torch.inference_mode():
        out = model(input_ids=torch.tensor([list(token_ids)]), output_router_logits=True)
    return torch.softmax(out.router_logits[layer].float(), -1).reshape(len(token_ids), -1)


def test_collect_gguf_rows_equal_the_hugging_face_collectors(gguf_pair, tmp_path, placer_run,
                                                             trace_data):
    from transformers import AutoModelForCausalLM

    model, gguf = gguf_pair
    corpus = trace_data.prose_corpus(tmp_path / "prose.txt", blocks=24)
    common = ["--corpus", corpus, "--max-length", 48, "--no-progress", "--random-tokens", 40]
    placer_run("collect", "--gguf", gguf, "--tokenizer", model, "--out", tmp_path / "g",
               *common)
    placer_run("collect", "--model", model, "--batch-size", 6, "--out", tmp_path / "h", *common)
    g, ge = rows(tmp_path / "g")
    h, he = rows(tmp_path / "h")
    for column in ("pos", "token", "phase", "layer"):
        assert (g[column].values == h[column].values).all(), column
    same = (ge == he).all(axis=1)
    assert same.mean() >= 0.99, same.mean()
    assert not g.weights.notna().any()
    # the rest are near ties of the router, computed in another float order
    hf = AutoModelForCausalLM.from_pretrained(model).eval()
    for i in np.flatnonzero(~same):
        seq = g[(g.seq_id == g.seq_id[i]) & (g.layer == g.layer[i])]
        probs = router_probs(hf, seq.token.values, int(g.layer[i]))[int(g.pos[i])].numpy()
        gap = np.abs(np.sort(probs[ge[i]]) - np.sort(probs[he[i]]))
        assert gap.max() < NEAR_TIE, (i, ge[i], he[i], probs)


def test_collect_gguf_generate_mode_decodes_as_hugging_face(gguf_pair, tmp_path, placer_run,
                                                            trace_data):
    model, gguf = gguf_pair
    common = ["--corpus", trace_data.chat, "--mode", "generate", "--max-new-tokens", 5,
              "--max-tokens", 150, "--max-length", 32, "--no-progress"]
    placer_run("collect", "--gguf", gguf, "--tokenizer", model, "--out", tmp_path / "g",
               *common)
    placer_run("collect", "--model", model, "--batch-size", 1, "--out", tmp_path / "h",
               *common)
    g, ge = rows(tmp_path / "g")
    h, he = rows(tmp_path / "h")
    assert set(g.phase) == {"prefill", "decode"}
    # --max-tokens 150: exactly 150 tokens, one row per MoE layer each (the last sequence cut)
    assert len(g.drop_duplicates(["seq_id", "pos"])) == 150 == len(
        h.drop_duplicates(["seq_id", "pos"]))
    assert len(g) == 150 * g.layer.nunique()
    for column in ("pos", "token", "phase", "layer"):
        assert (g[column].values == h[column].values).all(), column
    assert (ge == he).all(axis=1).mean() >= 0.99


def test_collect_gguf_tokenizes_with_llama_cpp_by_default(gguf_pair, tmp_path, placer_run,
                                                          trace_data):
    """Without --tokenizer the GGUF's own vocabulary tokenizes: the same ids as the
    Hugging Face tokenizer it was converted from."""
    from transformers import AutoTokenizer

    model, gguf = gguf_pair
    corpus = trace_data.prose_corpus(tmp_path / "prose.txt", blocks=3)
    placer_run("collect", "--gguf", gguf, "--corpus", corpus, "--out", tmp_path / "g",
               "--no-progress")
    g, _ = rows(tmp_path / "g")
    tok = AutoTokenizer.from_pretrained(model)
    for block, seq in zip(trace_data.blocks()[40:43], g.seq_id.unique(), strict=True):
        ids = g[(g.seq_id == seq) & (g.layer == 0)].token.tolist()
        assert ids == tok(block)["input_ids"][:512]


def test_collect_gguf_reads_a_jsonl_mixing_text_messages_and_turns(gguf_pair, tmp_path,
                                                                  placer_run, trace_data):
    """Each line its own form (issue 51, item 4), through llama.cpp as through Hugging Face:
    the same tokens (text, or the chat template's rendering) and the same experts. (Without
    --tokenizer, llama.cpp renders only its built-in templates, and the tiny model's is not
    one: a chat line is then refused, mixed file or not.)"""
    from transformers import AutoTokenizer

    model, gguf = gguf_pair
    corpus, records = write_mixed_corpus(tmp_path / "mixed.jsonl", trace_data)
    common = ["--corpus", corpus, "--max-length", 32, "--no-progress"]
    placer_run("collect", "--gguf", gguf, "--tokenizer", model, "--out", tmp_path / "g", *common)
    placer_run("collect", "--model", model, "--out", tmp_path / "h", *common)
    g, ge = rows(tmp_path / "g")
    h, he = rows(tmp_path / "h")
    for column in ("pos", "token", "phase", "layer"):
        assert (g[column].values == h[column].values).all(), column
    assert (ge == he).all(axis=1).mean() >= 0.99
    assert g.seq_id.nunique() == len(records)
    tok = AutoTokenizer.from_pretrained(model)
    for record, seq in zip(records, g.seq_id.unique(), strict=True):
        ids = g[(g.seq_id == seq) & (g.layer == g.layer.min())].token.tolist()
        assert ids == rendered_record(record, tok)[:32]


def test_collect_gguf_without_the_side_environment_says_make_llama_env(
        gguf_pair, tmp_path, placer_run, trace_data, monkeypatch):
    monkeypatch.setenv("PLACER_LLAMA_PYTHON", str(tmp_path / "missing" / "python"))
    corpus = trace_data.prose_corpus(tmp_path / "prose.txt", blocks=2)
    result = placer_run("collect", "--gguf", gguf_pair[1], "--corpus", corpus, "--out",
                        tmp_path / "out", "--no-progress", ok=False)
    assert result.exit_code == 1
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "make llama-env" in lines[0]
    assert not (tmp_path / "out").exists()


def test_replay_equals_the_real_llama_cpp_cache(gguf_pair, trace_data):
    """The real cache (3 layers of f32 experts in host memory, one group, 10 slots of 24)
    on two sequences: a 12-token prompt (a fetch of a 9..32-token ubatch), 9 decode steps,
    a 40-token prompt (too large: the cache is only read) and 5 more decode steps."""
    from transformers import AutoTokenizer

    model, gguf = gguf_pair
    tok = AutoTokenizer.from_pretrained(model)
    text = " ".join(trace_data.blocks()[60:64])
    ids = tok(text)["input_ids"]
    expert_bytes = 32 * 16 * 4  # hidden x moe_intermediate f32: gate, up and down alike
    cache_bytes = 3 * expert_bytes * 11 + 100  # 10 slots and the extra one
    run = run_cache(str(gguf), [(ids[:12], 10), (ids[12:52], 6)], cache_bytes, TOP_K)
    groups = cache_groups([0] * 3, [("f32", (expert_bytes,) * 3)] * 3, 8)
    slots = group_slots(cache_bytes, groups, TOP_K, alignment=run.alignment)
    assert run.slots == [(3, "f32", int(slots[0]))] and slots[0] == 10

    cache = LlamaCppCache(groups, slots, TOP_K)
    replay = cache.replay(run.padded(), held=True)
    real = iter(run.fetches)
    for s, ubatch in enumerate(run.ubatches):
        for layer in range(3):
            assert replay.used[s, layer] == (len(ubatch) <= 12), (s, layer)
            if not replay.used[s, layer]:
                continue
            fetch = next(real)
            assert fetch["layer"] == layer
            held = np.flatnonzero(replay.held[s, layer]).tolist()
            assert fetch["hits"] == [e for e in fetch["experts"] if e in held], (s, layer)
            assert replay.hits[s, layer] == len(fetch["hits"])
            assert replay.misses[s, layer] == len(fetch["experts"]) - len(fetch["hits"])
    assert next(real, None) is None
    assert replay.hits.sum() > 0 and replay.misses[1:].sum() > 0  # evictions happened
    sizes = np.array([len(u) for u in run.ubatches])
    expected = log_stats(replay, sizes, groups)
    for name, (hits, misses, uploaded) in expected.items():
        if hits + misses:
            assert run.totals[name][:2] == (hits, misses), name
            assert f"{run.totals[name][2]:.2f}" == f"{uploaded / 2**20:.2f}"  # as %.2f


# a fast host probe: an 8 MiB copy, a 64-row matmul, one Q4_K-sized expert at three counts
PROBE = ("probe", "--host", "--mb", "8", "--tokens", "64", "--expert", "256x512",
         "--expert-tokens", "1,4,16")


@pytest.mark.usefixtures("quick_host_probe")
def test_probe_host_times_gguf_experts_with_llama_cpp_kernels(cli):
    """`probe --host --gguf-type Q4_K`: the curve of llama.cpp's own CPU kernels for Q4_K
    experts, a valid `[[host.expert]]` table the spec and the cpu model read back (at Q4_K's
    bytes: 144 bytes a block of 256 weights)."""
    text = cli(*PROBE, "--gguf-type", "Q4_K").stdout
    assert "llama.cpp b11669 CPU kernels" in text
    data = {"name": "box", "cards": 1,
            "card": {"vram": "24GiB", "h2d_bandwidth": "25GB/s", "latency_us": 10},
            "decode": {"base_step_ms": {"1": 10.0}}, **tomllib.loads(text)}
    (timing,) = parse_spec(data).host.expert
    assert (timing.hidden, timing.inter, timing.dtype, timing.tokens) == (256, 512, "Q4_K",
                                                                           (1, 4, 16))
    assert all(b >= a > 0 for a, b in zip(timing.seconds, timing.seconds[1:], strict=False))
    assert timing.expert_bytes == 3 * 256 * 512 // 256 * 144
    assert host_of(parse_spec(data), 64).curves[0].expert_bytes == timing.expert_bytes


def test_probe_host_gguf_type_refusals_are_one_line(cli):
    for args, says in (((*PROBE, "--gguf-type", "Q9_Z"), "expected a GGUF type"),
                       (("probe", "--host", "--mb", "8", "--tokens", "64", "--expert", "64x32",
                         "--gguf-type", "Q4_K"), "multiples of 256"),
                       (("probe", "--gguf-type", "Q4_K"), "goes with --host")):
        result = cli(*args, ok=False)
        lines = result.output.strip().splitlines()
        assert result.exit_code == 1 and len(lines) == 1 and says in lines[0], result.output


def test_hf_to_gguf_to_collect_solve_and_export_end_to_end(gguf_pair, tmp_path, placer_run,
                                                           trace_data):
    """The issue's path: a tiny Hugging Face MoE, converted by llama.cpp's converter, its
    routing recorded through llama.cpp, planned for llama.cpp and exported as the command."""
    model, gguf = gguf_pair
    traces = tmp_path / "traces"
    placer_run("collect", "--gguf", gguf, "--tokenizer", model, "--corpus", trace_data.chat,
               "--mode", "generate",
               "--max-new-tokens", 8, "--max-length", 24, "--max-tokens", 300, "--out", traces,
               "--no-progress")
    g, _ = rows(traces)
    assert {"prefill", "decode"} == set(g.phase)
    expert = 3 * 32 * 16 * 4  # f32 gate, up and down of one expert
    # room for the experts of one of the three layers
    spec = write_one_card_spec(tmp_path / "box.toml", 8 * expert + 1000)
    plan = tmp_path / "plan.json"
    placer_run("solve", "--engine", "llamacpp", "--model", gguf, "--hardware", spec,
               "--traces", traces, "--concurrency", "1,4", "--out", plan)
    engine = json.loads(plan.read_text())["engine"]
    assert len(engine["host_layers"]) == 2
    line = placer_run("export", "llamacpp", plan, "--model", gguf).output.strip().splitlines()
    flags = line[-1].split()
    assert flags[:5] == ["llama-server", "-m", str(gguf), "-ngl", "all"]
    host = ("-ncmoe", str(engine["n_cpu_moe"])) if engine["n_cpu_moe"] else (
        "-ot", "'blk\\.(" + "|".join(map(str, engine["host_layers"]))
        + ")\\.ffn_(up|down|gate|gate_up)_(ch|)exps=CPU'")
    cache = ("--moe-cache-mib", str(engine["moe_cache_mib"])) if engine["moe_cache_mib"] else ()
    assert flags[5:] == [*host, *cache]
