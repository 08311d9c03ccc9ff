"""A plugin fixture (tests name it in `pytest_plugins`): the tiny qwen3_moe of the motivating
regression, its traces on prose, held-out prose, chat and random tokens, and three plans
solved from them; built once per test run (once_per_run.py) for the modules that read it
(test_regression_case, test_export)."""

from __future__ import annotations

from pathlib import Path

import pytest
from once_per_run import once_per_run

from placer.checkpoint.tiny import build_tiny_model

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "examples" / "data"
BOX = REPO / "examples" / "tiny-box.toml"


@pytest.fixture(scope="session")
def setup(tmp_path_factory: pytest.TempPathFactory, cli) -> dict[str, Path]:
    return once_per_run(tmp_path_factory, "regression", lambda root: build_setup(root, cli))


def build_setup(root: Path, cli) -> dict[str, Path]:
    texts = [b for b in (DATA / "shakespeare_head.txt").read_text().split("\n\n") if b.strip()]
    model = build_tiny_model("qwen3_moe", root / "model", texts=texts, layers=4, experts=16,
                             top_k=2, hidden=64, router_scale=4.0)
    sources = {"calib": ["--corpus", DATA / "shakespeare_head.txt"],
               "held": ["--corpus", DATA / "shakespeare_tail.txt"],
               "chat": ["--corpus", DATA / "vicuna_bench_questions.jsonl"],
               "random": ["--random-tokens", "3000"]}
    out = {"model": model}
    for name, src in sources.items():
        out[name] = root / name
        cli("collect", "--model", model, *src, "--out", out[name], "--max-tokens", "4000",
            "--max-length", "128", "--batch-size", "16")
    common = ["--model", model, "--hardware", BOX, "--offload", "0.5", "--concurrency", "1,8",
              "--time-limit", "2", "--steps", "128"]
    out["plan"] = root / "plan.json"
    cli("solve", *common, "--traces", out["calib"], "--solver", "ilp", "--out", out["plan"])
    out["robust"] = root / "robust.json"
    cli("solve", *common, "--traces", out["calib"], "--traces", out["random"], "--robust",
        "--out", out["robust"])
    out["cached"] = root / "cached.json"  # every calibration token, in order: a cache split
    # of 8 slots per card (auto picks the static candidate here since slots no longer double
    # as staging: docs/cache-split.md, the budget rule)
    cli("solve", *common[:-2], "--traces", out["calib"], "--cache", "8", "--out", out["cached"])
    return out
