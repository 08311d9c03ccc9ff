"""`placer hardware new` (issue 43): a spec from what a user knows of the box (a card from the
table, its PCIe link, the host's DDR), every estimated figure marked with the probe that
replaces it, loaded by `solve` as is; the card table's figures and their sources."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_errors import assert_one_line_error
from tiny_pipeline import invoke

from placer.checkpoint.tiny import build_tiny_model
from placer.hardware.cards import CARDS, card, ddr_memory, memory_bandwidth, pcie_link
from placer.hardware.spec import load_spec, preset_names

WANTED = ("RTX 3060", "RTX 3090", "RTX 4060 Ti 16GB", "RTX 4070", "RTX 4080", "RTX 4090",
          "RTX 5070", "RTX 5080", "RTX 5090", "RX 7900 XTX", "RTX A6000", "RTX 6000 Ada")


def test_the_table_holds_the_cards_people_own_and_the_presets_cards() -> None:
    for name in WANTED:
        assert card(name) is not None, name
    for preset in preset_names():
        model = load_spec(preset).cards[0].model
        if "GB card" not in model:  # the generic presets name a size, not a card
            assert card(model) is not None, (preset, model)
    for c in CARDS:
        assert c.source and c.vram_gib > 0 and c.bandwidth_gbps > 0
        assert (c.bf16_tflops is None) == (c.int8_tops is None)
        assert c.bf16_tflops is not None or c.derived  # a missing figure says why


def test_names_match_as_people_and_drivers_write_them() -> None:
    assert card("NVIDIA GeForce RTX 3060") is card("rtx3060") is card("RTX 3060 12GB")
    assert card("AMD Radeon RX 7900 XTX").name == "RX 7900 XTX"
    assert memory_bandwidth("RTX 4090") == 1008e9 and memory_bandwidth("toy") is None


def test_link_and_memory_peaks_from_their_standards() -> None:
    assert pcie_link("3.0x16") == ("3.0", 16, pytest.approx(15.754e9, rel=1e-3))
    assert pcie_link("PCIe 4.0 x8")[2] == pytest.approx(15.754e9, rel=1e-3)
    assert ddr_memory("ddr4-3200x2")[3] == 51.2e9
    assert ddr_memory("DDR5-6000x2")[3] == 96e9


def test_rtx_3060_box_is_a_spec_with_every_estimate_named(tmp_path: Path) -> None:
    out = tmp_path / "box.toml"
    result = invoke("hardware", "new", "--card", "RTX 3060", "--pcie", "3.0x16", "--ram",
                    "ddr4-3200x2", "--cpu-cores", "8", "--out", out)
    assert result.exit_code == 0, result.output
    spec = load_spec(out)
    (c,) = spec.cards
    assert c.model == "RTX 3060" and c.vram == 12 * 2**30
    assert c.h2d_bandwidth == pytest.approx(0.8 * 15.754e9, rel=1e-2)
    assert spec.host.memory_bandwidth == pytest.approx(0.75 * 51.2e9, rel=1e-2)
    text = out.read_text()
    for field in ("h2d_bandwidth", "latency_us", "reserved_*", "memory_bandwidth", "flops",
                  "sync_us"):
        line = next(x for x in text.splitlines() if x.startswith(f"# {field}:"))
        assert "ESTIMATED" in line and "placer probe" in line or "set them" in line, line
    assert "base_step_ms" in text and "ESTIMATED (no --model)" in text
    assert "NVIDIA Ampere GA102 GPU Architecture whitepaper" in text  # the card's source
    assert "placer probe --step" in result.stderr


@pytest.mark.parametrize("args, says", [
    (["--card", "RTX 9999", "--pcie", "4.0x16", "--ram", "ddr5-6000x2"], "knows no card"),
    (["--card", "RTX 3060", "--pcie", "6.0x16", "--ram", "ddr5-6000x2"], "--pcie"),
    (["--card", "RTX 3060", "--pcie", "4.0x3", "--ram", "ddr5-6000x2"], "--pcie"),
    (["--card", "RTX 3060", "--pcie", "4.0x16", "--ram", "ddr3-1600x2"], "--ram"),
    (["--card", "RTX 3060", "--pcie", "4.0x16", "--ram", "ddr5-6000x0"], "--ram"),
    (["--card", "RTX 3060", "--pcie", "4.0x16", "--ram", "ddr5-6000x2", "--cards", "0"],
     "--cards"),
])
def test_bad_descriptions_are_one_line(args: list[str], says: str) -> None:
    assert_one_line_error(invoke("hardware", "new", *args), says)


def test_solve_accepts_the_new_spec(tmp_path: Path, prose: list[str]) -> None:
    """The done-when of issue 43: the spec from `hardware new` is one `solve` takes; with
    --model the step is the model's bandwidth estimate."""
    model = build_tiny_model("qwen3_moe", tmp_path / "model", texts=prose[:50])
    box = tmp_path / "box.toml"
    made = invoke("hardware", "new", "--card", "RTX 3060", "--pcie", "3.0x16", "--ram",
                  "ddr4-3200x2", "--model", model, "--out", box)
    assert made.exit_code == 0, made.output
    assert "ESTIMATED, not measured" in box.read_text()
    traces = tmp_path / "traces"
    for args in (["collect", "--model", model, "--random-tokens", 32, "--max-length", 8,
                  "--out", traces, "--no-progress"],
                 ["solve", "--model", model, "--hardware", box, "--traces", traces,
                  "--offload", 0.5, "--solver", "greedy", "--steps", 8,
                  "--out", tmp_path / "plan.json", "--json"]):
        result = invoke(*args)
        assert result.exit_code == 0, result.output
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert plan["hardware"]["cards"][0]["model"] == "RTX 3060"


