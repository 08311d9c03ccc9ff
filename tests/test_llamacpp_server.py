"""`placer bench --engine llamacpp --server`: the user's own llama-server, started by placer
on 127.0.0.1 with each option's flags, its timings read from its /completion responses,
stopped after. The server is a real one: llama-server built once per machine from the
llama.cpp llama-cpp-python 0.3.36 vendors (`make llama-server`, CPU backend; a build without
the expert cache, so the options run here are those without one, and a cached option is
refused in one line). PLACER_LLAMA_SERVER names another binary."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from test_llamacpp_bench import children

pytest_plugins = ["gguf_models", "fixtures_models", "llamacpp_bench_plan"]

REPO = Path(__file__).resolve().parent.parent
SERVER = Path(os.environ.get("PLACER_LLAMA_SERVER")
              or REPO / ".venv-llama" / "bin" / "llama-server")

pytestmark = pytest.mark.skipif(not SERVER.is_file(),
                                reason=f"no llama-server at {SERVER}: run `make llama-server`")


def server_processes() -> list[str]:
    """Processes running the server binary (none may be left)."""
    out = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and (proc / "exe").resolve() == SERVER.resolve():
                out.append(proc.name)
        except OSError:
            continue
    return out


def test_bench_llamacpp_on_a_real_llama_server(bench_plan, placer_run):
    plan, gguf, prompts = bench_plan
    result = placer_run("bench", "--engine", "llamacpp", plan, "--model", gguf, "--prompts",
                        prompts, "--server", f"{SERVER} -m {gguf}", "--options",
                        "chosen,ncmoe,cmoe", "--trials", 3, "--max-new-tokens", 2,
                        "--max-prompt-tokens", 4, "--threads", 1, "--json")
    report = json.loads(result.stdout)
    assert report["driver"] == "server" and report["build"].startswith("version")
    assert [r["option"] for r in report["options"]] == ["chosen", "ncmoe", "cmoe"]
    for r in report["options"]:
        low, high = r["measured_tokens_per_s_ci95"]
        assert 0 < low <= r["measured_tokens_per_s"] <= high
        assert r["predicted_tokens_per_s"] > 0 and r["cache"] is None
    assert not server_processes() and not children()


def test_a_flag_the_server_lacks_is_one_line_before_it_starts(bench_plan, placer_run):
    plan, gguf, prompts = bench_plan
    cached = next(r["name"] for r in json.loads(plan.read_text())["engine"]["options"]
                  if r["moe_cache_mib"])
    result = placer_run("bench", "--engine", "llamacpp", plan, "--model", gguf, "--prompts",
                        prompts, "--server", f"{SERVER} -m {gguf}", "--options", cached,
                        ok=False)
    lines = result.output.strip().splitlines()
    assert result.exit_code == 1 and len(lines) == 1, result.output
    assert "does not take --moe-cache-mib" in lines[0]
    assert not server_processes()
