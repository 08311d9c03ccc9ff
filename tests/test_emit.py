"""emit + verify: placed files reassemble to the original bytes on every layout; every
corruption is caught; bad input leaves nothing behind."""

from __future__ import annotations

import copy
import errno
import fcntl
import json
import os
import random
import shutil
import signal
from pathlib import Path

import pytest
from cli_errors import assert_one_line_error
from placed_plans import mixed_plan
from safetensors import safe_open
from tiny_pipeline import write_sealed

from placer.checkpoint.inventory import read_inventory
from placer.checkpoint.tiny import quantize_layout


def source_stream(model: Path, expert) -> bytes:
    out = b""
    for t in expert.tensors:
        with open(model / t.file, "rb") as f:
            f.seek(t.offset)
            out += f.read(t.length)
    return out


def placed_stream(placed: Path, entry: dict) -> bytes:
    out = b""
    for page in entry["pages"]:
        for p in page["pieces"]:
            with open(placed / p["file"], "rb") as f:
                f.seek(p["offset"])
                out += f.read(p["length"])
    return out


@pytest.fixture(scope="module")
def layouts(tiny_models: dict[str, Path], tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("quantized")
    return {**tiny_models,
            "deepseek_v3-fp8": quantize_layout(tiny_models["deepseek_v3"], root / "fp8", "fp8"),
            "gpt_oss-mxfp4": quantize_layout(tiny_models["gpt_oss"], root / "mxfp4", "mxfp4")}


@pytest.mark.parametrize("name", ["qwen3_moe", "mixtral", "olmoe", "deepseek_v3", "gpt_oss",
                                  "deepseek_v3-fp8", "gpt_oss-mxfp4"])
def test_round_trip_is_bit_identical(name: str, layouts, tmp_path: Path, cli) -> None:
    model = layouts[name]
    plan = mixed_plan(model, tmp_path)
    placed = tmp_path / "placed"
    cli("emit", "--plan", plan, "--model", model, "--out", placed, "--align", "256")
    assert "ok:" in cli("verify", placed, "--model", model).output
    manifest = json.loads((placed / "manifest.json").read_text())
    inv = read_inventory(model)
    for entry in manifest["experts"]:
        expert = inv.expert(entry["layer"], entry["expert"])
        assert placed_stream(placed, entry) == source_stream(model, expert)
        if entry["cold"]:
            assert entry["cold"]["offset"] % 256 == 0
            assert entry["cold"]["length"] == entry["bytes"] - entry["resident_bytes"]
    for f in manifest["files"]:  # every output opens and every tensor reads back
        with safe_open(placed / f["name"], "pt") as st:
            for key in st.keys():
                st.get_tensor(key)
    # fully resident per-expert tensors keep their name, dtype and shape
    whole = [t for e in manifest["experts"] if e["resident_bytes"] == e["bytes"]
             and all(t["fused_shape"] is None for t in e["tensors"]) for t in e["tensors"]]
    if not name.startswith("gpt_oss"):
        assert whole
    card_tensors = {}
    for f in manifest["files"]:
        if f["kind"] == "card":
            with safe_open(placed / f["name"], "pt") as st:
                card_tensors.update({k: st.get_tensor(k) for k in st.keys()})
    for t in whole:
        with safe_open(model / t["source_file"], "pt") as st:
            assert card_tensors[t["name"]].equal(st.get_tensor(t["name"]))


@pytest.fixture
def placed(tiny_models, tmp_path: Path, cli) -> tuple[Path, Path]:
    model = tiny_models["qwen3_moe"]
    out = tmp_path / "placed"
    cli("emit", "--plan", mixed_plan(model, tmp_path), "--model", model, "--out", out)
    return out, model


def flip_byte(out: Path, file: str, offset: int, forge_sha: bool) -> None:
    """Flip the byte at `offset` of output `file` in placed directory `out` (and, with
    `forge_sha`, make the manifest's sha256 of the file match)."""
    import hashlib

    path = out / file
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))
    if forge_sha:
        manifest = json.loads((out / "manifest.json").read_text())
        for f in manifest["files"]:
            if f["name"] == file:
                f["sha256"] = hashlib.sha256(bytes(data)).hexdigest()
        write_sealed(manifest, out)


