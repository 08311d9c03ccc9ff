"""A plugin fixture (tests name it in `pytest_plugins`): `bench_plan`, a llama.cpp plan of a
3 MiB card solved from routing llama.cpp recorded on the tiny bench GGUF, and its prompts;
built once per test run (once_per_run.py) for test_llamacpp_bench and test_llamacpp_server."""

from __future__ import annotations

from pathlib import Path

import pytest
from llamacpp_boxes import write_one_card_spec
from once_per_run import once_per_run


@pytest.fixture(scope="session")
def bench_plan(gguf_bench, tmp_path_factory, trace_data):
    """(plan.json, GGUF, prompts.txt): a plan of a 3 MiB card (one of the three MoE layers'
    experts on the host at the least, a cache of up to 3 MiB) from routing llama.cpp
    recorded, and 5 prose prompts."""
    return once_per_run(tmp_path_factory, "llbench",
                        lambda root: build_bench_plan(root, gguf_bench, trace_data))


def build_bench_plan(root: Path, gguf_bench, trace_data) -> tuple[Path, Path, Path]:
    from fixtures_models import invoke

    model, gguf = gguf_bench
    invoke("collect", "--gguf", gguf, "--tokenizer", model, "--corpus", trace_data.chat,
           "--mode", "generate", "--max-new-tokens", 8, "--max-length", 24, "--max-tokens",
           300, "--out", root / "traces", "--no-progress")
    spec = write_one_card_spec(root / "box.toml", 3 * 2**20)
    plan = root / "plan.json"
    invoke("solve", "--engine", "llamacpp", "--model", gguf, "--hardware", spec, "--traces",
           root / "traces", "--concurrency", "1,4", "--out", plan)
    prompts = trace_data.prose_corpus(root / "prompts.txt", blocks=5, start=90)
    return plan, gguf, prompts
