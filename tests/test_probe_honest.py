"""Probes that say what they measured (issue 43, 41, 44): the device timed, the spread over
repeats, NOISY where it did not settle, no step time of another device written silently
into a spec naming a card, targets checked before measuring, the sizes a stand-in is built
from bounded, `probe --host --model` taking the experts from the model, and `--out` merging
into the spec instead of appending a second table."""

from __future__ import annotations

import json
import shutil
import tomllib
from pathlib import Path

import pytest
from cli_errors import assert_one_line_error
from gguf_files import write_moe_gguf
from tiny_pipeline import BOX, invoke

from placer.checkpoint.step import STEADY, StepTimes
from placer.checkpoint.tiny import build_tiny_model
from placer.hardware.probe import HostProbe, host_fragment
from placer.hardware.spec import load_spec

# a fast host probe: an 8 MiB copy, a 64-row matmul, experts at two token counts
FAST_HOST = ("--mb", "8", "--tokens", "64", "--expert-tokens", "1,4")
GPU_SPEC = "1x-rtx4090"


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory, prose: list[str]) -> Path:
    return build_tiny_model("qwen3_moe", tmp_path_factory.mktemp("honest") / "model",
                            texts=prose[:50])


def test_a_cpu_step_for_a_gpu_spec_is_refused_before_it_runs(model, tmp_path):
    """A spec naming a GPU and a CPU-only probe: no silent write, and nothing timed (the
    refusal comes before the measurement, so it costs nothing)."""
    out = tmp_path / "box.toml"
    result = invoke("probe", "--step", "--model", model, "--hardware", GPU_SPEC,
                    "--device", "cpu", "--batch", "1", "--out", out)
    assert_one_line_error(result, "timed on cpu (", "'RTX 4090'", "--allow-other-device")
    assert "timing on" not in result.output and not out.exists()


def test_a_cpu_step_for_a_gpu_spec_printed_comes_with_a_warning(model):
    result = invoke("probe", "--step", "--model", model, "--hardware", GPU_SPEC,
                    "--device", "cpu", "--batch", "1")
    assert result.exit_code == 0, result.output
    assert "warning: timed on cpu (" in result.stderr and "'RTX 4090'" in result.stderr
    assert "NOT THE SPEC'S CARD" in result.stdout
    assert "probe --step: timing on cpu (" in result.stderr  # the device, before it runs


