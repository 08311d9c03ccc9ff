"""manifest.json proves itself (issue #53 item 3): emit seals it with a digest of its own bytes
(placer.plan.seal), every reader checks it first, and any change to any byte of it is one
line naming the file and the field, exit 1, never a traceback."""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from cli_errors import assert_one_line_error
from placed_plans import write_plan
from tiny_pipeline import Pipeline, build_pipeline, invoke, write_sealed

from placer.checkpoint.inventory import read_inventory
from placer.checkpoint.tiny import build_tiny_model
from placer.errors import PlacerError
from placer.placed.verify import verify_placed
from placer.plan.seal import canonical, file_digest


@pytest.fixture(scope="module")
def pipe(tmp_path_factory: pytest.TempPathFactory, prose: list[str]) -> Pipeline:
    return build_pipeline(tmp_path_factory.mktemp("seal"), prose)


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory, prose: list[str]) -> tuple[Path, Path]:
    """(placed directory, checkpoint) of the smallest real emit: one MoE layer of two
    experts, one resident and one cold, on two cards (a manifest of about 12 KB)."""
    root = tmp_path_factory.mktemp("seal-small")
    model = build_tiny_model("mixtral", root / "model", texts=prose[:200], layers=1,
                             experts=2, top_k=1, hidden=16, vocab=300)
    plan = write_plan(read_inventory(model), root, np.array([[1, 0]]), np.full(2, 1 << 26),
                      np.zeros(2, int), page_size=None)
    result = invoke("emit", "--plan", plan, "--model", model, "--out", root / "placed")
    assert result.exit_code == 0, result.output
    return root / "placed", model


def placed_copy(pipe: Pipeline, tmp_path: Path) -> Path:
    return Path(shutil.copytree(pipe.placed, tmp_path / "placed"))


def readers(placed: Path, model: Path) -> list[list]:
    """Every command that reads a placed directory's manifest."""
    return [["verify", placed, "--model", model], ["verify", placed],
            ["run", placed, "--model", model, "--prompt", "Hi", "--max-new-tokens", 1,
             "--device", "cpu"],
            ["serve", placed, "--model", model, "--device", "cpu"],
            ["export", "llamacpp", placed / "manifest.json"],
            ["export", "trtllm", placed, "--out", placed.parent / "trtllm.yaml"]]


def test_a_clean_emit_carries_its_digest_and_verifies(pipe: Pipeline) -> None:
    raw = (pipe.placed / "manifest.json").read_bytes()
    manifest = json.loads(raw)
    digest = manifest["digest"]
    assert manifest["version"] == 3 and list(manifest)[-1] == "digest"
    assert digest["algorithm"] == "sha256"
    # what docs/manifest.md tells a loader author to recompute, from the bytes alone
    assert raw.count(digest["value"].encode()) == 1
    zeroed = raw.replace(digest["value"].encode(), b"0" * 64)
    assert hashlib.sha256(zeroed).hexdigest() == digest["value"] == file_digest(raw,
                                                                                digest["value"])
    assert set(digest["fields"]) == set(manifest) - {"digest"}
    assert all(digest["fields"][k] == hashlib.sha256(canonical(v)).hexdigest()
               for k, v in manifest.items() if k != "digest")
    result = invoke("verify", pipe.placed, "--model", pipe.model)
    assert result.exit_code == 0 and result.output.startswith("ok: "), result.output


def test_a_renamed_source_tensor_is_one_line_naming_experts(pipe: Pipeline,
                                                            tmp_path: Path) -> None:
    """One flipped bit (r -> s) in a source tensor name of an expert: was a 50-line KeyError."""
    placed = placed_copy(pipe, tmp_path)
    path = placed / "manifest.json"
    raw = path.read_bytes()
    at = raw.index(b'"name": "model.layers.2.mlp.experts.') + len(b'"name": "model.laye')
    assert raw[at:at + 1] == b"r"
    path.write_bytes(raw[:at] + bytes([raw[at] ^ 1]) + raw[at + 1:])
    assert b"model.layess.2" in path.read_bytes()
    for args in readers(placed, pipe.model):
        assert_one_line_error(invoke(*args), f"{path}: changed after emit",
                              "field experts differs from digest.fields.experts")