def flip_cold_byte(out: Path, at: int, forge_sha: bool) -> dict:
    """Flip byte `at` of the first cold part in `out`; the expert's manifest entry."""
    manifest = json.loads((out / "manifest.json").read_text())
    entry = next(e for e in manifest["experts"] if e["cold"])
    flip_byte(out, entry["cold"]["file"], entry["cold"]["offset"] + at, forge_sha)
    return entry


def test_verify_catches_a_flipped_byte(placed, cli) -> None:
    out, model = placed
    cold = flip_cold_byte(out, 3, forge_sha=False)["cold"]
    result = cli("verify", out, "--model", model, ok=False)
    assert result.exit_code == 1
    assert cold["file"] in result.output and "sha256" in result.output


def test_verify_catches_a_flipped_byte_with_matching_sha(placed, cli) -> None:
    """Even with the manifest's sha256 forged, the byte comparison names the tensor."""
    out, model = placed
    entry = flip_cold_byte(out, 0, forge_sha=True)
    result = cli("verify", out, "--model", model, ok=False)
    assert result.exit_code == 1
    assert entry["cold"]["tensor"] in result.output
    assert f"({entry['layer']}, {entry['expert']})" in result.output


def test_verify_hashes_bytes_no_piece_covers(placed, cli) -> None:
    """A flipped byte of padding between tensors: no piece compares it, the sha256 does."""
    out, model = placed
    path = out / "card0.safetensors"
    with open(path, "rb") as f:
        size = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(size))
    start = next(v["data_offsets"][0] for k, v in header.items() if k.startswith("pad."))
    flip_byte(out, path.name, 8 + size + start, forge_sha=False)
    result = cli("verify", out, "--model", model, "--json", ok=False)
    assert json.loads(result.output)["problems"] == ["card0.safetensors: sha256 differs from "
                                                     "the manifest's"]


def test_verify_names_an_output_the_manifest_does_not_list(placed, cli) -> None:
    out, model = placed
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["files"] = [f for f in manifest["files"] if f["name"] != "host1.safetensors"]
    write_sealed(manifest, out)
    result = cli("verify", out, "--model", model, ok=False)
    assert "host1.safetensors: holds pieces but is not among the manifest's files" \
        in result.output


def test_verify_catches_truncation_and_deletion(placed, cli) -> None:
    out, model = placed
    host = out / "host1.safetensors"
    host.write_bytes(host.read_bytes()[:-10])
    (out / "card0.safetensors").unlink()
    result = cli("verify", out, "--model", model, "--json", ok=False)
    assert result.exit_code == 1
    problems = json.loads(result.output)["problems"]
    assert any("host1.safetensors" in p and "truncated" in p for p in problems)
    assert any("card0.safetensors: missing" in p for p in problems)


def test_emit_refuses_another_model_and_non_empty_out(tiny_models, tmp_path: Path, cli) -> None:
    plan = mixed_plan(tiny_models["qwen3_moe"], tmp_path)
    out = tmp_path / "placed"
    result = cli("emit", "--plan", plan, "--model", tiny_models["olmoe"], "--out", out, ok=False)
    assert result.exit_code == 1 and "another model" in result.output
    assert not out.exists()
    out.mkdir()
    (out / "keep.txt").write_text("x")
    result = cli("emit", "--plan", plan, "--model", tiny_models["qwen3_moe"], "--out", out,
                 ok=False)
    assert "--force" in result.output
    cli("emit", "--plan", plan, "--model", tiny_models["qwen3_moe"], "--out", out / "sub")
    (out / "sub" / "notes").mkdir()  # a placement with a folder of the user's beside it
    for where, foreign in ((out, "'keep.txt'"), (out / "sub", "'notes'")):
        before = sorted(p.relative_to(out) for p in out.rglob("*"))
        result = cli("emit", "--plan", plan, "--model", tiny_models["qwen3_moe"], "--out",
                     where, "--force", ok=False)
        assert_one_line_error(result, "--force replaces only", code=1)
        assert (("is not a placement (its manifest.json has none)" in result.output)
                if where == out else (f"does not name ({foreign})" in result.output))
        assert sorted(p.relative_to(out) for p in out.rglob("*")) == before  # nothing deleted
    (out / "sub" / "notes").rmdir()
    cli("emit", "--plan", plan, "--model", tiny_models["qwen3_moe"], "--out", out / "sub",
        "--force", "--align", "256")
    assert json.loads((out / "sub" / "manifest.json").read_text())["align"] == 256


