"""The review's findings 5, 6 and 12 on specs: `hardware show` marks every figure the spec
lists as estimated and names its probe, presets list their typical figures (so what rests on
them is marked); `probe --out` rewrites only what it measured, comments and all, and its
estimated step is `hardware new`'s for the same spec and model; `host_ram = 0` says what it
means, and a pinned llama.cpp choice says when it could not be checked against it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from llamacpp_tiny import tiny_gguf, tiny_traces
from tiny_pipeline import invoke

from placer.checkpoint.tiny import build_tiny_model
from placer.hardware.spec import ESTIMABLE, load_spec, preset_names
from placer.hardware.spec_toml import HOST_RAM_UNSET
from placer.plan.llamacpp import choice_label
from solvers.llamacpp.search import Candidate, SearchResult

NEW = ("hardware", "new", "--card", "RTX 3060", "--pcie", "4.0x16", "--ram", "ddr4-3200x2")


def ok(*args: object):
    result = invoke(*args)
    assert result.exit_code == 0, result.output
    return result


def flat(text: str) -> str:
    """`text` with its wrapped lines joined (a probe's command may wrap)."""
    return " ".join(text.split())


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_gguf(tmp_path_factory.mktemp("marks"))


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory, prose: list[str]) -> Path:
    """A tiny qwen3_moe checkpoint (a config with the attention shape the KV cache needs)."""
    return build_tiny_model("qwen3_moe", tmp_path_factory.mktemp("ckpt") / "m", texts=prose[:200])


@pytest.fixture(scope="module")
def traces(model: Path) -> Path:
    return tiny_traces(model.parent, model)


def test_hardware_show_marks_each_estimated_figure_and_names_its_probe(tmp_path) -> None:
    spec = tmp_path / "box.toml"
    ok(*NEW, "--out", spec)
    shown = ok("hardware", "show", spec).output
    lines = shown.splitlines()
    header = "".join(lines[next(i for i, x in enumerate(lines) if x.startswith("┏")):
                           next(i for i, x in enumerate(lines) if x.startswith("┡"))])
    assert header.count("ESTIMATED") == 4  # reserved, free for experts, H2D, latency
    for figure in ("base decode step", "38.4 GB/s", "0.48 TFLOP/s", "30.0 us"):
        assert f"{figure} ESTIMATED" in shown, figure
    for figure in load_spec(spec).estimated:
        assert f"{figure}" in flat(shown) and ESTIMABLE[figure] in flat(shown)
    measured = tmp_path / "measured.toml"
    measured.write_text("\n".join(line for line in spec.read_text().splitlines()
                                  if not line.startswith("estimated = ")) + "\n")
    assert "ESTIMATED" not in ok("hardware", "show", measured).output.replace(
        "new: ESTIMATED figures", "")  # the description hardware new wrote


def test_every_preset_lists_its_typical_figures_as_estimated() -> None:
    for name in preset_names():
        assert load_spec(name).estimated == tuple(ESTIMABLE), name
    shown = ok("hardware", "show", "1x-12gb-pcie4").output
    assert "H2D ESTIMATED" in shown and "base decode step ESTIMATED" in shown


@pytest.mark.parametrize(("preset", "engine"), [("1x-rtx4090", ()),
                                                 ("1x-12gb-pcie4", ("--engine", "llamacpp"))])
def test_a_solve_on_a_preset_marks_its_tok_s(model, traces, preset, engine) -> None:
    said = ok("solve", "--model", model, "--hardware", preset, "--traces", traces,
              "--concurrency", "1", "--out", model.parent / f"{preset}.json", *engine).output
    assert "tok/s ESTIMATED" in said and "rests on the spec's ESTIMATED base_step_ms" in said