def test_two_changed_digits_of_a_predicted_figure_are_one_line_naming_predicted(
        pipe: Pipeline, tmp_path: Path) -> None:
    """Two digits of tokens_per_s changed: was exit 0, the manifest's bytes covered by
    nothing."""
    placed = placed_copy(pipe, tmp_path)
    path = placed / "manifest.json"
    text = path.read_text()
    match = re.compile(r'"tokens_per_s": (\d)(\d)').search(text, text.index('"predicted"'))
    digits = "".join(str((int(d) + 1) % 10) for d in match.groups())
    path.write_text(text[:match.start(1)] + digits + text[match.end(2):])
    assert json.loads(path.read_text())["predicted"] != json.loads(text)["predicted"]
    for args in readers(placed, pipe.model):
        assert_one_line_error(invoke(*args), f"{path}: changed after emit",
                              "field predicted differs from digest.fields.predicted")


def test_reformatting_or_a_changed_digest_is_one_line(pipe: Pipeline, tmp_path: Path) -> None:
    """Changes no field's content shows: the bytes still differ from what the digest covers."""
    placed = placed_copy(pipe, tmp_path)
    path = placed / "manifest.json"
    raw = path.read_bytes()
    value = json.loads(raw)["digest"]["value"]
    for changed in (raw.replace(b'\n "align"', b'\n\t"align"'),  # whitespace only
                    json.dumps(json.loads(raw)).encode(),           # reformatted whole
                    raw.replace(value.encode(), value[::-1].encode())):  # the digest itself
        path.write_bytes(changed)
        assert_one_line_error(invoke("verify", placed, "--model", pipe.model),
                              f"{path}: changed after emit: its sha256 is not digest.value")


def test_a_manifest_without_its_digest_is_one_line(pipe: Pipeline, tmp_path: Path) -> None:
    placed = placed_copy(pipe, tmp_path)
    path = placed / "manifest.json"
    manifest = json.loads(path.read_text())
    digest = manifest.pop("digest")
    path.write_text(json.dumps(manifest))
    assert_one_line_error(invoke("verify", placed), "digest: missing")
    for version in (1, 2):  # written before manifests carried a digest
        path.write_text(json.dumps({**manifest, "version": version}))
        for args in readers(placed, pipe.model):
            assert_one_line_error(invoke(*args), f"a version {version} manifest",
                                  "re-emit the placement")
    for bad, field in (([], "digest: expected an object"),
                       ({**digest, "algorithm": "md5"}, "digest.algorithm: expected 'sha256'"),
                       ({**digest, "value": digest["value"].upper()}, "digest.value: expected"),
                       ({**digest, "fields": None}, "digest.fields: expected an object")):
        path.write_text(json.dumps({**manifest, "digest": bad}))
        assert_one_line_error(invoke("verify", placed, "--model", pipe.model), field)


def _other_value(byte: int, i: int) -> int:
    """A byte other than `byte`: JSON's structural and string characters, whitespace, a
    digit, a letter, non-ASCII, in turn along the file."""
    choices = [c for c in b' \t\n"\\{}[],:0-9aeE.\x00\x7f\xc3\xff' if c != byte]
    return choices[i % len(choices)]


def test_every_byte_of_a_manifest_changed_is_one_line_error(small: tuple[Path, Path]) -> None:
    """Every byte of a real manifest flipped (its lowest bit; every eleventh byte also set to
    another value): verify (in-process, as the CLI calls it; about a millisecond each)
    refuses each in one line naming the file, never passes and never raises anything but its
    one-line error."""
    placed, model = small
    path = placed / "manifest.json"
    raw = path.read_bytes()
    failures = []
    fd = os.open(path, os.O_WRONLY)
    try:
        for i, byte in enumerate(raw):
            for value in (byte ^ 1, _other_value(byte, i))[:1 + (i % 11 == 0)]:
                os.pwrite(fd, bytes([value]), i)
                try:
                    report = verify_placed(placed, model)
                    failures.append((i, value, "passed" if report.ok else report.problems))
                except PlacerError as exc:
                    if "\n" in str(exc) or not str(exc).startswith(str(path)):
                        failures.append((i, value, str(exc)))
                except Exception as exc:  # noqa: BLE001 - any other is the failure
                    failures.append((i, value, repr(exc)))
            os.pwrite(fd, bytes([byte]), i)
    finally:
        os.close(fd)
        path.write_bytes(raw)
    assert not failures, f"{len(failures)} changes: {failures[:5]}"
    assert verify_placed(placed, model).ok


