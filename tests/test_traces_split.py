"""`placer traces split`: two valid trace datasets, every sequence whole on one side, the
source's metadata kept, seeded, by tag, and nothing left behind when it fails."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.dataset as ds
import pytest
from cli_errors import assert_one_line_error
from tiny_pipeline import invoke

import traces.storing.split
from traces.storing.profile import load_profile
from traces.storing.schema import PHASES, read_meta
from traces.storing.writer import TraceWriter

LAYERS, EXPERTS, TOP_K = (0, 2), 8, 2


def write_tagged(root: Path, tag: str, run_id: int, lengths: list[int], seed: int) -> None:
    """root/tag=<tag>/t.parquet: sequences of `lengths` tokens, prefill then decode rows."""
    meta = {"kind": "tokens", "fingerprint": "cafe", "num_layers": 3,
            "moe_layers": list(LAYERS), "experts_per_layer": EXPERTS, "top_k": TOP_K,
            "tag": tag, "run_id": run_id, "corpus_sha256": "ab" * 32}
    rng = np.random.default_rng(seed)
    (root / f"tag={tag}").mkdir(parents=True)
    writer = TraceWriter(root / f"tag={tag}" / "t.parquet", tag=tag, top_k=TOP_K, meta=meta,
                         row_group_rows=16)
    for i, n in enumerate(lengths):
        rows = n * len(LAYERS)
        experts = np.array([rng.choice(EXPERTS, TOP_K, replace=False) for _ in range(rows)])
        phase = np.repeat(np.where(np.arange(n) < 2, PHASES.index("prefill"),
                                   PHASES.index("decode")), len(LAYERS))
        writer.write(np.full(rows, (run_id << 32) + i), np.repeat(np.arange(n), len(LAYERS)),
                     rng.integers(0, 100, rows), phase, np.tile(LAYERS, n), experts,
                     rng.random((rows, TOP_K)).astype(np.float32))
    writer.close()


@pytest.fixture()
def source(tmp_path: Path) -> Path:
    root = tmp_path / "src"
    write_tagged(root, "chat", 1, [5, 9, 3, 7, 4, 6, 8, 5], seed=1)
    write_tagged(root, "code", 2, [6, 4, 10], seed=2)
    return root


def rows(trace_dir: Path) -> list[tuple]:
    """Every row of a trace directory, sorted: (seq_id, pos, layer, token, phase, experts,
    weights, tag)."""
    table = ds.dataset(str(trace_dir), format="parquet", exclude_invalid_files=True).to_table()
    cols = [table.column(c).to_pylist() for c in ("seq_id", "pos", "layer", "token", "phase",
                                                  "experts", "weights", "tag")]
    return sorted(tuple(map(lambda v: tuple(v) if isinstance(v, list) else v, r))
                  for r in zip(*cols, strict=True))


def split(source: Path, *args: object) -> dict:
    result = invoke("traces", "split", source, *args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_by_sequence_every_row_lands_once_with_its_sequence(source, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    report = split(source, "--out-a", a, "--out-b", b, "--fraction", "0.25", "--seed", "3")
    assert report["by"] == "sequence" and report["sequences"] == [3, 8]  # round(0.25 * 11)
    got_a, got_b = rows(a), rows(b)
    assert sorted(got_a + got_b) == rows(source)
    seqs_a, seqs_b = {r[0] for r in got_a}, {r[0] for r in got_b}
    assert not seqs_a & seqs_b and len(seqs_a) == 3
    assert report["tokens"] == [sum(r[2] == LAYERS[0] for r in got) for got in (got_a, got_b)]
    for out in (a, b):
        for f in out.rglob("*.parquet"):
            assert read_meta(f) == read_meta(source / f.relative_to(out))
    whole = load_profile(source, phase=None).counts
    assert np.array_equal(load_profile(a, phase=None).counts +
                          load_profile(b, phase=None).counts, whole)
    again = split(source, "--out-a", tmp_path / "a2", "--out-b", tmp_path / "b2", "--fraction",
                  "0.25", "--seed", "3")
    assert again["sequences"] == [3, 8] and rows(tmp_path / "a2") == got_a
    other = split(source, "--out-a", tmp_path / "a3", "--out-b", tmp_path / "b3", "--fraction",
                  "0.25", "--seed", "4")
    assert other["sequences"] == [3, 8] and rows(tmp_path / "a3") != got_a
    assert invoke("traces", "stats", a).exit_code == 0


def test_by_tag(source, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    report = split(source, "--out-a", a, "--out-b", b, "--tag", "code")
    assert report == {"by": "tag", "out_a": str(a), "out_b": str(b), "sequences": [3, 8],
                      "tokens": [20, 47], "files": [1, 1]}
    assert {r[7] for r in rows(a)} == {"code"} and {r[7] for r in rows(b)} == {"chat"}
    assert sorted(rows(a) + rows(b)) == rows(source)
    assert [p.relative_to(a) for p in a.rglob("*.parquet")] == [Path("tag=code/t.parquet")]


def test_refusals_are_one_line_and_write_nothing(source, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    b.mkdir()
    assert_one_line_error(invoke("traces", "split", source, "--out-a", a, "--out-b", b),
                          "already exists")
    b.rmdir()
    for args, said in ((["--tag", "nope"], "no tag 'nope'"),
                       (["--tag", "chat", "--tag", "code"], "one side would be empty"),
                       (["--fraction", "1.0"], "--fraction must be in (0, 1)")):
        assert_one_line_error(invoke("traces", "split", source, "--out-a", a, "--out-b", b,
                                     *args), said)
    assert_one_line_error(invoke("traces", "split", source, "--out-a", source / "x", "--out-b",
                                 b), "inside the trace directory")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]


def test_a_failure_midway_leaves_neither_output(source, tmp_path, monkeypatch):
    copied = []
    real = traces.storing.split._copy_rows

    def fail_late(src, target, keep):
        copied.append(target)
        if len(copied) == 3:
            raise OSError(28, "No space left on device")
        return real(src, target, keep)

    monkeypatch.setattr(traces.storing.split, "_copy_rows", fail_late)
    result = invoke("traces", "split", source, "--out-a", tmp_path / "a", "--out-b",
                    tmp_path / "b")
    assert_one_line_error(result, "No space left")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]


@pytest.mark.parametrize("inner", ["b", "a"])
def test_one_output_inside_the_other_is_refused_and_leaves_nothing(source, tmp_path, inner):
    """--out-b x/a/b beside --out-a x/a (or the other way) left x/a behind (made as the
    inner temporary's parent before the rename onto it failed)."""
    outer = tmp_path / "x" / "o"
    paths = {"a": outer / "in", "b": outer} if inner == "a" else {"a": outer, "b": outer / "in"}
    assert_one_line_error(invoke("traces", "split", source, "--out-a", paths["a"], "--out-b",
                                 paths["b"]), f"--out-{inner}", "cannot nest")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]


