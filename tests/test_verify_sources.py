"""verify checks the source checkpoint's bytes against the manifest's sha256 and reports the
first differing byte of a piece at its real offsets (issue 16)."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
from cli_errors import assert_one_line_error
from placed_plans import mixed_plan

from placer.placed import digests
from placer.placed.verify import SOURCE_DIFFERS


@pytest.fixture
def source(tiny_models, tmp_path: Path, monkeypatch) -> Path:
    """A private copy of the tiny qwen3_moe checkpoint, with its own digest cache."""
    monkeypatch.setenv("PLACER_CACHE_DIR", str(tmp_path / "cache"))
    return Path(shutil.copytree(tiny_models["qwen3_moe"], tmp_path / "model"))


def emit(source: Path, tmp_path: Path, cli) -> Path:
    cli("emit", "--plan", mixed_plan(source, tmp_path), "--model", source, "--out",
        tmp_path / "placed")
    return tmp_path / "placed"


def problems(cli, placed: Path, model: Path) -> list[str]:
    result = cli("verify", placed, "--model", model, "--json", ok=False)
    assert result.exit_code == 1, result.output
    return json.loads(result.output)["problems"]


def test_a_wrong_digest_in_the_cache_is_caught(source: Path, tmp_path: Path, cli,
                                               monkeypatch) -> None:
    """A corrupt digest cache makes emit record a wrong source sha256; verify hashes the
    source afresh, says the checkpoint is not the one the placement was made from, and
    replaces the cache's entry by the true digest."""
    monkeypatch.setattr(digests, "RACY_S", -1.0)  # remember digests of files this young
    shard = source / "model.safetensors"
    wrong = "0" * 64
    cache = digests.cache_file()
    cache.parent.mkdir(parents=True)
    cache.write_text(json.dumps({f"{shard.resolve()}|{digests.stat_key(shard)}": wrong}))
    placed = emit(source, tmp_path, cli)
    recorded = {f["name"]: f["sha256"] for f in
                json.loads((placed / "manifest.json").read_text())["source"]["files"]}
    assert recorded["model.safetensors"] == wrong  # the cache was trusted at emit
    found = problems(cli, placed, source)
    real = hashlib.sha256(shard.read_bytes()).hexdigest()
    assert found == [SOURCE_DIFFERS, f"source model.safetensors: sha256 {real[:16]}..., the "
                                     f"placement was made from {wrong[:16]}..."]
    text = cli("verify", placed, "--model", source, ok=False).output
    assert f"FAIL {SOURCE_DIFFERS}" in text
    assert digests.cached([shard]) == {shard: real}


def test_another_source_config_is_caught(source: Path, tmp_path: Path, cli) -> None:
    """config.json's bytes are recorded too (a key the fingerprint ignores changed)."""
    placed = emit(source, tmp_path, cli)
    config = json.loads((source / "config.json").read_text())
    (source / "config.json").write_text(json.dumps({**config, "_name_or_path": "elsewhere"}))
    found = problems(cli, placed, source)
    assert found[0] == SOURCE_DIFFERS and found[1].startswith("source config.json: ")
    assert len(found) == 2


def piece_at(manifest: dict, file: str, offset: int) -> tuple[dict, dict]:
    """The expert entry and piece of output `file` that holds byte `offset`."""
    for ex in manifest["experts"]:
        for page in ex["pages"]:
            for p in page["pieces"]:
                if p["file"] == file and p["offset"] <= offset < p["offset"] + p["length"]:
                    return ex, p
    raise AssertionError(f"no piece holds byte {offset} of {file}")


def source_offset(ex: dict, piece: dict, offset: int) -> int:
    """Where byte `offset` of the output holding `piece` came from in its source file."""
    o = piece["origin"]
    t = next(t for t in ex["tensors"] if t["name"] == o["tensor"])
    return t["source_offset"] - t["tensor_offset"] + o["start"] + offset - piece["offset"]


def flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


