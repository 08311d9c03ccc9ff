"""Context first (#52 item 3): the KV cache llama.cpp allocates, worked out by hand from a
grouped-query, an MLA and a sliding-window config; `hardware new --model`, `solve` and `plan`
take `--ctx` / `--kv-type`, which set reserved_kv and the `-c` (and `-ctk`/`-ctv`) that
`export llamacpp` prints; a spec without a context keeps its old command.

Type sizes checked by hand against ggml (llama.cpp 0c1e5709, vendored in llama-cpp-python
0.3.36): `ggml/src/ggml-common.h` block_q8_0 = a ggml_half scale + QK8_0 (32) int8 = 34
bytes per 32 values, block_q4_0 = a ggml_half + QK4_0 / 2 (16) bytes = 18 bytes per 32;
`ggml/src/ggml.c` type_traits: f16 is one ggml_fp16_t, 2 bytes a value."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest
from cli_errors import assert_one_line_error
from tiny_pipeline import BOX, invoke

from placer.checkpoint.kv import KV_TYPES, kv_bytes, kv_layers
from placer.checkpoint.tiny import build_tiny_model
from placer.errors import PlacerError
from placer.hardware.spec import load_spec

ROUTING = Path(__file__).resolve().parent.parent.parent / "shared" / "data" / "routing"
MiB = 2**20

# Qwen3-30B-A3B's attention (its config.json): head_dim 128 given, not hidden / heads = 64.
QWEN3 = {"model_type": "qwen3_moe", "num_hidden_layers": 48, "hidden_size": 2048,
         "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
         "sliding_window": None, "use_sliding_window": False}


def test_ggml_type_sizes_are_the_gguf_packages():
    """Block sizes and bytes as ggml-common.h defines them, and as gguf-py's GGML_QUANT_SIZES
    (the table placer reads quantized tensors by) has them."""
    from traces.formats.ggml import block_sizes

    assert KV_TYPES["q8_0"] == (32, 2 + 32) and KV_TYPES["q4_0"] == (32, 2 + 16)
    assert KV_TYPES["f16"] == (1, 2)
    ggml = block_sizes()
    assert all(ggml[name.upper()] == size for name, size in KV_TYPES.items())


def test_grouped_query_attention_by_hand():
    # 4 KV heads x head_dim 128 = 512 values of K and 512 of V per token per layer
    assert kv_bytes(QWEN3, 8192, "f16") == 48 * 8192 * (512 + 512) * 2 == 805_306_368
    # q8_0: a row of 512 values is 16 blocks of 34 bytes = 544 bytes
    assert kv_bytes(QWEN3, 8192, "q8_0") == 48 * 8192 * (544 + 544) == 427_819_008
    # q4_0: 16 blocks of 18 bytes = 288 bytes
    assert kv_bytes(QWEN3, 8192, "q4_0") == 48 * 8192 * (288 + 288) == 226_492_416
    # K and V of different types (-ctk q8_0 -ctv q4_0)
    assert kv_bytes(QWEN3, 8192, "q8_0", v_type="q4_0") == 48 * 8192 * (544 + 288)
    # n_ctx is padded to a multiple of 256: 8000 tokens allocate 8192 cells
    assert kv_bytes(QWEN3, 8000, "f16") == kv_bytes(QWEN3, 8192, "f16")
    # without head_dim, the head is hidden / heads = 64 wide: half the bytes
    no_head = {k: v for k, v in QWEN3.items() if k != "head_dim"}
    assert kv_bytes(no_head, 8192, "f16") == 48 * 8192 * (4 * 64 * 2) * 2


def test_mla_caches_the_compressed_kv_and_the_rope_key_only():
    """DeepSeek-V2-Lite (27 layers, kv_lora_rank 512, qk_rope_head_dim 64): llama.cpp caches
    512 + 64 = 576 values of K per token per layer and no V (has_v = !is_mla)."""
    config = json.loads((ROUTING / "esft-deepseek-v2-lite" / "config.json").read_text())
    assert (config["num_hidden_layers"], config["kv_lora_rank"],
            config["qk_rope_head_dim"]) == (27, 512, 64)
    assert kv_bytes(config, 4096, "f16") == 27 * 4096 * (512 + 64) * 2 == 127_401_984
    # q8_0: 576 values = 18 blocks of 34 bytes = 612 bytes
    assert kv_bytes(config, 4096, "q8_0") == 27 * 4096 * 612 == 67_682_304
    # the same model as a GGUF describes it (conversion/deepseek.py: MQA of one KV head,
    # key_length 576, value_length 512, key_length_mla makes it MLA): the same bytes
    gguf = {"model_type": "deepseek2", "num_hidden_layers": 27, "gguf": {
        "deepseek2.block_count": 27, "deepseek2.embedding_length": 2048,
        "deepseek2.attention.head_count": 16, "deepseek2.attention.head_count_kv": 1,
        "deepseek2.attention.key_length": 576, "deepseek2.attention.value_length": 512,
        "deepseek2.attention.key_length_mla": 192, "deepseek2.attention.kv_lora_rank": 512}}
    assert kv_bytes(gguf, 4096, "q8_0") == kv_bytes(config, 4096, "q8_0")


def test_sliding_window_layers_hold_a_window_bounded_cache():
    """gpt-oss-20b: 24 layers, the even ones sliding (window 128), 8 KV heads x 64 = 512
    values of K and of V. llama_kv_cache_iswa: a sliding layer holds GGML_PAD(min(n_ctx,
    n_swa x n_seq_max + n_ubatch), 256) cells; llama-server's default is 4 sequences in one
    unified cache and n_ubatch 512: 128 x 4 + 512 = 1024 cells."""
    config = json.loads((ROUTING / "gptoss20b-decode" / "config.json").read_text())
    assert config["sliding_window"] == 128 and config["layer_types"][:2] == [
        "sliding_attention", "full_attention"]
    per_cell = (512 + 512) * 2  # f16 K and V
    full, sliding = 12 * 8192 * per_cell, 12 * 1024 * per_cell
    assert kv_bytes(config, 8192, "f16") == full + sliding == 226_492_416
    # one sequence (-np 1): 128 + 512 = 640, padded to 768 cells
    assert kv_bytes(config, 8192, "f16", parallel=1) == full + 12 * 768 * per_cell
    # -np 4 without a unified cache: 4 streams of 2048 cells, sliding 4 x pad(128 + 512)
    assert kv_bytes(config, 8192, "f16", unified=False) == full + 12 * 4 * 768 * per_cell
    # a context shorter than the window's cells: the sliding layers hold the context
    assert kv_bytes(config, 512, "f16") == 24 * 512 * per_cell
    # the GGUF's metadata: the window and gpt-oss's loader pattern (load_swa_pattern(ml, 2))
    gguf = {"model_type": "gpt-oss", "num_hidden_layers": 24, "gguf": {
        "gpt-oss.embedding_length": 2880, "gpt-oss.attention.head_count": 64,
        "gpt-oss.attention.head_count_kv": 8, "gpt-oss.attention.key_length": 64,
        "gpt-oss.attention.value_length": 64, "gpt-oss.attention.sliding_window": 128}}
    assert kv_layers(gguf) == kv_layers(config)
    # a head must be whole blocks (src/llama-context.cpp refuses the type): 2 heads of 16
    # values are 32 values of K, but no whole q8_0 block a head
    narrow = {**QWEN3, "num_key_value_heads": 2, "head_dim": 16}
    with pytest.raises(PlacerError, match="a head of 16 values"):
        kv_bytes(narrow, 256, "q8_0")
    assert kv_bytes(narrow, 256, "f16") == 48 * 256 * (32 + 32) * 2
    assert kv_bytes(gguf, 8192, "q8_0") == 12 * (8192 + 1024) * (544 + 544)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, prose) -> tuple[Path, Path]:
    """A tiny qwen3_moe (3 layers, 2 KV heads x head_dim 8: 32 values of K and V per token
    per layer) and 64 random tokens collected from it."""
    root = tmp_path_factory.mktemp("ctx")
    model = build_tiny_model("qwen3_moe", root / "model", texts=prose[:200])
    traces = root / "traces"
    done = invoke("collect", "--model", model, "--random-tokens", 64, "--max-length", 16,
                  "--out", traces, "--no-progress")
    assert done.exit_code == 0, done.output
    return model, traces


def tiny_kv(tokens: int, value_bytes: int = 2) -> int:
    """The tiny model's KV bytes by hand: 3 layers x cells x (16 + 16) values."""
    return 3 * tokens * (16 + 16) * value_bytes


