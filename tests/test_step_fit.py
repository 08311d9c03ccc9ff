"""Issue 52 items 1 and 5: the decode step estimated from a fit to published llama.cpp
measurements (placer/hardware/step_fit.py, backends.py), reproducible from its sources; the
card table covering every card they measured; a spec's backend and its largest allocation
capping a llama.cpp cache."""

from __future__ import annotations

import dataclasses
import json
import re
import sys
import tomllib
from pathlib import Path

import pytest
from llamacpp_tiny import load, one_card, solve, tiny_gguf, tiny_traces
from tiny_pipeline import invoke

from placer.checkpoint.step import step_ms
from placer.checkpoint.tiny import build_tiny_model
from placer.hardware.backends import FIT_TABLE, backends, fit_for, fit_rows
from placer.hardware.cards import card
from placer.hardware.step_fit import GIB, LAYERS, fit_table, read_runs

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))
from fit_step import RESEARCH, fitted  # noqa: E402


def test_refitting_the_published_runs_gives_the_shipped_constants() -> None:
    text, left = fitted()
    shipped = (REPO / "placer" / "hardware" / FIT_TABLE).read_text(encoding="utf-8")
    assert text == shipped
    assert {r.backend for r in fit_rows()} == set(backends())  # every backend has a fit
    # the ambiguous cards stay out, by name, with the research's reason
    names = dict(left)
    assert "AMBIGUOUS" in names["A100 80 GB"] and "ASSUMED SXM5" in names["H100 80 GB"]
    assert "Apple M3" in names  # its row reads 1.01 of its bandwidth


def test_docs_show_the_shipped_fit() -> None:
    """docs/hardware.md's table of how well the fit reproduces its sources is the shipped
    fit's, line for line."""
    docs = (REPO / "docs" / "hardware.md").read_text(encoding="utf-8")
    for line in fit_table(fit_rows()).splitlines():
        assert line in docs, line


def test_the_card_table_covers_every_card_the_sources_measured() -> None:
    """Every scoreboard card not left out, and every MoE run's card, is in the table."""
    runs, left = read_runs((RESEARCH / "dense_scoreboard.csv").read_text(encoding="utf-8"),
                           (RESEARCH / "cards.csv").read_text(encoding="utf-8"))
    assert len({r.card.name for r in runs}) >= 70
    for name in ("Radeon PRO W7900", "Instinct MI100", "RTX A4000", "Quadro RTX 8000",
                 "Arc B580", "Apple M2 Max", "RX 9070 XT", "RTX 2080", "RX 6950 XT"):
        found = card(name)
        assert found is not None, name
        assert "NOT re-fetched" in found.source  # the research's caveat, kept
    assert card("A100 80 GB") is None and card("apple-m3-max-36gb") is None


@pytest.mark.parametrize("label, backend", [
    ("RTX 3060", "CUDA"), ("RTX 4090", "CUDA"), ("RX 7900 XTX", "ROCm"),
    ("Intel Arc B580", "Vulkan"), ("apple-m1-max-32gb", "Metal")])
def test_a_scoreboard_run_lies_within_its_estimates_range(label: str, backend: str) -> None:
    runs, _ = read_runs((RESEARCH / "dense_scoreboard.csv").read_text(encoding="utf-8"),
                        (RESEARCH / "cards.csv").read_text(encoding="utf-8"))
    run = next(r for r in runs if r.label.endswith(label) and r.read_bytes < 4 * GIB
               and r.backend == backend.lower())
    fit = fit_for(run.card, run.backend).step_fit()
    estimate = step_ms(run.read_bytes, LAYERS, run.card.bandwidth, fit)
    assert fit.spread[0] * estimate <= 1e3 / run.tok_s <= fit.spread[1] * estimate
    assert fit.spread != (1.0, 1.0) and fit.layer_us > 0