def test_a_failure_after_making_parent_folders_removes_them(source, tmp_path):
    """--out-a under new folders, --out-b under a regular file: refused before anything is
    made (placer.files.check_outputs; the split's own cleanup once removed the folders the
    first temporary made)."""
    (tmp_path / "file").write_text("not a folder")
    result = invoke("traces", "split", source, "--out-a", tmp_path / "new" / "deep" / "a",
                    "--out-b", tmp_path / "file" / "b")
    assert_one_line_error(result, f"--out-b {tmp_path / 'file' / 'b'}: {tmp_path / 'file'} is "
                          "not a directory")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "src"]


def test_the_split_does_not_follow_the_run_ids(tmp_path):
    """The same sequences under other run ids (another collection of the same corpora, its
    ids ordered the other way round) split the same way with the same seed: which sequence of
    which tag goes where does not depend on the ids the runs were given."""
    sides = []
    for name, ids in (("one", (1, 2)), ("other", (7, 3))):
        root = tmp_path / name
        write_tagged(root, "chat", ids[0], [5, 9, 3, 7, 4, 6, 8, 5], seed=1)
        write_tagged(root, "code", ids[1], [6, 4, 10], seed=2)
        traces.storing.split.split_traces(root, tmp_path / f"{name}-a", tmp_path / f"{name}-b",
                                          fraction=0.5, seed=3)
        sides.append(sorted({(r[-1], r[0] & 0xFFFFFFFF) for r in rows(tmp_path / f"{name}-a")}))
    assert sides[0] == sides[1]
    assert 0 < len(sides[0]) < 11
