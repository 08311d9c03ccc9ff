"""Answers that were wrong rather than crashes (issue 27): a verdict from one held-out
sequence, --robust refused where the README allows it, manifest file names that lead out of
the placed directory, a capacity of None, an interrupted emit that said nothing."""

from __future__ import annotations

import json
import shutil
import signal
import threading
from pathlib import Path

import pytest
from cli_errors import assert_one_line_error
from tiny_pipeline import BOX, Pipeline, build_pipeline, invoke, write_sealed


@pytest.fixture(scope="module")
def pipe(tmp_path_factory: pytest.TempPathFactory, prose: list[str]) -> Pipeline:
    return build_pipeline(tmp_path_factory.mktemp("results"), prose)


def intervals(obj: object) -> list:
    """Every `<figure>_ci95` value anywhere in `obj`."""
    if isinstance(obj, dict):
        return [v for k, v in obj.items() if k.endswith("_ci95")] + [
            x for k, v in obj.items() if not k.endswith("_ci95") for x in intervals(v)]
    if isinstance(obj, list):
        return [x for v in obj for x in intervals(v)]
    return []


@pytest.mark.parametrize("tokens", [1, 16], ids=["one token", "one sequence"])
def test_one_held_out_sequence_is_too_little_traffic(pipe: Pipeline, tmp_path: Path,
                                                     tokens: int) -> None:
    held = tmp_path / "held"
    invoke("collect", "--model", pipe.model, "--random-tokens", tokens, "--max-length", 16,
           "--seed", 5, "--out", held, "--no-progress")
    result = invoke("evaluate", pipe.plan, "--traces", held, "--concurrency", "1",
                    "--oracle-time-limit", 1, "--cache-slots", 2, "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert [r["verdict"] for r in report["results"]] == ["too little traffic"]
    assert all(r["interval_units"] == 1 for r in report["results"])
    found = intervals(report["results"]) + intervals(report["drift"])
    assert found and all(ci is None for ci in found)
    assert report["results"][0]["placement"]["stall_ms_per_step"] >= 0  # the point stays
    (verdict,) = report["verdicts"]
    assert verdict["verdict"] == "too little traffic" and verdict["ok"] is False
    assert any("fewer than 5: no interval can be estimated" in n for n in report["notes"])
    shown = invoke("evaluate", pipe.plan, "--traces", held, "--concurrency", "1",
                   "--oracle-time-limit", 1, "--verbose").stdout  # the full tables
    assert "too little traffic" in shown and "± ?" in shown and "WORSE" not in shown


def test_five_held_out_sequences_get_intervals_again(pipe: Pipeline, tmp_path: Path) -> None:
    held = tmp_path / "held"
    invoke("collect", "--model", pipe.model, "--random-tokens", 80, "--max-length", 16,
           "--seed", 6, "--out", held, "--no-progress")
    result = invoke("evaluate", pipe.plan, "--traces", held, "--concurrency", "1",
                    "--oracle-time-limit", 1, "--json")
    (row,) = json.loads(result.stdout)["results"]
    assert row["interval_units"] == 5 and row["verdict"] != "too little traffic"
    assert all(ci is not None for ci in intervals(row))


def test_robust_over_one_traces_set_at_several_concurrencies(pipe: Pipeline,
                                                             tmp_path: Path) -> None:
    """The README: --robust needs two --traces sets, or one set at several concurrencies (the
    pipeline's traffic has 4 sequences: B = 1 and 2)."""
    base = ["solve", "--model", pipe.model, "--hardware", BOX, "--traces", pipe.traces,
            "--offload", 0.5, "--solver", "greedy", "--steps", 16, "--robust",
            "--time-limit", 5]
    result = invoke(*base, "--concurrency", "1,2", "--out", tmp_path / "plan.json", "--json")
    assert result.exit_code == 0, result.output
    ratios = json.loads(result.stdout)["robust"]["ratios"]
    assert len(ratios) == 2 and all(r <= 1.0 + 1e-9 for r in ratios.values())
    one = invoke(*base, "--concurrency", "1", "--out", tmp_path / "one.json")
    assert_one_line_error(one, "needs at least two scenarios to be robust across")
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    assert "or one set at several concurrencies" in readme


def placed_copy(pipe: Pipeline, tmp_path: Path) -> tuple[Path, dict]:
    placed = Path(shutil.copytree(pipe.placed, tmp_path / "placed"))
    return placed, json.loads((placed / "manifest.json").read_text())


def first_piece(manifest: dict) -> dict:
    return next(p for e in manifest["experts"] for page in e["pages"] for p in page["pieces"])


NAMES = {
    "files[0].name": lambda m, bad: m["files"][0].__setitem__("name", bad),
    "source.files[0].name": lambda m, bad: m["source"]["files"][0].__setitem__("name", bad),
    "a piece's file": lambda m, bad: first_piece(m).__setitem__("file", bad),
    "a piece's source_file": lambda m, bad: first_piece(m)["origin"].__setitem__(
        "source_file", bad),
}


@pytest.mark.parametrize("bad", ["../model/model.safetensors", "/etc/hostname", "..", "a/b"])
@pytest.mark.parametrize("field", sorted(NAMES))
def test_manifest_file_names_stay_in_their_directory(pipe: Pipeline, tmp_path: Path,
                                                     field: str, bad: str) -> None:
    placed, manifest = placed_copy(pipe, tmp_path)
    NAMES[field](manifest, bad)
    write_sealed(manifest, placed)
    for args in (["verify", placed, "--model", pipe.model],
                 ["run", placed, "--model", pipe.model, "--prompt", "Hi", "--max-new-tokens", 1,
                  "--device", "cpu"]):
        assert_one_line_error(invoke(*args), "manifest does not match its schema",
                              "plain file name")


def test_a_card_outside_the_manifest_is_named(pipe: Pipeline, tmp_path: Path) -> None:
    placed, manifest = placed_copy(pipe, tmp_path)
    manifest["experts"][0]["card"] = 7
    write_sealed(manifest, placed)
    result = invoke("verify", placed, "--model", pipe.model, "--json")
    problems = json.loads(result.stdout)["problems"]
    assert "card 7: homes experts but is not among the manifest's cards [0, 1]" in problems
    assert not any("None" in p for p in problems)


def test_an_interrupted_emit_says_so_in_one_line(pipe: Pipeline, tmp_path: Path,
                                                 monkeypatch) -> None:
    """Ctrl-C while the outputs are written: the emit removes what it wrote, and says so in
    one line with exit status 130 (click's KeyboardInterrupt handling exited 130, silently)."""
    import placer.placed.stream

    write, calls = placer.placed.stream._write_all, []

    def interrupting(fd, data, offset):
        calls.append(offset)
        if len(calls) == 2:
            signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
        write(fd, data, offset)

    monkeypatch.setattr(placer.placed.stream, "WRITE_BYTES", 4096)
    monkeypatch.setattr(placer.placed.stream, "_write_all", interrupting)
    result = invoke("emit", "--plan", pipe.plan, "--model", pipe.model, "--out",
                    tmp_path / "placed")
    assert_one_line_error(result, "interrupted by SIGINT", code=130)
    assert len(calls) >= 2 and sorted(p.name for p in tmp_path.iterdir()) == []
