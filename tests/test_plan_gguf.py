"""`placer plan` on a GGUF, end to end through llama.cpp itself (`make llama-env`): collect,
split, solve for llama.cpp, evaluate and export, once where the choice caches experts (a slow
host CPU, a fast link) and once where it does not (a fast CPU). `run.sh` names the user's
GGUF, and every follow-up command the output prints runs as printed, from where plan ran."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
from cli_errors import assert_one_line_error
from llamacpp_boxes import write_one_card_spec
from tiny_pipeline import invoke

from placer.plan.placement import read_plan

pytest_plugins = ["gguf_models"]

CARD = 3 * 2**20  # one of the bench GGUF's three MoE layers of 1.5 MiB on the host at least


@pytest.fixture(scope="module")
def user(gguf_bench, prose, tmp_path_factory) -> Path:
    """A folder holding the user's GGUF (model.gguf), a corpus and two specs of one 3 MiB
    card: fast.toml (a 50 GB/s host CPU: host layers beat a cache) and slow.toml (a 0.2 GB/s
    host CPU over a 50 GB/s link: the cache pays)."""
    root = tmp_path_factory.mktemp("plan-gguf")
    (root / "model.gguf").symlink_to(gguf_bench[1])
    (root / "prose.jsonl").write_text("".join(json.dumps({"text": t}) + "\n"
                                              for t in prose[:12]))
    write_one_card_spec(root / "fast.toml", CARD)
    slow = write_one_card_spec(root / "slow.toml", CARD).read_text()
    slow = (slow.replace('memory_bandwidth = "50GB/s"', 'memory_bandwidth = "0.2GB/s"')
            .replace('flops = "1TFLOPS"', 'flops = "2GFLOPS"')
            .replace('h2d_bandwidth = "10GB/s"', 'h2d_bandwidth = "50GB/s"'))
    (root / "slow.toml").write_text(slow)
    return root


def plan(spec: str, out: str, *extra: object):
    return invoke("plan", "--model", "model.gguf", "--corpus", "prose.jsonl", "--hardware",
                  spec, "--out", out, "--max-length", 24, "--concurrency", "1,4", *extra)


@pytest.mark.parametrize(("spec", "cached"), [("slow.toml", True), ("fast.toml", False)])
def test_plan_on_a_gguf_runs_end_to_end_and_its_follow_ups_run_as_printed(
        user, spec, cached, monkeypatch):
    monkeypatch.chdir(user)
    out = f"pl-{Path(spec).stem}"
    result = plan(spec, out, "--json")
    assert result.exit_code == 0, result.output
    done = json.loads(result.stdout)
    p = read_plan(user / out / "plan.json")
    assert p.engine["gguf"] == "model.gguf"
    assert (p.engine["moe_cache_mib"] > 0) is cached, p.engine["choice"]
    run = (user / out / "run.sh").read_text().splitlines()[-1]
    assert run == done["command"]
    assert shlex.split(run)[:3] == ["llama-server", "-m", "model.gguf"]
    assert ("--moe-cache-mib" in run) is cached
    assert done["followups"] == [f"placer evaluate {out}/plan.json --traces {out}/split/heldout",
                                 f"placer export llamacpp {out}/plan.json"]
    for line in done["followups"]:
        argv = shlex.split(line)
        assert argv[0] == "placer"
        ran = invoke(*argv[1:])
        assert ran.exit_code == 0, (line, ran.output)
    exported = invoke("export", "llamacpp", f"{out}/plan.json").stdout.splitlines()[-1]
    assert exported == run
    again = plan(spec, out)  # the terminal's output names the same follow-ups
    assert again.exit_code == 0, again.output
    assert all(line in again.stdout.splitlines() for line in done["followups"])


def test_a_gguf_plan_refuses_placer_only_options_before_collecting(user, monkeypatch):
    monkeypatch.chdir(user)
    result = plan("fast.toml", "refused", "--offload", 0.5)
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert "--offload is for placer's own runtime" in result.output
    assert not (user / "refused").exists()


def test_a_config_plan_exports_with_a_named_placeholder(user, tmp_path):
    """A llama.cpp plan solved from a checkpoint (no GGUF) prints the command with MODEL.gguf
    and the fingerprint the GGUF must have; given that GGUF, the command names it."""
    checkpoint = Path(user / "model.gguf").resolve().parent / "qwen3_moe"
    traces = tmp_path / "traces"
    done = invoke("collect", "--model", checkpoint, "--corpus", user / "prose.jsonl",
                  "--max-length", 24, "--out", traces, "--no-progress")
    assert done.exit_code == 0, done.output
    plan_path = tmp_path / "plan.json"
    solved = invoke("solve", "--engine", "llamacpp", "--model", checkpoint, "--hardware",
                    user / "slow.toml", "--traces", traces, "--concurrency", "1", "--out",
                    plan_path)
    assert solved.exit_code == 0, solved.output
    shown = invoke("export", "llamacpp", plan_path)
    assert shown.exit_code == 0, shown.output
    fingerprint = read_plan(plan_path).model["fingerprint"][:16]
    assert f"# MODEL.gguf: your GGUF of this model, fingerprint {fingerprint}" in shown.stdout
    assert shown.stdout.splitlines()[-1].startswith("llama-server -m MODEL.gguf -ngl all")
    as_json = json.loads(invoke("export", "llamacpp", plan_path, "--json").stdout)
    assert as_json["model_placeholder"]["must_match"] == f"fingerprint {fingerprint}"



def test_a_gguf_plan_templates_a_chat_corpus_with_the_tokenizer_given(user, gguf_bench,
                                                                        monkeypatch):
    """A chat corpus and a GGUF without a chat template: llama.cpp cannot template the
    messages and says to give --tokenizer; `plan --tokenizer DIR` passes it to collect, which
    templates them with it, and the collect key changes with it (a rerun collects again)."""
    monkeypatch.chdir(user)
    chat = [{"messages": [{"role": "user", "content": t}]} for t in ("Hello there.",
                                                                   "What is a router?")] * 6
    (user / "chat.jsonl").write_text("".join(json.dumps(c) + "\n" for c in chat))
    args = ("plan", "--model", "model.gguf", "--corpus", "chat.jsonl", "--hardware",
            "fast.toml", "--out", "pl-chat", "--max-length", 24, "--concurrency", "1")
    refused = invoke(*args)
    assert refused.exit_code == 1 and "give --tokenizer DIR" in refused.output
    done = invoke(*args, "--tokenizer", gguf_bench[0], "--json")
    assert done.exit_code == 0, done.output
    stages = json.loads(done.stdout)["stages"]
    assert not stages["collect"]["skipped"]
    record = json.loads((user / "pl-chat" / "stages.json").read_text())
    assert record["collect"]["inputs"]["tokenizer"]
    not_a_dir = invoke(*args, "--tokenizer", "chat.jsonl")
    assert_one_line_error(not_a_dir, "--tokenizer chat.jsonl: expected a directory")
