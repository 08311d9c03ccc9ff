"""Emit remembers source sha256s by stat (placer/digests.py): an unchanged checkpoint is
hashed once, a changed or freshly written one every time, and the manifest always holds the
file's true sha256."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from pathlib import Path

import pytest
from placed_plans import mixed_plan

import placer.placed.emit
from placer.placed import digests

HOUR = 3600 * 10**9


@pytest.fixture
def old_model(tiny_models, tmp_path: Path) -> Path:
    """A copy of the qwen3_moe checkpoint whose files were last written an hour ago."""
    model = tmp_path / "model"
    shutil.copytree(tiny_models["qwen3_moe"], model)
    age(model)
    return model


def age(model: Path) -> None:
    past = time.time_ns() - HOUR
    for f in model.iterdir():
        os.utime(f, ns=(past, past))
    time.sleep(digests.RACY_S + 0.1)  # ctime, which utime sets to now, must age too


def source_hashes(monkeypatch) -> list[str]:
    """Names of the source files sha256_file is asked to hash from now on."""
    seen: list[str] = []
    real = placer.placed.emit.sha256_file

    def counting(path, abort=None):
        if not path.name.startswith("."):  # outputs are hashed as written, not here
            seen.append(path.name)
        return real(path, abort)

    monkeypatch.setattr(placer.placed.emit, "sha256_file", counting)
    return seen


def emit(model: Path, tmp_path: Path, cli, name: str) -> dict:
    out = tmp_path / name
    cli("emit", "--plan", mixed_plan(model, tmp_path), "--model", model, "--out", out)
    return json.loads((out / "manifest.json").read_text())


def true_sha(model: Path, manifest: dict) -> dict[str, tuple[str, str]]:
    return {f["name"]: (f["sha256"], hashlib.sha256((model / f["name"]).read_bytes()).hexdigest())
            for f in manifest["source"]["files"]}


def test_an_unchanged_checkpoint_is_hashed_once(old_model, tmp_path, cli, monkeypatch) -> None:
    hashed = source_hashes(monkeypatch)
    first = emit(old_model, tmp_path, cli, "a")
    assert sorted(hashed) == ["config.json", "model.safetensors"]
    hashed.clear()
    second = emit(old_model, tmp_path, cli, "b")
    assert hashed == []
    assert first["source"] == second["source"]
    assert all(a == b for a, b in true_sha(old_model, second).values())


def test_a_changed_file_is_hashed_again(old_model, tmp_path, cli, monkeypatch) -> None:
    """Same size, mtime set back to what it was: the ctime still tells it changed."""
    emit(old_model, tmp_path, cli, "a")
    shard = old_model / "model.safetensors"
    st = shard.stat()
    with open(shard, "r+b") as f:
        f.seek(st.st_size - 1)
        last = f.read(1)
        f.seek(st.st_size - 1)
        f.write(bytes([last[0] ^ 0xFF]))
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns))
    hashed = source_hashes(monkeypatch)
    manifest = emit(old_model, tmp_path, cli, "b")
    assert hashed == ["model.safetensors"]
    recorded, actual = true_sha(old_model, manifest)["model.safetensors"]
    assert recorded == actual


def test_a_freshly_written_file_is_not_remembered(tiny_models, tmp_path, cli,
                                                  monkeypatch) -> None:
    model = tmp_path / "model"
    shutil.copytree(tiny_models["qwen3_moe"], model)  # written just now: racy
    emit(model, tmp_path, cli, "a")
    hashed = source_hashes(monkeypatch)
    emit(model, tmp_path, cli, "b")
    assert sorted(hashed) == ["config.json", "model.safetensors"]


def test_a_corrupt_cache_is_ignored(old_model, tmp_path, cli, monkeypatch) -> None:
    digests.cache_file().parent.mkdir(parents=True, exist_ok=True)
    digests.cache_file().write_text("{not json")
    hashed = source_hashes(monkeypatch)
    manifest = emit(old_model, tmp_path, cli, "a")
    assert sorted(hashed) == ["config.json", "model.safetensors"]
    assert all(a == b for a, b in true_sha(old_model, manifest).values())
    assert json.loads(digests.cache_file().read_text())  # rewritten whole