def test_probe_step_out_rewrites_the_step_alone_and_agrees_with_hardware_new(checkpoint,
                                                                             tmp_path) -> None:
    new, probed = tmp_path / "new.toml", tmp_path / "probed.toml"
    ok(*NEW, "--model", checkpoint, "--ctx", "8192", "--out", new)
    ok("probe", "--step", "--estimate", "--model", checkpoint, "--hardware", new, "--out",
       probed)
    before, after = new.read_text().splitlines(), probed.read_text().splitlines()
    assert len(before) == len(after)
    changed = [i for i, (a, b) in enumerate(zip(before, after, strict=True)) if a != b]
    assert [before[i].split(" = ")[0] for i in changed] == ["base_step_ms"]
    assert "KV cache" in after[changed[0]] and "(--estimate)" in after[changed[0]]
    assert load_spec(probed) == load_spec(new)  # the same step, spread and marks
    assert sum(line.startswith("#") for line in after) == sum(
        line.startswith("#") for line in before) > 10


@pytest.mark.usefixtures("quick_host_probe")
def test_probe_host_out_keeps_the_card_and_step_comments(tmp_path) -> None:
    new, probed = tmp_path / "new.toml", tmp_path / "probed.toml"
    ok(*NEW, "--out", new)
    ok("probe", "--host", "--mb", "8", "--tokens", "64", "--expert-tokens", "1,4",
       "--hardware", new, "--out", probed)
    before, after = new.read_text(), probed.read_text()
    head = before[:before.index("# memory_bandwidth: ESTIMATED")]
    assert after.startswith(head.replace('"host.memory_bandwidth", "host.flops", ', ""))
    assert "# h2d_bandwidth: ESTIMATED" in after and "base_step_ms = " in after
    assert "# memory_bandwidth: ESTIMATED" not in after and "[[host.expert]]" in after
    assert "host.flops" not in load_spec(probed).estimated


def test_a_spec_without_table_headers_is_written_afresh_with_a_warning(model, tmp_path
                                                                      ) -> None:
    spec, out = tmp_path / "inline.toml", tmp_path / "out.toml"
    spec.write_text('cards = 1\ncard = { model = "RTX 3060", vram = "12GiB", h2d_bandwidth = '
                    '"25GB/s" }  # mine\ndecode = { base_step_ms = { 1 = 9.0 } }\n')
    said = ok("probe", "--step", "--estimate", "--model", model, "--hardware", spec,
              "--out", out).output
    assert "could not be edited in place" in said and "# mine" not in out.read_text()
    assert load_spec(out).estimated == ("base_step_ms",)
    spec.write_text('# my box\ncards = 1  # one\n\n[card]\nmodel = "RTX 3060"\nvram = "12GiB"\n'
                    'h2d_bandwidth = "25GB/s"\n\n[decode]\nbase_step_ms = { 1 = 9.0 }\n')
    said = ok("probe", "--step", "--estimate", "--model", model, "--hardware", spec,
              "--out", out).output
    assert "could not be edited" not in said
    assert out.read_text().startswith('# my box\ncards = 1  # one\n# estimated: ')


def test_host_ram_zero_says_what_it_means(tmp_path) -> None:
    spec = tmp_path / "box.toml"
    said = ok(*NEW, "--out", spec).output
    assert f"host_ram = 0  # {HOST_RAM_UNSET}\n" in spec.read_text()
    assert "host_ram = 0: not given (--host-ram)" in said
    assert f"host RAM {HOST_RAM_UNSET}" in flat(ok("hardware", "show", spec).output)
    said = ok(*NEW, "--host-ram", "64GiB", "--out", spec).output
    assert 'host_ram = "64GiB"\n' in spec.read_text() and "host_ram = 0" not in said
    assert "host RAM 64.00 GiB" in ok("hardware", "show", spec).output


@pytest.mark.parametrize(("pinned", "host_ram", "says"), [
    (True, 0, "pinned (-lm none; not checked against host RAM: the spec's host_ram is 0"),
    (True, 2**36, "pinned (-lm none)"), (False, 0, "mmap'd")])
def test_a_pinned_choice_says_whether_host_ram_checked_it(pinned, host_ram, says) -> None:
    best = Candidate("cpu", 3, 1.0, 0.5, pinned)
    label = choice_label(SearchResult(best, {"cpu": np.arange(4)}, {best: 1.0}), 4, host_ram)
    assert label.endswith(says if host_ram or not pinned else says + ", not given)")