def test_a_full_disk_leaves_no_partial_output(tiny_models, tmp_path: Path, cli, monkeypatch
                                              ) -> None:
    import placer.placed.commit
    import placer.placed.emit
    import placer.placed.stream

    def full(*args):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(placer.placed.stream, "_write_all", full)
    out = tmp_path / "placed"
    result = cli("emit", "--plan", mixed_plan(tiny_models["qwen3_moe"], tmp_path), "--model",
                 tiny_models["qwen3_moe"], "--out", out, ok=False)
    assert result.exit_code == 1 and "No space left" in result.output
    assert not out.exists()


def test_a_write_failing_while_another_is_in_flight_leaves_nothing(tiny_models, tmp_path: Path,
                                                                    cli, monkeypatch) -> None:
    """8 KiB write buffers, so every output makes many writes, each on the io pool while the
    next buffer fills; the third fails: the emit stops, no fd is closed under a running write,
    nothing is left behind."""
    import placer.placed.commit
    import placer.placed.emit
    import placer.placed.stream

    monkeypatch.setattr(placer.placed.stream, "WRITE_BYTES", 8192)
    write, calls = placer.placed.stream._write_all, []

    def failing_third(fd, data, offset):
        calls.append(offset)
        if len(calls) == 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        write(fd, data, offset)

    monkeypatch.setattr(placer.placed.stream, "_write_all", failing_third)
    out = tmp_path / "placed"
    result = cli("emit", "--plan", mixed_plan(tiny_models["qwen3_moe"], tmp_path), "--model",
                 tiny_models["qwen3_moe"], "--out", out, ok=False)
    assert result.exit_code == 1 and "No space left" in result.output
    assert len(calls) >= 3 and not out.exists()


def test_a_failed_flush_while_writing_fails_the_emit(tiny_models, tmp_path: Path, cli,
                                                     monkeypatch) -> None:
    """Where the filesystem refuses O_DIRECT, outputs are fdatasynced every FLUSH_BYTES while
    written; an I/O error there (the disk refused the bytes) must fail the emit as the final
    fsync would, leaving nothing."""
    import placer.placed.commit
    import placer.placed.emit
    import placer.placed.stream

    calls = []

    def failing(fd):
        calls.append(fd)
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(placer.placed.stream, "set_direct", lambda fd, on: False)
    monkeypatch.setattr(placer.placed.stream, "FLUSH_BYTES", 4096)
    monkeypatch.setattr(os, "fdatasync", failing)
    out = tmp_path / "placed"
    result = cli("emit", "--plan", mixed_plan(tiny_models["qwen3_moe"], tmp_path), "--model",
                 tiny_models["qwen3_moe"], "--out", out, ok=False)
    assert calls and result.exit_code == 1 and "Input/output error" in result.output
    assert not out.exists()


def _recording_writes(monkeypatch, refuse_direct: bool = False) -> list[bool]:
    """Patch emit's writes to record whether each went through O_DIRECT (and, with
    `refuse_direct`, to fail those with EINVAL as some filesystems do at the first write)."""
    import placer.placed.commit
    import placer.placed.emit
    import placer.placed.stream

    direct, write = [], placer.placed.stream._write_all

    def recording(fd, data, offset):
        on = bool(fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT)
        direct.append(on)
        if on and refuse_direct:
            raise OSError(errno.EINVAL, "Invalid argument")
        write(fd, data, offset)

    monkeypatch.setattr(placer.placed.stream, "_write_all", recording)
    return direct