def test_a_flipped_output_byte_is_reported_at_its_offsets(source: Path, tmp_path: Path,
                                                          cli) -> None:
    placed = emit(source, tmp_path, cli)
    manifest = json.loads((placed / "manifest.json").read_text())
    cold = next(e for e in manifest["experts"] if e["cold"])["cold"]
    at = cold["offset"] + 37  # not the first byte of a piece: offset 0 would hide the bug
    flip(placed / cold["file"], at)
    ex, piece = piece_at(manifest, cold["file"], at)
    found = problems(cli, placed, source)
    assert found[0] == f"{cold['file']}: sha256 differs from the manifest's"
    assert len(found) == 2 and found[1].endswith(
        f"at byte {at} of {cold['file']} (byte {source_offset(ex, piece, at)} of "
        "model.safetensors)")
    assert f"({ex['layer']}, {ex['expert']})" in found[1]


def test_a_flipped_source_byte_is_reported_at_its_offsets(source: Path, tmp_path: Path,
                                                          cli) -> None:
    placed = emit(source, tmp_path, cli)
    manifest = json.loads((placed / "manifest.json").read_text())
    ex = next(e for e in manifest["experts"] if e["cold"] and e["resident_bytes"])
    page = next(p for p in ex["pages"] if not p["resident"])
    piece = page["pieces"][-1]
    at = piece["offset"] + piece["length"] - 3
    src = source_offset(ex, piece, at)
    flip(source / "model.safetensors", src)
    found = problems(cli, placed, source)
    assert found[0] == SOURCE_DIFFERS
    assert any(p.endswith(f"at byte {at} of {piece['file']} (byte {src} of model.safetensors)")
               for p in found), found


def test_a_padded_source_is_named(source: Path, tmp_path: Path, cli) -> None:
    """A byte appended to a shard: its header and every tensor are intact, its size is not."""
    placed = emit(source, tmp_path, cli)
    shard = source / "model.safetensors"
    size = shard.stat().st_size
    with open(shard, "ab") as f:
        f.write(b"\0")
    assert problems(cli, placed, source) == [
        SOURCE_DIFFERS, f"source model.safetensors: {size + 1} bytes, the placement was made "
                        f"from {size}"]


@pytest.mark.parametrize("which", ["manifest.json", "host0.safetensors", "source"])
def test_unreadable_files_are_one_line(source: Path, tmp_path: Path, cli, monkeypatch,
                                       which: str) -> None:
    from unreadable import deny_reads

    placed = emit(source, tmp_path, cli)
    path = source / "model.safetensors" if which == "source" else placed / which
    deny_reads(monkeypatch, path)
    result = cli("verify", placed, "--model", source, ok=False)
    # (for a non-root user safetensors' own open fails first on an output: "FAIL host0...:
    # not a readable safetensors file"; the patch reaches Python's opens only)
    assert result.exit_code == 1
    assert result.output.splitlines() == [f"error: permission denied: {path}"]


def test_placed_path_that_is_a_file(source: Path, tmp_path: Path, cli) -> None:
    junk = tmp_path / "junk.bin"
    junk.write_bytes(bytes(range(128, 256)))  # not UTF-8: read as a manifest, a traceback
    result = cli("verify", junk, "--model", source, ok=False)
    assert result.exit_code == 1
    assert result.output.splitlines() == [f"error: {junk} is not a directory (give the "
                                          "directory placer emit wrote)"]


def test_a_manifest_that_is_not_utf8_is_one_line(source: Path, tmp_path: Path, cli) -> None:
    """manifest.json replaced by bytes that are not UTF-8 (a UTF-16 byte-order mark, then
    half a character): one line naming it, no traceback."""
    placed = emit(source, tmp_path, cli)
    manifest = placed / "manifest.json"
    manifest.write_bytes(b"\xff\xfe{")
    assert_one_line_error(cli("verify", placed, "--model", source, ok=False), str(manifest),
                          "not UTF-8 text (byte 0xff at byte offset 0)")
