"""The spill past VRAM (issue #52 item 7): a card whose experts and reserves exceed its VRAM
and whose box spills (the spec's os and backend, placer/hardware/data/spill.csv, or its
card's `spills`) is predicted with the spilled share of its GPU experts read over its link
each step (solvers/llamacpp/cost.py), and marked; where it does not spill, the note that
llama.cpp would not load it stands."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from cli_errors import assert_one_line_error
from llamacpp_boxes import write_one_card_spec
from typer.testing import CliRunner

from placer.cli import app
from placer.hardware.host_fit import llamacpp_host_share, using
from placer.hardware.spec import load_spec
from solvers.cpu import Host
from solvers.llamacpp.cost import Machine, Setup, step_costs

CONFIG = {"model_type": "qwen3_moe", "num_hidden_layers": 4, "hidden_size": 256,
          "intermediate_size": 512, "moe_intermediate_size": 512, "num_experts": 8,
          "num_experts_per_tok": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
          "head_dim": 64, "vocab_size": 1000, "torch_dtype": "bfloat16"}
EXPERT = 3 * 256 * 512 * 2  # bytes of one bf16 expert of CONFIG (gate, up, down)


def machine(spills: bool) -> Machine:
    """Two MoE layers of four 100-byte experts, top-2, on a 1000-byte card holding 300
    bytes beside its experts, a 10 bytes/s link."""
    host = Host(memory_bandwidth=1e3, flops=1e3, sync_s=0.0, activation_bytes=0.0,
                h2d_bandwidth=10.0)
    return Machine(np.full((2, 4), 100), np.full((2, 4), 1.0), (), 2, 700, 10.0, 0.0, 1,
                   host, spills=spills, vram=1000, reserved=300)


def test_the_spilled_share_of_the_selected_gpu_experts_is_read_over_the_link() -> None:
    """800 expert bytes + 300 on a 1000-byte card: 100 past it, 1/8 of the experts; a step
    selecting experts 0, 1 and 2, 3 (400 bytes) reads 50 of them over 10 bytes/s: 5 s."""
    tokens = np.array([[[[0, 1], [2, 3]]]])  # [S=1, B=1, L=2, k=2]
    gpu = Setup("all on the card", np.zeros(2, dtype=bool))
    assert machine(True).spill_bytes(gpu.host).tolist() == [100.0]
    assert step_costs(machine(True), gpu, tokens)[0, 0] == 5.0
    # at a quarter of the link's bandwidth: 20 s
    slow = dataclasses.replace(machine(True), spill_rate=0.25)
    assert step_costs(slow, gpu, tokens)[0, 0] == 20.0
    assert step_costs(machine(False), gpu, tokens)[0, 0] == 0.0
    # one layer on the host: 400 + 300 fit in 1000, nothing spills
    assert machine(True).spill_bytes(np.array([True, False])).tolist() == [0.0]


@pytest.mark.parametrize(("os_line", "card_line", "spills"), [
    ('os = "windows"\n', "", True), ("", "", False),
    ('os = "windows"\n', "spills = false\n", False), ("", "spills = true\n", True)])
def test_spills_by_os_and_backend_unless_the_card_says(tmp_path, os_line, card_line,
                                                         spills) -> None:
    """The default (no backend named: cuda's row): Windows spills, Linux does not; a card's
    `spills` overrides it."""
    path = write_one_card_spec(tmp_path / "box.toml", 6 << 20)
    text = path.read_text().replace("[card]\n", f"[card]\n{card_line}")
    path.write_text(os_line + text)
    spec = load_spec(path)
    assert spec.spills(spec.cards[0])[0] is spills


def test_an_unknown_os_is_one_line_naming_the_field(tmp_path) -> None:
    path = write_one_card_spec(tmp_path / "box.toml", 6 << 20)
    path.write_text('os = "beos"\n' + path.read_text())
    done = CliRunner().invoke(app, ["hardware", "show", str(path)])
    assert_one_line_error(done, "os: unknown OS 'beos'")


def evaluate(tmp_path, os_line: str, spill_rate: float = 0.5) -> dict:
    config = tmp_path / "config.json"
    config.write_text(json.dumps(CONFIG))
    spec = write_one_card_spec(tmp_path / "box.toml", 6 << 20)
    spec.write_text(os_line + spec.read_text())
    with using(llamacpp_host_share(), spill_rate):
        done = CliRunner().invoke(app, ["evaluate", "--config", str(config), "--hardware",
                                        str(spec), "--flags", "-ngl all", "--json"])
    assert done.exit_code == 0, done.output
    return json.loads(done.stdout)


def test_evaluate_flags_predicts_and_marks_a_spill_on_windows(tmp_path) -> None:
    """24 MiB of experts on a 6 MiB card: 18 MiB spill, 3/4 of them; a token selects 2 of 8
    experts in each of 4 layers (6 MiB), so a step reads 4.5 MiB at a spill rate of 0.5 x
    10 GB/s."""
    report = evaluate(tmp_path, 'os = "windows"\n')
    line = report["lines"][0]
    assert line["spill"] is True and line["spill_mib"] == [18]
    assert any("spilled to host memory (18 MiB past its VRAM" in n for n in line["notes"])
    stall = report["results"][0]["lines"][line["name"]]["stall_ms_per_step"]
    assert stall == pytest.approx(0.75 * 4 * 2 * EXPERT / (0.5 * 10e9) * 1e3, rel=1e-12)


def test_on_linux_the_same_flags_are_noted_as_not_loading_and_not_priced(tmp_path) -> None:
    report = evaluate(tmp_path, "")
    line = report["lines"][0]
    assert line["spill"] is False and line["spill_mib"] == [0]
    assert any("llama.cpp would not load this as predicted" in n for n in line["notes"])
    assert report["results"][0]["lines"][line["name"]]["stall_ms_per_step"] == 0.0


def test_hardware_new_writes_the_os_and_says_whether_the_card_spills(tmp_path) -> None:
    out = tmp_path / "box.toml"
    done = CliRunner().invoke(app, ["hardware", "new", "--card", "RTX 3060", "--pcie",
                                    "4.0x16", "--ram", "ddr4-3200x2", "--os", "windows",
                                    "--out", str(out)])
    assert done.exit_code == 0, done.output
    text = out.read_text()
    assert 'os = "windows"' in text and "past VRAM: spills to host memory" in text
    assert load_spec(out).spills(load_spec(out).cards[0])[0] is True


def test_hardware_show_says_whether_the_cards_spill(tmp_path) -> None:
    path = write_one_card_spec(tmp_path / "box.toml", 6 << 20)
    linux = CliRunner().invoke(app, ["hardware", "show", str(path)])
    path.write_text('os = "windows"\n' + path.read_text())
    windows = CliRunner().invoke(app, ["hardware", "show", str(path)])
    assert "card 0 past VRAM: fails to load (linux with unknown" in linux.output
    assert "card 0 past VRAM: spills to host memory (windows with unknown" in windows.output


def test_a_plans_machine_spills_as_its_spec_says(tmp_path) -> None:
    """`evaluate PLAN --flags` replays plan_machine: on a Windows box its cards spill past
    their VRAM, with the VRAM, reserve and rate machine_of gives the same spec (they were
    left at no spill there)."""
    from llamacpp_tiny import one_card, solve, tiny_gguf, tiny_traces

    from placer.checkpoint.inventory import read_inventory
    from placer.plan.llamacpp import machine_of, plan_machine
    from placer.plan.options import SolveOptions
    from placer.plan.placement import read_plan

    model = tiny_gguf(tmp_path)
    spec = one_card(tmp_path)
    spec.write_text('os = "windows"\n' + spec.read_text())
    plan, _ = solve(tmp_path, model, tiny_traces(tmp_path, model), spec)
    mine = plan_machine(read_plan(plan))
    theirs = machine_of(read_inventory(model), load_spec(str(spec)), SolveOptions())
    fields = ("spills", "vram", "reserved", "spill_rate")
    assert mine.spills == (True,)
    assert [getattr(mine, f) for f in fields] == [getattr(theirs, f) for f in fields]
