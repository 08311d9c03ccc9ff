"""Claims on routing recorded from a trained model (OLMoE, tests/data/olmoe/README.md).

OLMoE routes c4 and github text very differently. A plan solved on c4 alone, at half the
expert bytes on the host, is predicted worse than layer offload on github at B = 1: evaluate
must say so (the whole 95% interval of the stall ratio above 1), and a --robust plan over
c4 and github must not be worse there. Counts have no tokens: both commands sample the same
4096 steps from the frequencies (same seed), so the robust plan's guard holds exactly.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

DATA = Path(__file__).resolve().parent / "data" / "olmoe"
CONFIG = {  # OLMoE-1B-7B's shape, its three recorded layers as a three-layer model
    "architectures": ["OlmoeForCausalLM"], "model_type": "olmoe", "num_hidden_layers": 3,
    "hidden_size": 2048, "intermediate_size": 1024, "num_experts": 64,
    "num_experts_per_tok": 8, "num_attention_heads": 16, "num_key_value_heads": 16,
    "vocab_size": 50304, "torch_dtype": "bfloat16"}
BOX = """name = "one-card"
cards = 1
[card]
vram = "8GiB"
h2d_bandwidth = "25GB/s"
latency_us = 10.0
[decode]
base_step_ms = { 1 = 10.0 }
"""
STEPS = ["--steps", "4096"]


@pytest.fixture(scope="module")
def olmoe(tmp_path_factory: pytest.TempPathFactory, cli) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("olmoe")
    (root / "config.json").write_text(json.dumps(CONFIG))
    (root / "box.toml").write_text(BOX)
    out = {"root": root}
    for domain in ("c4", "github"):
        out[domain] = root / domain
        cli("traces", "import", DATA / f"{domain}.npy", "--format", "counts", "--top-k", "8",
            "--out", out[domain], "--tag", domain)
    common = ["--config", root / "config.json", "--hardware", root / "box.toml",
              "--offload", "0.5", "--concurrency", "1", "--time-limit", "20", *STEPS]
    out["plain"] = root / "c4.json"
    cli("solve", *common, "--traces", out["c4"], "--out", out["plain"])
    out["robust"] = root / "robust.json"
    cli("solve", *common, "--traces", out["c4"], "--traces", out["github"], "--robust",
        "--out", out["robust"])
    return out


def github_row(cli, olmoe: dict[str, Path], plan: str) -> dict:
    report = json.loads(cli("evaluate", olmoe[plan], "--traces", olmoe["github"], *STEPS,
                            "--oracle-time-limit", "10", "--json").output)
    (row,) = report["results"]
    return row


def test_a_c4_plan_is_flagged_worse_than_layer_offload_on_github(olmoe, cli):
    row = github_row(cli, olmoe, "plain")
    low, high = row["ratio_to_layer_ci95"]
    assert row["ratio_to_layer"] > 1.0 and low > 1.0, row["ratio_to_layer_ci95"]
    assert row["verdict"] == "worse"
    text = cli("evaluate", olmoe["plain"], "--traces", olmoe["github"], *STEPS,
               "--oracle-time-limit", "10").output
    assert "WARNING" in text


def test_the_robust_plan_is_not_worse_on_github(olmoe, cli):
    row = github_row(cli, olmoe, "robust")
    assert row["ratio_to_layer"] <= 1.0 + 1e-9
    assert row["verdict"] != "worse"
    plain = github_row(cli, olmoe, "plain")
    assert row["placement"]["stall_ms_per_step"] < plain["placement"]["stall_ms_per_step"]
