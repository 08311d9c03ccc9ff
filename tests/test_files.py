"""Atomic JSON writes (placer/files.py): the umask, special files, directories, read-only
places, long names, strict JSON; `--json` output and plan.json parse with a strict parser."""

from __future__ import annotations

import json
import math
import os
import stat
from pathlib import Path

import pytest

from placer.errors import PlacerError
from placer.files import strict_json, write_json_atomic


def strict_loads(text: str):
    """json.loads that refuses NaN, Infinity and -Infinity, as RFC 8259 parsers do."""

    def refuse(name: str):
        raise ValueError(f"not JSON: {name}")

    return json.loads(text, parse_constant=refuse)


@pytest.mark.parametrize("umask", [0o022, 0o077, 0o002])
def test_files_are_created_with_the_umask(umask: int, tmp_path: Path) -> None:
    old = os.umask(umask)
    try:
        write_json_atomic({"a": 1}, tmp_path / "plan.json")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "plan.json").stat().st_mode) == 0o666 & ~umask


def test_non_finite_floats_become_null(tmp_path: Path) -> None:
    doc = {"bound": math.nan, "gap": [math.inf, -math.inf, 1.5], "n": 3, "s": "NaN"}
    assert strict_json(doc) == {"bound": None, "gap": [None, None, 1.5], "n": 3, "s": "NaN"}
    write_json_atomic(doc, tmp_path / "p.json")
    assert strict_loads((tmp_path / "p.json").read_text()) == strict_json(doc)


def test_a_fifo_is_written_to_not_replaced(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # so the writer's open does not block
    try:
        write_json_atomic({"a": [1, 2]}, fifo)
        data = os.read(reader, 1 << 16)
    finally:
        os.close(reader)
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert json.loads(data) == {"a": [1, 2]}
    assert os.listdir(tmp_path) == ["pipe"]


def test_a_symlink_is_followed(tmp_path: Path) -> None:
    (tmp_path / "real.json").write_text("{}")
    (tmp_path / "link.json").symlink_to("real.json")
    write_json_atomic({"b": 2}, tmp_path / "link.json")
    assert (tmp_path / "link.json").is_symlink()
    assert json.loads((tmp_path / "real.json").read_text()) == {"b": 2}
    assert sorted(os.listdir(tmp_path)) == ["link.json", "real.json"]


def test_a_directory_is_refused_in_one_line(tmp_path: Path) -> None:
    with pytest.raises(PlacerError, match=r"^cannot write .*: it is a directory \(name a file\)$"):
        write_json_atomic({}, tmp_path)


def test_a_read_only_place_is_one_line(tmp_path: Path) -> None:
    if os.geteuid() == 0:  # root writes anywhere but a read-only filesystem: use /proc
        target = Path("/proc/placer-test.json")
    else:
        (tmp_path / "ro").mkdir(mode=0o500)
        target = tmp_path / "ro" / "plan.json"
    with pytest.raises(PlacerError, match=rf"^cannot write {target}: \w"):
        write_json_atomic({}, target)
    assert not target.exists()


def test_a_245_character_name_works(tmp_path: Path) -> None:
    path = tmp_path / ("p" * 240 + ".json")
    write_json_atomic({"c": 3}, path)
    assert json.loads(path.read_text()) == {"c": 3}
    assert os.listdir(tmp_path) == [path.name]
    write_json_atomic({"c": 4}, tmp_path / ("é" * 125 + ".json"))  # 254 bytes in UTF-8


def test_solve_json_and_plan_are_strict_json(tiny_models, tmp_path: Path, cli) -> None:
    """A solver without a bound (layer offload) has NaN bound and gap: both outputs say null."""
    plan = tmp_path / "plan.json"
    result = cli("solve", "--model", tiny_models["qwen3_moe"], "--hardware", "1x-rtx4090",
                 "--solver", "layer", "--offload", "0.3", "--out", plan, "--json")
    printed, written = strict_loads(result.output), strict_loads(plan.read_text())
    assert printed["solver"]["bound"] is None and printed["solver"]["gap"] is None
    assert written["solver"] == printed["solver"]


def test_solve_out_naming_a_directory_is_one_line(tiny_models, tmp_path: Path, cli) -> None:
    result = cli("solve", "--model", tiny_models["qwen3_moe"], "--hardware", "1x-rtx4090",
                 "--solver", "layer", "--offload", "0.3", "--out", tmp_path, ok=False)
    assert result.exit_code == 1
    assert result.output.strip() == (f"error: cannot write {tmp_path}: it is a directory "
                                     "(name a file)")
    assert os.listdir(tmp_path) == []


def test_a_directory_output_appears_whole_or_not_at_all(tmp_path):
    """directory_output: filled under a hidden sibling, renamed in at the end; on a failure
    or an interrupt the sibling and every parent folder it made are gone."""
    from placer.files import directory_output

    target = tmp_path / "new" / "deep" / "out"
    with directory_output(target) as temp:
        assert temp.parent == target.parent and temp.name.startswith(".out.")
        (temp / "a.txt").write_text("a")
        assert not target.exists()
    assert [p.name for p in target.iterdir()] == ["a.txt"]
    assert sorted(p.name for p in target.parent.iterdir()) == ["out"]
    for failure in (OSError(28, "No space left on device"), KeyboardInterrupt()):
        with pytest.raises(type(failure)), directory_output(tmp_path / "x" / "y" / "z") as temp:
            (temp / "part").write_text("half")
            raise failure
        assert sorted(p.name for p in tmp_path.iterdir()) == ["new"]


def test_a_directory_output_replaces_only_when_asked_and_only_when_complete(tmp_path):
    from placer.files import directory_output

    target = tmp_path / "out"
    target.mkdir()
    (target / "old").write_text("old")
    with pytest.raises(PlacerError, match="already exists"), directory_output(target):
        pass
    with pytest.raises(RuntimeError), directory_output(target, replace=True) as temp:
        (temp / "new").write_text("new")
        raise RuntimeError("midway")
    assert [p.name for p in target.iterdir()] == ["old"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    with directory_output(target, replace=True) as temp:
        (temp / "new").write_text("new")
    assert [p.name for p in target.iterdir()] == ["new"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_every_output_is_checked_against_every_input_and_each_other(tmp_path):
    """bench --spec-out could write into the second placed directory it reads: the check
    covered only the checkpoint."""
    from placer.files import check_outputs

    placed = [tmp_path / "placed-a", tmp_path / "placed-b"]
    for p in placed:
        p.mkdir()
    inputs = [("the checkpoint", None), *(("the placed directory", p) for p in placed),
              ("--prompts", tmp_path / "prompts.jsonl")]
    (tmp_path / "prompts.jsonl").write_text("{}\n")
    with pytest.raises(PlacerError, match="--spec-out .* is inside the placed directory"):
        check_outputs([("--spec-out", placed[1] / "box.toml")], inputs)
    with pytest.raises(PlacerError, match="--plot .* is --prompts"):
        check_outputs([("--spec-out", None), ("--plot", tmp_path / "prompts.jsonl")], inputs)
    with pytest.raises(PlacerError, match="--plot .* is also --spec-out"):
        check_outputs([("--spec-out", tmp_path / "x"), ("--plot", tmp_path / "x")], inputs)
    check_outputs([("--spec-out", tmp_path / "box.toml"), ("--plot", tmp_path / "b.png")],
                  inputs)