def test_changed_bytes_through_the_cli_are_one_error_line(small: tuple[Path, Path]) -> None:
    """A sample of the above through `placer verify`: exit 1, one `error:` line."""
    placed, model = small
    path = placed / "manifest.json"
    raw = path.read_bytes()
    try:
        for i in range(0, len(raw), 97):
            path.write_bytes(raw[:i] + bytes([raw[i] ^ 0x10]) + raw[i + 1:])
            assert_one_line_error(invoke("verify", placed, "--model", model), str(path))
    finally:
        path.write_bytes(raw)


def _leaves(node, path=()):
    """(path, value) of every scalar (and empty container) of a JSON document."""
    for key, value in (node.items() if isinstance(node, dict) else enumerate(node)):
        if isinstance(value, dict | list) and value:
            yield from _leaves(value, (*path, key))
        else:
            yield (*path, key), value


def test_a_sealed_manifest_that_lies_is_reported_not_raised(small: tuple[Path, Path],
                                                            tmp_path: Path) -> None:
    """Behind the digest: a manifest sealed as emit seals it but with a field changed (a faulty
    or hostile emitter) is a verify problem or a one-line error, never a traceback."""
    placed, model = small
    placed = Path(shutil.copytree(placed, tmp_path / "placed"))
    original = json.loads((placed / "manifest.json").read_text())
    del original["digest"]
    leaves = [(p, v) for p, v in _leaves(original) if p[0] != "digest"]
    values = [None, -1, 0, 2**40, 1.5, "x", "", [], {}, True]

    def sealed(path: tuple, value: object) -> dict:
        doc = json.loads(json.dumps(original))
        node = doc
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
        return doc

    piece = ("experts", 0, "pages", 0, "pieces", 0, "origin", "source_file")
    tensor = ("experts", 0, "tensors", 0, "name")
    cases = [(piece, "x"), (tensor, "x")] + [
        (p, random.Random(n).choice(values)) for n, (p, _) in
        enumerate(random.Random(0).sample(leaves, 40))]
    for path, value in cases:
        write_sealed(sealed(path, value), placed)
        try:
            report = verify_placed(placed, model)
        except PlacerError as exc:
            assert "\n" not in str(exc), (path, value, exc)
        else:
            if path in (piece, tensor):
                assert not report.ok, report.problems
    write_sealed(sealed(tensor, "x"), placed)
    assert verify_placed(placed, model).problems == [
        "expert (0, 0): tensors[0].name differs from the model's"]


@pytest.mark.parametrize(("path", "value", "problem"), [
    (("experts", 0, "tensors", 0, "shape", 0), 31,
     "expert (0, 0): tensors[0].shape differs from the model's"),
    (("experts", 0, "pages", 0, "pieces", 1, "tensor"), "x",
     "card0.safetensors: tensor x named by the manifest is absent")])
def test_run_refuses_a_sealed_manifest_that_lies_in_one_line(small: tuple[Path, Path],
                                                             tmp_path: Path, path: tuple,
                                                             value: object, problem: str) -> None:
    """Were a RuntimeError from a tensor view and a KeyError from the loader."""
    placed, model = small
    placed = Path(shutil.copytree(placed, tmp_path / "placed"))
    manifest = json.loads((placed / "manifest.json").read_text())
    node = manifest
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    write_sealed(manifest, placed)
    for args in readers(placed, model)[2:4]:  # run, serve
        assert_one_line_error(invoke(*args), f"{placed / 'manifest.json'}: {problem}")
    assert problem in invoke("verify", placed, "--model", model).output