def test_cards_table_lists_sources() -> None:
    result = invoke("hardware", "cards", "--json")
    assert result.exit_code == 0, result.output
    rows = {r["name"]: r for r in json.loads(result.stdout)}
    assert rows["RTX 4090"]["bandwidth_gbps"] == 1008.0 and "Ada" in rows["RTX 4090"]["source"]


def test_docs_list_every_spec_field() -> None:
    """docs/hardware.md names every field the loader reads (the spec's fields were
    documented only in placer/hardware/spec.py)."""
    from placer.hardware import spec

    text = (Path(__file__).resolve().parent.parent / "docs" / "hardware.md").read_text()
    fields = {*spec.SPEC_FIELDS, *spec.CARD_FIELDS, *spec.LINK_FIELDS, *spec.HOST_FIELDS,
              "base_step_ms", "hidden", "inter", "dtype", "tokens", "ms"}
    missing = sorted(f for f in fields if not any(
        form in text for form in (f"`{f}`", f"`[{f}]`", f"`[[{f}]]`", f"`[[host.{f}]]`")))
    assert not missing, missing


def test_a_config_gives_the_reserves_and_the_step_before_the_download(tmp_path: Path) -> None:
    """--config (Qwen3.5-35B-A3B at Q4_K experts, Q8_0 dense) instead of --model: the dense
    reserve is the config's estimated dense bytes (marked estimated), the KV its 10 full
    attention layers at --ctx, the step counts its 40 layers (it was a 7B model's 32 layers
    over 15% of VRAM)."""
    config = (Path(__file__).resolve().parent.parent / "benchmarks" / "accuracy" / "configs"
              / "qwen3.5-35b-a3b.json")
    dtypes = ["--expert-dtype", "q4_k", "--dense-dtype", "q8_0"]
    inspected = json.loads(invoke("inspect", "--config", config, *dtypes, "--json").stdout)
    out = tmp_path / "box.toml"
    result = invoke("hardware", "new", "--card", "RTX 3060", "--pcie", "4.0x16", "--ram",
                    "ddr4-3200x2", "--config", config, *dtypes, "--ctx", "8192", "--out", out)
    assert result.exit_code == 0, result.output
    spec = load_spec(out)
    assert spec.cards[0].reserved_dense == inspected["dense_bytes"]
    assert spec.cards[0].reserved_kv == 10 * 8192 * 2 * 256 * 2 * 2
    assert "card.reserved" in spec.estimated and "40 layers x" in out.read_text()
    for args, says in ((["--model", tmp_path, "--config", config], "not both"),
                       (["--expert-dtype", "q4_k"], "go with --config")):
        assert_one_line_error(invoke("hardware", "new", "--card", "RTX 3060", "--pcie",
                                     "4.0x16", "--ram", "ddr4-3200x2", *args), says)


def test_an_unknown_card_names_the_nearest_not_the_whole_table() -> None:
    """The table holds about a hundred cards: the refusal names the nearest few and where
    the rest are listed (it printed every name, over 1,400 characters)."""
    result = invoke("hardware", "new", "--card", "RTX 3075", "--pcie", "4.0x16", "--ram",
                    "ddr4-3200x2")
    assert_one_line_error(result, "knows no card 'RTX 3075'; nearest: RTX 3070",
                          "`placer hardware cards` lists the")
    assert len(result.output) < 300