def test_allow_other_device_writes_it_marked_with_device_and_spread(model, tmp_path):
    out = tmp_path / "box.toml"
    result = invoke("probe", "--step", "--model", model, "--hardware", GPU_SPEC,
                    "--device", "cpu", "--batch", "1,2", "--allow-other-device",
                    "--out", out, "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["device"].startswith("cpu (") and report["other_device"]
    assert set(report["spread"]) == {"1", "2"} and all(s >= 0 for s in report["spread"].values())
    assert all(n >= 8 for n in report["steps"].values())
    assert report["noisy"] == any(s > STEADY for s in report["spread"].values())
    text = out.read_text()
    assert "NOT THE SPEC'S CARD" in text and "measured on cpu (" in text
    assert "spread (IQR / median) by batch" in text
    spec = load_spec(out)
    assert {str(b): ms for b, ms in spec.base_step_ms} == report["base_step_ms"]
    assert spec.cards == load_spec(GPU_SPEC).cards


def test_noisy_step_times_are_marked() -> None:
    calm = StepTimes(((1, 5.0),), False, "measured on cpu (x)", spread=((1, 0.01),))
    busy = StepTimes(((1, 5.0),), False, "measured on cpu (x)", spread=((1, 0.4),))
    assert not calm.noisy and not calm.note().startswith("NOISY")
    assert busy.noisy and busy.note().startswith("NOISY") and "1: 40.0%" in busy.note()
    estimated = StepTimes(((1, 5.0),), True, "estimated (--estimate): ...")
    assert estimated.note().startswith("ESTIMATED")


@pytest.mark.parametrize("target, says", [
    ("missing-folder/box.toml", "does not exist"),
    ("box.txt", "ending in .toml"),
    ("sub", "is a directory"),
])
def test_the_out_target_is_checked_before_measuring(model, tmp_path, monkeypatch, target,
                                                    says):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sub").mkdir()
    if target == "sub":
        target = "sub.toml"
        (tmp_path / "sub.toml").mkdir()
    result = invoke("probe", "--step", "--model", model, "--hardware", BOX, "--device", "cpu",
                    "--allow-other-device", "--out", target)
    assert_one_line_error(result, says)
    assert "timing on" not in result.output


@pytest.mark.parametrize("rate", ["0", "0B/s", "1B/s", "999MB/s", "1e30GB/s"])
def test_memory_bandwidth_is_bounded(model, tmp_path, rate):
    out = tmp_path / "box.toml"
    result = invoke("probe", "--step", "--model", model, "--hardware", BOX, "--estimate",
                    "--memory-bandwidth", rate, "--out", out)
    assert_one_line_error(result, "--memory-bandwidth")
    assert not out.exists()


def lying(model: Path, tmp_path: Path, **changes) -> Path:
    copy = tmp_path / "lying"
    shutil.copytree(model, copy)
    config = json.loads((copy / "config.json").read_text())
    (copy / "config.json").write_text(json.dumps({**config, **changes}))
    return copy


@pytest.mark.parametrize("change, says", [
    ({"num_attention_heads": 0}, "num_attention_heads"),
    ({"hidden_size": 2**40}, "hidden_size"),
    ({"vocab_size": 4_000_000}, "disagree with the weights"),
    ({"num_hidden_layers": 4000}, None),
])
def test_a_config_that_lies_about_its_sizes_is_refused(model, tmp_path, change, says):
    """0 heads divided by zero in transformers; a vocabulary 30000 x the embedding's was
    allocated before anything failed: each is one line now, before any allocation."""
    result = invoke("probe", "--step", "--model", lying(model, tmp_path, **change),
                    "--hardware", BOX, "--device", "cpu", "--batch", "1")
    lines = [line for line in result.output.splitlines() if line.startswith("error: ")]
    assert result.exit_code == 1 and len(lines) == 1, result.output
    assert says is None or says in lines[0], lines[0]


@pytest.mark.usefixtures("quick_host_probe")
def test_host_out_merges_into_the_spec_in_place(tmp_path):
    """The README's `probe --host ... >> box.toml` made a second [host] table; `--hardware
    box.toml --out box.toml` replaces the one there, the rest of the spec kept."""
    box = tmp_path / "box.toml"
    shutil.copy(BOX, box)
    before = load_spec(box)
    result = invoke("probe", "--host", *FAST_HOST, "--expert", "64x32", "--hardware", box,
                    "--out", box)
    assert result.exit_code == 0, result.output
    after = load_spec(box)
    assert after.cards == before.cards and after.base_step_ms == before.base_step_ms
    assert after.host != before.host and len(after.host.expert) == 1
    assert after.host.expert[0].hidden == 64
    text = box.read_text()
    assert text.count("[host]") == 1 and "placer probe --host timed" in text
    assert "memory_bandwidth: " in text  # each figure's note, above the table


def test_host_fragment_names_the_cpu_and_marks_noise() -> None:
    base = dict(memory_bandwidth=1e10, flops=1e11, sync_us=30.0, sync_measured=False,
                dtype="bfloat16", threads=2, buffer_bytes=2**23, matmul=(64, 2048, 768),
                copies=5, matmuls=5, cpu="Test CPU 9000")
    calm = host_fragment(HostProbe(**base, copy_spread=0.01, matmul_spread=0.02))
    assert "Test CPU 9000" in calm and "NOISY" not in calm and "spread ±1.0%" in calm
    busy = host_fragment(HostProbe(**base, copy_spread=0.3, matmul_spread=0.02))
    assert busy.startswith("# NOISY") and "NOISY, measured by placer probe --host" in busy
    assert tomllib.loads(busy)["host"]["memory_bandwidth"] == "10.00GB/s"


@pytest.mark.usefixtures("quick_host_probe")
def test_host_model_takes_the_checkpoints_expert_shape(model):
    result = invoke("probe", "--host", *FAST_HOST, "--model", model, "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    config = json.loads((model / "config.json").read_text())
    (timing,) = report["experts"]
    assert (timing["hidden"], timing["inter"]) == (config["hidden_size"],
                                                  config["moe_intermediate_size"])
    assert len(report["expert_spread"]) == 1 and report["cpu"]
    assert model.name in report["source"]


@pytest.mark.usefixtures("quick_host_probe")
def test_host_model_gguf_takes_its_expert_type_and_shape(tmp_path):
    """`probe --host --model model.gguf` was silently ignored: it times the GGUF's experts,
    in its gate projection's type, with llama.cpp's kernels, and names where they came
    from."""
    gguf = tmp_path / "m.gguf"
    write_moe_gguf(gguf, hidden=256, ff=512)  # gate Q4_K, up Q6_K, down Q8_0
    result = invoke("probe", "--host", *FAST_HOST, "--model", gguf)
    assert result.exit_code == 0, result.output
    (timing,) = tomllib.loads(result.stdout)["host"]["expert"]
    assert (timing["hidden"], timing["inter"], timing["dtype"]) == (256, 512, "Q4_K")
    assert "m.gguf: 256x512 Q4_K; its other projections are Q6_K, Q8_0" in result.stdout
    assert "llama.cpp b11669 CPU kernels" in result.stdout
    clash = invoke("probe", "--host", "--model", gguf, "--gguf-type", "Q6_K")
    assert_one_line_error(clash, "drop --expert and --gguf-type")


def test_show_toml_escapes_del_and_loads_back(tmp_path):
    """A raw DEL (U+007F) is not allowed in a TOML string: `hardware show --toml` wrote one."""
    box = tmp_path / "box.toml"
    box.write_text(BOX.read_text().replace('name = "tiny-box"', 'name = "tiny\\u007fbox"'))
    result = invoke("hardware", "show", box, "--toml")
    assert result.exit_code == 0, result.output
    assert "\x7f" not in result.stdout
    again = tmp_path / "again.toml"
    again.write_text(result.stdout)
    assert load_spec(again) == load_spec(box) and load_spec(again).name == "tiny\x7fbox"


@pytest.mark.parametrize("model, gpu, same", [
    ("RTX 3060", "NVIDIA GeForce RTX 3060", True),
    ("RTX 3060", "NVIDIA GeForce RTX 3060 Ti", False),
    ("RTX 4090", "NVIDIA GeForce RTX 4090 D", False),
    ("H100", "NVIDIA H100 80GB HBM3", True),
    ("RTX 6000 Ada", "NVIDIA RTX 6000 Ada Generation", True),
    ("RTX 4090", "NVIDIA GeForce RTX 3090", False),
])
def test_the_device_timed_is_matched_to_the_spec_card(model, gpu, same) -> None:
    from placer.hardware.cards import same_card
    from placer.hardware.spec import parse_spec
    from placer.hardware.spec_probe import other_device

    assert same_card(model, gpu) is same
    spec = parse_spec({"cards": 1, "card": {"model": model, "vram": "24GiB",
                                            "h2d_bandwidth": "25GB/s"},
                       "decode": {"base_step_ms": {"1": 10.0}}})
    assert (other_device(spec, "cuda:0", f"cuda:0 ({gpu})") is None) is same
    assert other_device(spec, "cpu", "cpu (Test CPU)") is not None