def export_args(plan: Path) -> str:
    result = invoke("export", "llamacpp", plan, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)["args"]


def solve(model: Path, traces: Path, spec: Path | str, out: Path, *extra: object):
    return invoke("solve", "--model", model, "--hardware", spec, "--traces", traces,
                  "--offload", 0.5, "--solver", "greedy", "--steps", 16, "--out", out, *extra)


def test_hardware_new_reserves_the_models_dense_weights_and_kv(tiny, tmp_path):
    from placer.checkpoint.inventory import read_inventory

    model, traces = tiny
    dense = read_inventory(model).dense_bytes
    base = ("hardware", "new", "--card", "RTX 3060", "--pcie", "4.0x16", "--ram",
            "ddr4-3200x2", "--model", model)
    for extra, tokens in (((), 4096), (("--ctx", 1024), 1024)):
        out = tmp_path / f"box{tokens}.toml"
        done = invoke(*base, *extra, "--out", out)
        assert done.exit_code == 0, done.output
        data = tomllib.loads(out.read_text())
        assert data["context"] == {"tokens": tokens, "kv_type": "f16"}
        card = load_spec(out).cards[0]
        assert (card.reserved_dense, card.reserved_kv) == (dense, tiny_kv(tokens))
        assert f"reserved_kv: {tiny_kv(tokens)} bytes" in out.read_text()
        # computed, not estimated: the mark stays on the figures only a probe measures
        assert "card.reserved" not in load_spec(out).estimated
        assert "base_step_ms" in load_spec(out).estimated
    shown = invoke("hardware", "show", tmp_path / "box1024.toml")
    assert "context: 1024 tokens of f16 K and V" in shown.stdout
    again = tmp_path / "again.toml"  # the [context] table written back loads as it was
    again.write_text(invoke("hardware", "show", tmp_path / "box1024.toml", "--toml").stdout)
    assert load_spec(again) == load_spec(tmp_path / "box1024.toml")
    # the spec it wrote, solved and exported: -c is its context
    done = solve(model, traces, tmp_path / "box1024.toml", tmp_path / "plan.json")
    assert done.exit_code == 0, done.output
    assert export_args(tmp_path / "plan.json").endswith(" -c 1024")
    # without --model the shares stand (no context), and --ctx needs the model
    plain = invoke(*base[:-2])
    assert plain.exit_code == 0 and "[context]" not in plain.stdout
    assert tomllib.loads(plain.stdout)["card"]["reserved_dense"] == "1.75GiB"
    assert_one_line_error(invoke(*base[:-2], "--ctx", 1024), "--ctx", "give --model")