@pytest.mark.parametrize("direct", [True, False])
def test_emit_through_small_buffers_is_exact(direct: bool, tiny_models, tmp_path: Path, cli,
                                             monkeypatch) -> None:
    """3 KiB reads into 8 KiB write buffers: the header, tensors and padding all cross read
    and buffer boundaries, both buffers are reused many times, and the last write is padded
    for O_DIRECT and cut back."""
    import placer.placed.commit
    import placer.placed.emit
    import placer.placed.stream
    import placer.placed.verify

    monkeypatch.setattr(placer.placed.stream, "READ_BYTES", 3072)
    monkeypatch.setattr(placer.placed.stream, "WRITE_BYTES", 8192)
    monkeypatch.setattr(placer.placed.verify, "WRITE_BYTES", 4096)
    if not direct:
        monkeypatch.setattr(placer.placed.stream, "set_direct", lambda fd, on: False)
    writes = _recording_writes(monkeypatch)
    model, out = tiny_models["qwen3_moe"], tmp_path / "placed"
    cli("emit", "--plan", mixed_plan(model, tmp_path), "--model", model, "--out", out,
        "--align", "256")
    assert "ok:" in cli("verify", out, "--model", model).output
    if direct and not any(writes):
        pytest.skip(f"the filesystem of {tmp_path} refuses O_DIRECT")
    assert len(writes) > 20 and all(writes) == direct
    assert any(f.stat().st_size % 4096 for f in out.glob("*.safetensors"))
    manifest = json.loads((out / "manifest.json").read_text())
    entry, piece = next((e, p) for e in manifest["experts"] for page in e["pages"]
                        for p in page["pieces"]
                        if p["offset"] // 4096 < (p["offset"] + p["length"] - 1) // 4096)
    # the piece's last byte, in a later 4 KiB verify read than the piece's first
    flip_byte(out, piece["file"], piece["offset"] + piece["length"] - 1, forge_sha=True)
    result = cli("verify", out, "--model", model, ok=False)
    assert f"({entry['layer']}, {entry['expert']}) page" in result.output


def test_o_direct_refused_at_the_first_io_falls_back_to_buffered(tiny_models, tmp_path: Path,
                                                                    cli, monkeypatch) -> None:
    writes = _recording_writes(monkeypatch, refuse_direct=True)
    model, out = tiny_models["qwen3_moe"], tmp_path / "placed"
    cli("emit", "--plan", mixed_plan(model, tmp_path), "--model", model, "--out", out)
    if not any(writes):
        pytest.skip(f"the filesystem of {tmp_path} refuses O_DIRECT at open already")
    assert not all(writes)  # each refused direct write was retried buffered
    import placer.placed.verify

    read, reads = placer.placed.verify.pread_into, []

    def refusing(fd, buf, offset):
        on = bool(fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT)
        reads.append(on)
        if on:
            raise OSError(errno.EINVAL, "Invalid argument")
        return read(fd, buf, offset)

    monkeypatch.setattr(placer.placed.verify, "pread_into", refusing)
    assert "ok:" in cli("verify", out, "--model", model).output
    assert any(reads) and not all(reads)  # verify's direct reads, refused, were retried


def test_a_source_truncated_during_emit_is_an_error(tiny_models, tmp_path: Path, cli,
                                                    monkeypatch) -> None:
    """The checkpoint passed the header checks, then shrank before its bytes were copied:
    a clear error, nothing left behind."""
    import placer.placed.commit
    import placer.placed.emit
    import placer.placed.stream

    model = tmp_path / "model"
    shutil.copytree(tiny_models["qwen3_moe"], model)
    plan = mixed_plan(model, tmp_path)
    read = placer.placed.emit.read_inventory

    def read_then_truncate(path, **kwargs):
        inv = read(path, **kwargs)
        for f in model.glob("*.safetensors"):
            os.truncate(f, f.stat().st_size // 2)
        return inv

    monkeypatch.setattr(placer.placed.emit, "read_inventory", read_then_truncate)
    out = tmp_path / "placed"
    result = cli("emit", "--plan", plan, "--model", model, "--out", out, ok=False)
    assert result.exit_code == 1 and "ended early (was it truncated?)" in result.output
    assert not out.exists()


def test_schema_is_printed_and_enforced_on_read(placed, cli) -> None:
    schema = json.loads(cli("schema").output)
    assert schema["properties"]["format"]["const"] == "placer-manifest"
    out, model = placed
    manifest = json.loads((out / "manifest.json").read_text())
    del manifest["experts"][0]["cold"]
    write_sealed(manifest, out)
    result = cli("verify", out, "--model", model, ok=False)
    assert result.exit_code == 1 and "schema" in result.output and "experts/0" in result.output


def _leaves(node, path=()):
    """(path, value) of every scalar in a JSON document."""
    items = node.items() if isinstance(node, dict) else enumerate(node)
    for key, value in items:
        if isinstance(value, dict | list) and value:
            yield from _leaves(value, (*path, key))
        else:
            yield (*path, key), value


def _mutated(doc, path, value=None, delete=False):
    doc = copy.deepcopy(doc)
    node = doc
    for key in path[:-1]:
        node = node[key]
    if delete:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return doc


def test_the_compiled_schema_check_agrees_with_jsonschema(placed) -> None:
    """validate_manifest accepts what the compiled predicate accepts, so the two must agree:
    on the manifest, and on it with scalars replaced by other JSON types or keys dropped."""
    import jsonschema

    from placer.placed.manifest import _fast_check, manifest_schema

    fast = _fast_check()
    assert fast is not None, "the manifest schema uses a keyword compile_schema lacks"
    reference = jsonschema.Draft202012Validator(manifest_schema())
    out, _ = placed
    manifest = json.loads((out / "manifest.json").read_text())
    assert fast(manifest) and reference.is_valid(manifest)
    leaves = list(_leaves(manifest))
    rng = random.Random(0)
    values = [None, True, False, 0, 1, -1, 1.0, 2.5, "", "x", "a" * 64, [], {}, [1], {"a": 1}]
    cases = [_mutated(manifest, path, value) for path, _ in rng.sample(leaves, 25)
             for value in rng.sample(values, 3)]
    cases += [_mutated(manifest, path, delete=True) for path, _ in rng.sample(leaves, 20)
              if isinstance(path[-1], str)]
    verdicts = [(fast(case), reference.is_valid(case)) for case in cases]
    assert all(a == b for a, b in verdicts)
    assert 10 < sum(ok for ok, _ in verdicts) < len(cases) - 10  # both kinds were tried


def hidden_leftovers(out: Path) -> list[str]:
    """What an emit may leave beside or inside `out`: staging, old and lock siblings, temps."""
    names = [p.name for p in out.parent.iterdir() if p.name.startswith(f".{out.name}")]
    if out.is_dir():
        names += [p.name for p in out.iterdir() if p.name.startswith(".")]
    return names


def _signal_at_write(monkeypatch, signum: int, at: int = 3) -> list[int]:
    """8 KiB write buffers; the `at`-th write sends `signum` to the main thread (as kill
    would), then goes on writing."""
    import threading

    import placer.placed.commit
    import placer.placed.emit
    import placer.placed.stream

    monkeypatch.setattr(placer.placed.stream, "WRITE_BYTES", 8192)
    write, calls = placer.placed.stream._write_all, []

    def signalling(fd, data, offset):
        calls.append(offset)
        if len(calls) == at:
            signal.pthread_kill(threading.main_thread().ident, signum)
        write(fd, data, offset)

    monkeypatch.setattr(placer.placed.stream, "_write_all", signalling)
    return calls


class _Terminated(Exception):
    pass


@pytest.fixture
def sigterm_raises():
    """SIGTERM raises _Terminated in this test (pytest would die of it otherwise); the test's
    handler, which emit must give back."""

    def handler(signum, frame):
        raise _Terminated

    previous = signal.signal(signal.SIGTERM, handler)
    yield handler
    signal.signal(signal.SIGTERM, previous)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_force_interrupted_keeps_the_old_placement(signum, placed, tmp_path: Path, cli,
                                                   monkeypatch, sigterm_raises) -> None:
    out, model = placed
    before = (out / "manifest.json").read_text()
    calls = _signal_at_write(monkeypatch, signum)
    result = cli("emit", "--plan", tmp_path / "plan.json", "--model", model, "--out", out,
                 "--force", "--align", "256", ok=False)
    assert result.exit_code in (1, 130, 143) and len(calls) >= 3  # aborted (143: SIGTERM)
    assert (out / "manifest.json").read_text() == before
    assert "ok:" in cli("verify", out, "--model", model).output
    assert hidden_leftovers(out) == []
    assert signal.getsignal(signal.SIGTERM) is sigterm_raises


def test_fresh_emit_terminated_leaves_nothing(tiny_models, tmp_path: Path, cli, monkeypatch,
                                              sigterm_raises) -> None:
    model, out = tiny_models["qwen3_moe"], tmp_path / "placed"
    _signal_at_write(monkeypatch, signal.SIGTERM)
    result = cli("emit", "--plan", mixed_plan(model, tmp_path), "--model", model, "--out", out,
                 ok=False)
    assert result.exit_code in (1, 130, 143)  # 143: SIGTERM, 128 + 15
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.json"]


def test_emits_leave_no_hidden_files_and_respect_the_umask(tiny_models, tmp_path: Path, cli
                                                           ) -> None:
    model, out = tiny_models["qwen3_moe"], tmp_path / "placed"
    plan = mixed_plan(model, tmp_path)
    old = os.umask(0o022)
    try:
        cli("emit", "--plan", plan, "--model", model, "--out", out)
        assert hidden_leftovers(out) == []
        assert oct((out / "manifest.json").stat().st_mode & 0o777) == oct(0o644)
        os.umask(0o027)
        cli("emit", "--plan", plan, "--model", model, "--out", out, "--force", "--align", "256")
    finally:
        os.umask(old)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["placed", "plan.json"]
    assert hidden_leftovers(out) == []
    assert oct((out / "manifest.json").stat().st_mode & 0o777) == oct(0o640)
    assert json.loads((out / "manifest.json").read_text())["align"] == 256


def _tree_digest(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*"))
            if p.is_file()}


def test_emit_refuses_an_out_inside_equal_to_or_holding_the_model(tiny_models, tmp_path: Path,
                                                                  cli) -> None:
    model = tmp_path / "ckpt" / "model"
    shutil.copytree(tiny_models["qwen3_moe"], model)
    plan = mixed_plan(model, tmp_path)
    before = _tree_digest(tmp_path / "ckpt")
    link = tmp_path / "link"
    link.symlink_to(model)
    cases = [(model, "is inside the checkpoint"), (model / "placed", "is inside the checkpoint"),
             (link, "is inside the checkpoint"), (tmp_path / "ckpt", "holds the checkpoint")]
    for out, needle in cases:
        result = cli("emit", "--plan", plan, "--model", model, "--out", out, "--force", ok=False)
        lines = result.output.strip().splitlines()
        assert result.exit_code == 1 and len(lines) == 1 and needle in lines[0], result.output
    assert _tree_digest(tmp_path / "ckpt") == before


def test_a_full_disk_during_force_keeps_the_old_placement(placed, tmp_path: Path, cli,
                                                          monkeypatch) -> None:
    import placer.placed.commit
    import placer.placed.emit
    import placer.placed.stream

    out, model = placed
    before = (out / "manifest.json").read_text()
    monkeypatch.setattr(placer.placed.stream, "WRITE_BYTES", 8192)
    write, calls = placer.placed.stream._write_all, []

    def full_at_fifth(fd, data, offset):
        calls.append(offset)
        if len(calls) == 5:
            raise OSError(errno.ENOSPC, "No space left on device")
        write(fd, data, offset)

    monkeypatch.setattr(placer.placed.stream, "_write_all", full_at_fifth)
    result = cli("emit", "--plan", tmp_path / "plan.json", "--model", model, "--out", out,
                 "--force", "--align", "256", ok=False)
    assert result.output.strip() == (f"error: writing {out} failed: No space left on device "
                                     "(nothing was left behind; the old placement is unchanged)")
    assert (out / "manifest.json").read_text() == before
    assert hidden_leftovers(out) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["placed", "plan.json"]


def test_the_space_check_counts_the_new_placement_beside_the_old(placed, tmp_path: Path, cli,
                                                                 monkeypatch) -> None:
    """--force writes the new placement beside the old, which stays until the swap: what is
    needed is every new output's bytes (each may pass its end by one O_DIRECT block)."""
    import placer.placed.commit
    import placer.placed.emit
    import placer.placed.stream
    from placer.units import format_bytes

    out, model = placed
    manifest = json.loads((out / "manifest.json").read_text())
    need = sum(f["size"] + 4096 for f in manifest["files"])  # the same plan and align again
    free = [need - 1]
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(placer.placed.commit.shutil, "disk_usage",
                        lambda path: usage._replace(free=free[0]))
    args = ["emit", "--plan", tmp_path / "plan.json", "--model", model, "--out", out, "--force"]
    result = cli(*args, ok=False)
    assert result.output.strip() == (
        f"error: not enough disk space for {out}: the new placement needs {format_bytes(need)} "
        f"beside the old one, which stays until the new one is complete; "
        f"{format_bytes(need - 1)} free")
    assert "ok:" in cli("verify", out, "--model", model).output
    free[0] = need
    cli(*args)


def test_a_second_emit_into_the_same_out_is_refused(placed, tmp_path: Path, cli,
                                                    monkeypatch) -> None:
    """One emit holds --out's lock (its first write waits); another is refused in one line,
    the first completes, and the lock file goes with it."""
    import threading

    import placer.placed.commit
    import placer.placed.emit
    import placer.placed.stream
    from placer.placed.verify import verify_placed
    from placer.plan.placement import read_plan

    out, model = placed
    write, started, release = placer.placed.stream._write_all, threading.Event(), threading.Event()

    def waiting(fd, data, offset):
        started.set()
        release.wait(10)
        write(fd, data, offset)

    monkeypatch.setattr(placer.placed.stream, "_write_all", waiting)
    first = threading.Thread(target=placer.placed.emit.emit_placement,
                             args=(read_plan(tmp_path / "plan.json"), model, out),
                             kwargs={"align": 256, "force": True})
    first.start()
    try:
        assert started.wait(10)
        result = cli("emit", "--plan", tmp_path / "plan.json", "--model", model, "--out", out,
                     "--force", ok=False)
    finally:
        release.set()
        first.join(10)
    lock = tmp_path / ".placed.placer-lock"
    assert result.output.strip() == (f"error: another emit is writing {out} (it holds {lock}); "
                                     "wait for it to finish")
    assert verify_placed(out, model).ok
    assert json.loads((out / "manifest.json").read_text())["align"] == 256
    assert hidden_leftovers(out) == []


def test_what_a_killed_swap_left_is_recovered(placed, tmp_path: Path, cli, monkeypatch) -> None:
    """Killed between moving the old placement aside and moving the new one in (where the
    filesystem cannot exchange two directories): the next emit moves the old one back and
    removes the staged one; the swap by two renames then works."""
    import placer.placed.commit
    import placer.placed.emit
    import placer.placed.stream

    out, model = placed
    before = (out / "manifest.json").read_text()
    out.rename(tmp_path / ".placed.placer-old")
    (tmp_path / ".placed.placer-new").mkdir()
    (tmp_path / ".placed.placer-new" / "card0.safetensors").write_bytes(b"partial")
    args = ["emit", "--plan", tmp_path / "plan.json", "--model", model, "--out", out]
    assert "pass --force" in cli(*args, ok=False).output
    assert (out / "manifest.json").read_text() == before
    assert hidden_leftovers(out) == []
    monkeypatch.setattr(placer.placed.commit, "exchange", lambda a, b: False)
    cli(*args, "--force", "--align", "256")
    assert "ok:" in cli("verify", out, "--model", model).output
    assert json.loads((out / "manifest.json").read_text())["align"] == 256
    assert hidden_leftovers(out) == []


def test_an_existing_empty_out_is_kept(tiny_models, tmp_path: Path, cli) -> None:
    """An existing empty --out (a mount point, say) is written in place, not replaced."""
    model, out = tiny_models["qwen3_moe"], tmp_path / "placed"
    out.mkdir()
    inode = out.stat().st_ino
    cli("emit", "--plan", mixed_plan(model, tmp_path), "--model", model, "--out", out)
    assert out.stat().st_ino == inode and hidden_leftovers(out) == []
    assert "ok:" in cli("verify", out, "--model", model).output
