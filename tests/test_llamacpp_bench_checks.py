"""`placer bench --engine llamacpp` says what it timed: the device named and checked against
the spec's card, a GGUF of another fingerprint refused, each option's flags checked against
the build it drives before the first pass (the others run), the device's default prompt
length, progress lines on stderr when it is not a terminal; and the replay of b11669's cache
looks a prompt's last layer up with the tokens that layer computes."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np

from placer.plan.placement import read_plan
from placer.serve.llamacpp.device import (
    GPU_PROMPT_TOKENS,
    SOFTWARE_PROMPT_TOKENS,
    Device,
    other_device,
)
from placer.serve.llamacpp.predict import prompt_rows
from solvers.llamacpp.lru import (
    LlamaCppCache,
    cache_groups,
    layer_tokens,
    log_stats,
    usable_fetches,
)

pytest_plugins = ["gguf_models", "fixtures_models", "llamacpp_bench_plan"]


def edited(plan: Path, out: Path, edit) -> Path:
    """A copy of the plan.json at `out`, `edit`ed (its JSON dict, changed in place)."""
    d = json.loads(plan.read_text())
    edit(d)
    out.write_text(json.dumps(d))
    return out


def one_line(result, says: str) -> str:
    lines = result.output.strip().splitlines()
    assert result.exit_code == 1 and len(lines) == 1 and says in lines[0], result.output
    return lines[0]


def test_a_gguf_of_another_fingerprint_is_refused_before_llama_cpp_starts(
        bench_plan, placer_run, tmp_path, monkeypatch):
    """As `export` refuses it; no llama.cpp environment here, so nothing could have run."""
    plan, gguf, prompts = bench_plan
    monkeypatch.setenv("PLACER_LLAMA_PYTHON", str(tmp_path / "missing" / "python"))

    def other(d: dict) -> None:
        d["model"]["fingerprint"] = "0" * len(d["model"]["fingerprint"])

    theirs = edited(plan, tmp_path / "plan.json", other)
    result = placer_run("bench", "--engine", "llamacpp", theirs, "--model", gguf, "--prompts",
                        prompts, ok=False)
    one_line(result, "is not the plan's (0000000000000000): solve for this GGUF")


def test_a_spec_naming_another_card_is_refused_naming_the_device(bench_plan, placer_run,
                                                                   tmp_path):
    """The device llama.cpp would run on here (ggml's list: no model loaded) is not an RTX
    3060 (Mesa's software device in the tests): one line naming both, before any pass."""
    plan, gguf, prompts = bench_plan

    def card(d: dict) -> None:
        d["hardware"]["cards"][0]["model"] = "RTX 3060"

    theirs = edited(plan, tmp_path / "plan.json", card)
    result = placer_run("bench", "--engine", "llamacpp", theirs, "--model", gguf, "--prompts",
                        prompts, ok=False)
    line = one_line(result, "but the spec's card is 'RTX 3060'")
    assert "timed on Vulkan0: " in line or "timed on CPU: " in line
    assert "--allow-other-device" in line


def test_which_device_is_the_spec_card(bench_plan):
    plan = read_plan(bench_plan[0])
    spec = plan.hardware

    def named(model: str):
        cards = tuple(dataclasses.replace(c, model=model) for c in spec.cards)
        return dataclasses.replace(plan, hardware=dataclasses.replace(spec, cards=cards))

    rtx = named("RTX 3060")
    assert other_device(rtx, Device("Vulkan0", "NVIDIA GeForce RTX 3060", "GPU")) is None
    assert "RTX 3060 Ti" in other_device(rtx, Device("Vulkan0", "NVIDIA GeForce RTX 3060 Ti",
                                                     "GPU"))
    software = Device("Vulkan0", "llvmpipe (LLVM 15.0.6, 256 bits)", "CPU")
    assert "software Vulkan device" in other_device(named("t"), software)
    assert other_device(named("t"), Device("Vulkan0", "Some GPU", "GPU")) is None
    assert other_device(rtx, None) is None  # --server: not named


def test_an_option_the_build_lacks_a_flag_for_is_named_and_the_others_run(
        bench_plan, placer_run):
    """The plan was solved for the newest build; its 'best cache' row needs
    --moe-cache-cpu-share, which the bundled b11669 lacks: named before the first pass, the
    choice runs; the prompts are cut to the device's default length; progress lines go to
    stderr (not a terminal here)."""
    plan, gguf, prompts = bench_plan
    rows = json.loads(plan.read_text())["engine"]["options"]
    shared = next(r["name"] for r in rows if r["moe_cache_mib"] and r["cpu_share"] > 0)
    result = placer_run("bench", "--engine", "llamacpp", plan, "--model", gguf, "--prompts",
                        prompts, "--options", f"chosen,{shared}", "--trials", 1,
                        "--max-new-tokens", 2, "--threads", 1, "--allow-other-device",
                        "--json")
    report = json.loads(result.stdout)
    assert [r["option"] for r in report["options"]] == ["chosen"]
    assert report["skipped"] == [f"option {shared!r} not run: needs --moe-cache-cpu-share, "
                                 "which llama.cpp b11669 (LRU cache) does not have"]
    device = report["device"]
    assert device["kind"] in ("CPU", "GPU") and device["name"]
    default = SOFTWARE_PROMPT_TOKENS if device["kind"] == "CPU" else GPU_PROMPT_TOKENS
    assert report["max_prompt_tokens"] == default and report["prompt_tokens"] <= default
    if report["other_device"]:
        assert report["options"][0]["predicted_over_measured"] is None
    progress = [x for x in result.stderr.splitlines() if x.startswith("bench llama.cpp [")]
    assert progress[0].startswith("bench llama.cpp [0/2] tokenizing")
    assert any("chosen: recording routing" in x for x in progress)
    assert not any(shared in x for x in progress)


def groups_of(num_layers: int, experts: int):
    return cache_groups([0] * num_layers, [("q8", (100,))] * num_layers, experts)


def test_a_prompts_last_layer_is_looked_up_with_its_output_token_only():
    """16 experts, top-4, 4 slots: a 3-token prompt needs 12 experts at the first layer
    (not cached), but its last layer computes the output token only (the others' ids -1),
    whose 4 experts fit: that lookup counts, on the `ubatch <= 8` line."""
    groups = groups_of(2, 16)
    tokens = np.full((2, 3, 2, 4), -1)
    tokens[0, :, 0] = [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    tokens[0, 2, 1] = [3, 2, 1, 0]
    tokens[1, 0, :] = [[0, 1, 2, 3], [0, 1, 2, 4]]  # a decode token
    assert layer_tokens(tokens).tolist() == [[3, 1], [1, 1]]
    _, used = usable_fetches(tokens, groups, np.array([4]), 4)
    assert used.tolist() == [[False, True], [True, True]]
    fetches = LlamaCppCache(groups, [4], 4).replay(tokens)
    assert fetches.misses.tolist() == [[0, 4], [4, 4]]
    assert fetches.hits.tolist() == [[0, 0], [0, 0]]
    # one group, one LRU of 4 slots: the decode token's layer-0 fetch evicts layer 1's
    assert log_stats(fetches, layer_tokens(tokens), groups) == {
        "ubatch <= 8": (0, 12, 1200), "ubatch  > 8": (0, 0, 0)}


def test_a_prompt_of_more_than_32_tokens_is_replayed_at_its_last_layer():
    experts = np.arange(40 * 2 * 2).reshape(40, 2, 2) % 16
    experts[:39, 1] = -1
    kept = prompt_rows(experts)
    assert kept.shape == (1, 2, 2)
    assert kept[0, 0].tolist() == [-1, -1] and kept[0, 1].tolist() == experts[39, 1].tolist()
    short = experts[:5]
    assert prompt_rows(short) is short
    assert prompt_rows(np.full((40, 2, 2), 3)) is None  # every layer computes 40 tokens
