"""llama.cpp's CPU expert reads at the fitted share of the host's streaming bandwidth
(placer/hardware/host_fit.py, placer/hardware/data/host_fit.csv): the share placer uses is
the fit on every group; a spec with measured expert curves keeps them."""

from __future__ import annotations

import json

import pytest
from llamacpp_boxes import write_one_card_spec
from typer.testing import CliRunner

from placer.cli import app
from placer.hardware.host_fit import (
    ALL_GROUPS,
    host_fits,
    llamacpp_host_share,
    llamacpp_spill_rate,
    using,
)
from placer.plan.llamacpp import llamacpp_host
from solvers.cpu import ExpertCurve, Host

CONFIG = {"model_type": "qwen3_moe", "num_hidden_layers": 4, "hidden_size": 256,
          "intermediate_size": 512, "moe_intermediate_size": 512, "num_experts": 8,
          "num_experts_per_tok": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
          "head_dim": 64, "vocab_size": 1000, "torch_dtype": "bfloat16"}
EXPERT = 3 * 256 * 512 * 2  # bytes of one bf16 expert of CONFIG


def test_the_share_is_the_fit_on_every_group_and_every_held_out_fit_is_kept() -> None:
    fits = host_fits()
    assert llamacpp_host_share() == fits[ALL_GROUPS].share
    assert llamacpp_spill_rate() == fits[ALL_GROUPS].spill_rate
    assert 0 < fits[ALL_GROUPS].share <= 1 and 0 < fits[ALL_GROUPS].spill_rate <= 1
    held = [f for f in fits.values() if f.held_out != ALL_GROUPS]
    assert held and all(f.groups == fits[ALL_GROUPS].groups - 1 for f in held)
    # a group that spills is left out of its own spill fit
    assert any(f.spill_groups == fits[ALL_GROUPS].spill_groups - 1 for f in held)


def test_the_host_reads_experts_at_the_share_unless_curves_were_measured() -> None:
    host = Host(memory_bandwidth=40e9, flops=1e12, sync_s=2e-5, activation_bytes=512.0,
                h2d_bandwidth=1e10)
    with using(0.25, 1.0):
        assert llamacpp_host(host).memory_bandwidth == 10e9
        timed = Host(40e9, 1e12, 2e-5, 512.0, 1e10, (ExpertCurve(1e6, (1,), (1e-3,)),))
        assert llamacpp_host(timed) == timed


def test_evaluate_flags_prices_a_host_layer_at_the_share(tmp_path) -> None:
    """-cmoe on the tiny config, batch 1: each of the 4 host layers reads its token's 2
    experts at 0.25 x 50 GB/s (memory binds: 2 x 393,216 FLOP at 1 TFLOPS is far less),
    waits 20 us of hand-off and moves 2 x 512 bytes of activations over 10 GB/s."""
    config = tmp_path / "config.json"
    config.write_text(json.dumps(CONFIG))
    spec = write_one_card_spec(tmp_path / "box.toml", 64 << 20)
    with using(0.25, 1.0):
        done = CliRunner().invoke(app, ["evaluate", "--config", str(config), "--hardware",
                                        str(spec), "--flags", "-ngl all -cmoe", "--json"])
    assert done.exit_code == 0, done.output
    report = json.loads(done.stdout)
    stall = report["results"][0]["lines"][report["lines"][0]["name"]]["stall_ms_per_step"]
    per_layer = 2 * EXPERT / (0.25 * 50e9) + 20e-6 + 2 * 512 / 10e9
    assert stall == pytest.approx(4 * per_layer * 1e3, rel=1e-9)
    assert any(n.startswith("host layers: their experts read at 0.25 x the spec's "
                            "host.memory_bandwidth, 12.5 GB/s") for n in report["notes"])
