"""A plugin fixture (tests name it in `pytest_plugins`): `bench_plan`, a llama.cpp plan of a
3 MiB card solved from routing llama.cpp recorded on the tiny bench GGUF, and its prompts;
session-scoped, so test_llamacpp_bench and test_llamacpp_server build it once per worker."""

from __future__ import annotations

import pytest
from llamacpp_boxes import write_one_card_spec


@pytest.fixture(scope="session")
def bench_plan(gguf_bench, tmp_path_factory, trace_data):
    """(plan.json, GGUF, prompts.txt): a plan of a 3 MiB card (one of the three MoE layers'
    experts on the host at the least, a cache of up to 3 MiB) from routing llama.cpp
    recorded, and 5 prose prompts."""
    from fixtures_models import invoke

    model, gguf = gguf_bench
    root = tmp_path_factory.mktemp("llbench")
    invoke("collect", "--gguf", gguf, "--tokenizer", model, "--corpus", trace_data.chat,
           "--mode", "generate", "--max-new-tokens", 8, "--max-length", 24, "--max-tokens",
           300, "--out", root / "traces", "--no-progress")
    spec = write_one_card_spec(root / "box.toml", 3 * 2**20)
    plan = root / "plan.json"
    invoke("solve", "--engine", "llamacpp", "--model", gguf, "--hardware", spec, "--traces",
           root / "traces", "--concurrency", "1,4", "--out", plan)
    prompts = trace_data.prose_corpus(root / "prompts.txt", blocks=5, start=90)
    return plan, gguf, prompts