def test_solve_ctx_sets_reserved_kv_and_the_exports_c(tiny, tmp_path):
    model, traces = tiny
    old = tmp_path / "old.json"
    assert solve(model, traces, BOX, old).exit_code == 0
    assert load_spec(BOX).cards[0].reserved_kv == 0
    assert "-c" not in export_args(old).split()  # a spec without a context: as before
    new = tmp_path / "new.json"
    done = solve(model, traces, BOX, new, "--ctx", 1024, "--kv-type", "f32")
    assert done.exit_code == 0, done.output
    assert "context 1024 tokens, f32 K and V (--ctx/--kv-type): reserved_kv 192.00 KiB per card" \
        in done.stdout
    hardware = json.loads(new.read_text())["hardware"]
    # 4-byte values over 2 cards of equal VRAM
    assert [c["reserved_kv"] for c in hardware["cards"]] == [tiny_kv(1024, 4) // 2] * 2
    assert hardware["context"] == {"tokens": 1024, "kv_type": "f32"}
    assert export_args(new).endswith(" -c 1024 -ctk f32 -ctv f32")
    # a head of 8 values is no whole q8_0 block: refused, naming the type
    assert_one_line_error(solve(model, traces, BOX, tmp_path / "q.json", "--ctx", 1024,
                                "--kv-type", "q8_0"), "q8_0", "head of 8 values",
                          "32-value blocks")
    assert_one_line_error(solve(model, traces, BOX, tmp_path / "k.json", "--kv-type", "q8_0"),
                          "--kv-type", "--ctx")
    assert_one_line_error(solve(model, traces, BOX, tmp_path / "t.json", "--ctx", 512,
                                "--kv-type", "q3_k"), "--kv-type", "q4_0")
    # 8192 tokens of f32: 1.5 MiB per card, past the tiny box's 1 MiB of VRAM
    assert_one_line_error(solve(model, traces, BOX, tmp_path / "x.json", "--ctx", 8192,
                                "--kv-type", "f32"), "--ctx 8192", "exceed")


def test_plan_ctx_sets_reserved_kv_and_the_exports_c(tiny, tmp_path, prose):
    model, _ = tiny
    corpus = tmp_path / "prose.jsonl"
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in prose[:6]))
    out = tmp_path / "out"
    done = invoke("plan", "--model", model, "--corpus", corpus, "--hardware", BOX, "--out",
                  out, "--offload", 0.5, "--solver", "greedy", "--max-length", 16,
                  "--oracle-time-limit", 1, "--concurrency", "1", "--ctx", 512)
    assert done.exit_code == 0, done.output
    assert "context 512 tokens, f16 K and V (--ctx/--kv-type): reserved_kv 48.00 KiB per " \
        "card" in done.output
    hardware = json.loads((out / "plan.json").read_text())["hardware"]
    assert [c["reserved_kv"] for c in hardware["cards"]] == [tiny_kv(512) // 2] * 2
    assert export_args(out / "plan.json").endswith(" -c 512")


def test_a_spec_context_is_the_llamacpp_engines_c(tiny):
    """An --engine llamacpp plan takes -c from the spec's [context] (it was the tokens
    reserved_kv holds, which a spec of old keeps)."""
    import dataclasses

    from placer.checkpoint.inventory import read_inventory
    from placer.checkpoint.kv import Context
    from placer.plan.llamacpp import context_of

    inv = read_inventory(tiny[0])
    spec = load_spec(BOX)
    held = dataclasses.replace(spec, cards=tuple(
        dataclasses.replace(c, reserved_kv=tiny_kv(1024) // 2) for c in spec.cards))
    assert context_of(inv, held) == 1024
    assert context_of(inv, dataclasses.replace(spec, context=Context(3000, "q8_0"))) == 3000


def test_a_hybrid_models_linear_attention_layers_hold_no_kv() -> None:
    """Qwen3.5-35B-A3B (benchmarks/accuracy/configs): 40 layers, every 4th full attention;
    llama.cpp's hybrid memory gives KV to those 10 only (the 30 gated delta-net layers keep a
    fixed state per sequence). At 4096 tokens, f16: 10 x 4096 x (2 heads x 256) x 2 (K, V)
    x 2 bytes. It was 40 layers' worth, 4x too much."""
    from placer.checkpoint.config import read_config
    from placer.checkpoint.kv import kv_bytes

    root = Path(__file__).resolve().parent.parent
    config = read_config(root / "benchmarks" / "accuracy" / "configs" / "qwen3.5-35b-a3b.json")
    expected = 10 * 4096 * (2 * 256) * 2 * 2
    assert kv_bytes(config, 4096) == expected == 83_886_080
    by_interval = {k: v for k, v in config.items() if k != "layer_types"}
    assert kv_bytes(by_interval, 4096) == expected
    gguf = {"model_type": "qwen35moe", "num_hidden_layers": 40, "gguf": {
        "qwen35moe.embedding_length": 2048, "qwen35moe.attention.head_count": 16,
        "qwen35moe.attention.head_count_kv": 2, "qwen35moe.attention.key_length": 256,
        "qwen35moe.attention.value_length": 256}}
    assert kv_bytes(gguf, 4096) == expected  # the loader's default interval of 4