def test_the_issues_rtx_3060_tiny_model_step_has_a_layers_cost(tmp_path: Path,
                                                              prose: list[str]) -> None:
    """`hardware new --card "RTX 3060" --model` set 0.02287 ms (the weights at the card's
    full bandwidth); now each layer's fitted cost is in it and the spread is written."""
    model = build_tiny_model("qwen3_moe", tmp_path / "model", texts=prose[:50], layers=6)
    box = tmp_path / "box.toml"
    made = invoke("hardware", "new", "--card", "RTX 3060", "--pcie", "4.0x16", "--ram",
                  "ddr4-3200x2", "--model", model, "--out", box)
    assert made.exit_code == 0, made.output
    data = tomllib.loads(box.read_text())
    fit = fit_for(card("RTX 3060"), "cuda")
    step = data["decode"]["base_step_ms"]["1"]
    assert step >= 6 * fit.layer_us / 1e3 > 0.02
    assert data["decode"]["spread"] == list(fit.spread)
    assert "base_step_ms" in data["estimated"] and data["card"]["backend"] == "cuda"
    assert "cuda fit for a gddr card" in made.stderr
    metal = invoke("hardware", "new", "--card", "RTX 3060", "--pcie", "4.0x16", "--ram",
                   "ddr4-3200x2", "--model", model, "--backend", "vulkan")
    assert metal.exit_code == 0, metal.output
    assert 'backend = "vulkan"' in metal.stdout and "vulkan fit" in metal.stderr


def test_default_backend_by_vendor_and_an_unknown_one_is_one_line() -> None:
    for name, want in (("RX 7900 XTX", "rocm"), ("Apple M2 Max", "metal"),
                       ("Arc B580", "vulkan"), ("RTX 4090", "cuda")):
        made = invoke("hardware", "new", "--card", name, "--pcie", "4.0x16", "--ram",
                      "ddr5-6000x2")
        assert made.exit_code == 0, made.output
        assert f'backend = "{want}"' in made.stdout
    bad = invoke("hardware", "new", "--card", "RTX 3060", "--pcie", "4.0x16", "--ram",
                 "ddr5-6000x2", "--backend", "opencl")
    assert bad.exit_code != 0 and "--backend: unknown backend 'opencl'" in bad.output
    assert len(bad.output.strip().splitlines()) == 1


def test_probe_step_estimate_uses_the_specs_backend_fit(tmp_path: Path,
                                                        prose: list[str]) -> None:
    model = build_tiny_model("qwen3_moe", tmp_path / "model", texts=prose[:50])
    box = tmp_path / "box.toml"
    assert invoke("hardware", "new", "--card", "RX 7900 XTX", "--pcie", "4.0x16", "--ram",
                  "ddr5-6000x2", "--out", box).exit_code == 0
    out = tmp_path / "stepped.toml"
    result = invoke("probe", "--step", "--estimate", "--model", model, "--hardware", box,
                    "--out", out, "--json")
    assert result.exit_code == 0, result.output
    fit = fit_for(card("RX 7900 XTX"), "rocm")
    assert "rocm fit, gddr tier" in json.loads(result.stdout)["how"]
    written = tomllib.loads(out.read_text())
    assert written["decode"]["spread"] == list(fit.spread)
    assert "base_step_ms" in written["estimated"]


