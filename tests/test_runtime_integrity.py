"""`placer run` refuses a placement whose source or placed files are not the recorded bytes
(issue 16): another model of the same shape and fingerprint, a flipped byte in a shard."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from cli_errors import assert_one_line_error
from placed_plans import mixed_plan
from safetensors.torch import load_file, save_file

from placer.checkpoint.inventory import read_inventory


@pytest.fixture
def placed(tiny_models, tmp_path: Path, monkeypatch, cli) -> tuple[Path, Path]:
    """(placed dir, its source): a private copy of tiny qwen3_moe and its own digest cache."""
    monkeypatch.setenv("PLACER_CACHE_DIR", str(tmp_path / "cache"))
    source = Path(shutil.copytree(tiny_models["qwen3_moe"], tmp_path / "model"))
    cli("emit", "--plan", mixed_plan(source, tmp_path), "--model", source, "--out",
        tmp_path / "placed")
    return tmp_path / "placed", source


def run(cli, placed: Path, model: Path):
    return cli("run", placed, "--model", model, "--prompt", "Hello", "--max-new-tokens", "1",
               "--device", "cpu", ok=False)


def test_another_model_with_the_same_fingerprint_is_refused(placed, tmp_path: Path,
                                                            cli) -> None:
    out, source = placed
    other = Path(shutil.copytree(source, tmp_path / "other"))
    tensors = load_file(other / "model.safetensors")
    save_file({k: v * 1.5 if v.is_floating_point() else v for k, v in tensors.items()},
              other / "model.safetensors", metadata={"format": "pt"})
    assert read_inventory(other).fingerprint == read_inventory(source).fingerprint
    assert_one_line_error(run(cli, out, other), str(other / "model.safetensors"),
                          "the source checkpoint differs from the one this placement was made "
                          "from")


def test_a_flipped_byte_in_a_placed_shard_is_refused(placed, cli) -> None:
    out, source = placed
    manifest = json.loads((out / "manifest.json").read_text())
    cold = next(e for e in manifest["experts"] if e["cold"])["cold"]
    path = out / cold["file"]
    data = bytearray(path.read_bytes())
    data[cold["offset"] + 11] ^= 0x01
    path.write_bytes(bytes(data))
    assert_one_line_error(run(cli, out, source), str(path), "sha256 differs from the manifest's")


def test_a_missing_or_resized_file_is_refused(placed, cli) -> None:
    out, source = placed
    (out / "card1.safetensors").unlink()
    assert_one_line_error(run(cli, out, source), str(out / "card1.safetensors"), "missing")
    with open(source / "config.json", "a") as f:
        f.write("\n")
    assert_one_line_error(run(cli, out, source), str(source / "config.json"), "bytes")


def test_intact_files_run(placed, cli) -> None:
    out, source = placed
    result = cli("run", out, "--model", source, "--prompt", "Hello", "--max-new-tokens", "1",
                 "--device", "cpu", "--json")
    assert json.loads(result.output)["new_tokens"] == 1


@pytest.mark.parametrize("which", ["manifest.json", "card0.safetensors", "source"])
def test_unreadable_files_are_one_line(placed, cli, monkeypatch, which: str) -> None:
    from unreadable import deny_reads

    out, source = placed
    path = source / "model.safetensors" if which == "source" else out / which
    deny_reads(monkeypatch, path)
    assert_one_line_error(run(cli, out, source), f"permission denied: {path}")