def test_no_plan_gives_a_vulkan_card_a_cache_above_its_largest_allocation(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The tiny GGUF's cache is a few MiB: its backend's limit is set to 1 MiB here (the
    shipped Vulkan one is 2048 MiB) so that the limit, not the card, binds."""
    import placer.hardware.backends as known

    shipped = known.backends()
    assert shipped["vulkan"].max_alloc_mib == 2048
    limited = {**shipped, "vulkan": dataclasses.replace(shipped["vulkan"], max_alloc_mib=1)}
    monkeypatch.setattr(known, "backends", lambda: limited)
    model = tiny_gguf(tmp_path)
    traces = tiny_traces(tmp_path, model)
    caches = {}
    for name in ("cuda", "vulkan"):
        spec = one_card(tmp_path, 3)
        spec.write_text(spec.read_text().replace("[decode]", f'backend = "{name}"\n[decode]'))
        plan, _ = solve(tmp_path, model, traces, spec, out=f"{name}.json")
        engine = load(plan)["engine"]
        caches[name] = [engine["moe_cache_mib"], *(o["moe_cache_mib"] for o in engine["options"])]
    assert max(caches["cuda"]) > 1  # the card's room alone gives more
    assert max(caches["vulkan"]) == 1
    d = load(tmp_path / "vulkan.json")
    option = next(i for i, o in enumerate(d["engine"]["options"]) if o["moe_cache_mib"])
    d["engine"]["options"][option]["moe_cache_mib"] = 2
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(d))
    result = invoke("export", "llamacpp", bad, "--out", tmp_path / "x.sh")
    assert result.exit_code != 0
    line = result.output.strip()
    assert len(line.splitlines()) == 1
    assert re.search(rf"engine\.options\[{option}\]\.moe_cache_mib: 2 MiB of cache puts 2 "
                     r"MiB on card 0, above its vulkan backend's largest allocation \(1 MiB",
                     line), line


def large_vocab_step_ms(tmp_path: Path, vocab: int, tied: bool) -> float:
    """`hardware new --card "RTX 3060" --config` of a small qwen3_moe (bf16, hidden 256) with
    `vocab` tokens: its estimated step at batch 1."""
    config = {"model_type": "qwen3_moe", "architectures": ["Qwen3MoeForCausalLM"],
              "torch_dtype": "bfloat16", "vocab_size": vocab, "hidden_size": 256,
              "intermediate_size": 512, "moe_intermediate_size": 128, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
              "num_experts": 8, "num_experts_per_tok": 2, "decoder_sparse_step": 1,
              "mlp_only_layers": [], "tie_word_embeddings": tied,
              "max_position_embeddings": 4096}
    path = tmp_path / f"config-{vocab}-{tied}.json"
    path.write_text(json.dumps(config))
    out = tmp_path / f"box-{vocab}-{tied}.toml"
    made = invoke("hardware", "new", "--card", "RTX 3060", "--pcie", "4.0x16", "--ram",
                  "ddr4-3200x2", "--config", path, "--ctx", "256", "--out", out)
    assert made.exit_code == 0, made.output
    return tomllib.loads(out.read_text())["decode"]["base_step_ms"]["1"]


def test_a_decode_step_reads_one_row_of_the_token_embedding_table(tmp_path: Path) -> None:
    """A decode token reads its one row of the embedding table, the output head whole: with
    a 262,144-token vocabulary, 256 wide in bf16 (a 134 MB table), the step grows over a
    1,024-token one's by the head alone (it grew by the table and the head: twice); with
    tied embeddings the table is the head, read whole once."""
    fit = fit_for(card("RTX 3060"), "cuda")
    table = (262144 - 1024) * 256 * 2  # bytes the larger table and head each add
    one_pass_ms = table / (fit.share * card("RTX 3060").bandwidth) * 1e3
    for tied in (False, True):
        grown = (large_vocab_step_ms(tmp_path, 262144, tied)
                 - large_vocab_step_ms(tmp_path, 1024, tied))
        assert abs(grown - one_pass_ms) < 0.002 * one_pass_ms, (tied, grown, one_pass_ms)


def test_the_fit_reads_llama_7b_without_its_embedding_tables_other_rows() -> None:
    """Each scoreboard run's bytes a token: the file less the 32,000 x 4,096 table's other
    rows in the file's type (Q4_0: 18 bytes a 32-weight block, Q8_0: 34, F16: 2 a weight)."""
    runs, _ = read_runs((RESEARCH / "dense_scoreboard.csv").read_text(encoding="utf-8"),
                        (RESEARCH / "cards.csv").read_text(encoding="utf-8"))
    rows = 31999 * 4096
    assert {round(r.read_bytes) for r in runs} == {
        round(3.56 * GIB - rows * 18 / 32), round(6.67 * GIB - rows * 34 / 32),
        round(12.55 * GIB - rows * 2)}
