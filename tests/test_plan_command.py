"""`placer plan` in-process on a tiny model: a stage that fails leaves the stages before it
recorded and nothing of its own, and the rerun resumes after them; an output under --out
that placer plan did not write is never replaced; --json says which stages ran."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_errors import assert_one_line_error
from tiny_pipeline import BOX, invoke

import placer.plan.solve
from placer.checkpoint.tiny import build_tiny_model
from placer.errors import PlacerError


@pytest.fixture(scope="module")
def user(tmp_path_factory: pytest.TempPathFactory, prose: list[str]) -> tuple[Path, Path]:
    """A tiny checkpoint and a corpus of 12 prose documents."""
    root = tmp_path_factory.mktemp("plan")
    model = build_tiny_model("qwen3_moe", root / "model", texts=prose[:200])
    corpus = root / "prose.jsonl"
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in prose[:12]))
    return model, corpus


def plan(user: tuple[Path, Path], out: Path, *extra: object):
    model, corpus = user
    return invoke("plan", "--model", model, "--corpus", corpus, "--hardware", BOX, "--out",
                  out, "--offload", 0.5, "--solver", "greedy", "--max-length", 24,
                  "--oracle-time-limit", 1, "--concurrency", "1,2", *extra)


def test_a_failing_stage_keeps_the_stages_before_it_and_the_rerun_resumes(user, tmp_path,
                                                                           monkeypatch):
    out = tmp_path / "out"

    def no_solve(*args, **kwargs):
        raise PlacerError("the solver gave up")

    with monkeypatch.context() as m:
        m.setattr(placer.plan.solve, "solve_plan", no_solve)
        failed = plan(user, out)
    assert failed.exit_code == 1 and "Traceback" not in failed.output
    assert failed.stderr.splitlines() == ["error: the solver gave up"]
    assert failed.stdout.splitlines()[-1] == "[3/5] solve ..."
    assert sorted(p.name for p in out.iterdir()) == ["split", "stages.json", "traces"]
    assert sorted(json.loads((out / "stages.json").read_text())) == ["collect", "split"]
    result = plan(user, out, "--json")
    assert result.exit_code == 0, result.output
    ran = json.loads(result.stdout)
    assert {k: v["skipped"] for k, v in ran["stages"].items()} == {
        "collect": True, "split": True, "solve": False, "evaluate": False, "export": False}
    assert ran["command"].startswith(f"placer emit --plan {out / 'plan.json'}")
    assert {r["concurrency"] for r in ran["report"]["results"]} == {1, 2}
    assert (out / "run.sh").read_text().splitlines()[-1] == ran["command"]
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # no temporaries


def test_an_output_it_did_not_write_is_never_replaced(user, tmp_path):
    out = tmp_path / "out"
    (out / "traces").mkdir(parents=True)
    (out / "traces" / "mine.txt").write_text("the user's")
    assert_one_line_error(plan(user, out), f"{out / 'traces'} exists and placer plan did "
                                           "not write it")
    assert (out / "traces" / "mine.txt").read_text() == "the user's"
    assert sorted(p.name for p in out.iterdir()) == ["traces"]


@pytest.mark.parametrize(("extra", "said"), [
    (["--fraction", "1"], "--fraction must be in (0, 1), got 1"),
    (["--engine", "vllm"], "--engine must be one of placer, llamacpp"),
    (["--seed", "-1"], "--seed"),
    (["--budget", "1e30TiB"], "--budget"),                          # solve's range check
    (["--budget", "1MiB"], "give --budget or --offload, not both"),  # beside --offload 0.5
    (["--llamacpp-version", "b12000"], "--llamacpp-version is for --engine llamacpp"),
    (["--cache-policy", "fifo"], "--cache-policy must be auto or one of"),
    (["--solver", "simplex"], "--solver must be one of"),
    (["--execution", "cpu", "--page-size", "1KiB"], "--page-size is for staging"),
    (["--oracle-time-limit", "-1"], "--oracle-time-limit"),
    (["--mode", "chat"], "--mode must be one of"),
])
def test_bad_options_are_refused_before_any_stage(user, tmp_path, extra, said, monkeypatch):
    """Each refused by the check its own command runs, before collect starts: --out is left
    as it was (not made)."""
    import traces.collecting.collect

    def no_collect(*args, **kwargs):
        raise AssertionError("collect ran before the options were checked")

    monkeypatch.setattr(traces.collecting.collect, "collect", no_collect)
    assert_one_line_error(plan(user, tmp_path / "out", *extra), said)
    assert not (tmp_path / "out").exists()


def test_the_same_inputs_and_seed_give_the_same_files_byte_for_byte(user, tmp_path,
                                                                    monkeypatch):
    """Two runs of one `plan` (in two folders, --out named alike) write the same traces,
    split, plan, evaluation and record, byte for byte."""
    model, corpus = user
    files = []
    for run in ("a", "b"):
        (tmp_path / run).mkdir()
        monkeypatch.chdir(tmp_path / run)
        result = plan((model, corpus), Path("out"))
        assert result.exit_code == 0, result.output
        root = tmp_path / run / "out"
        files.append({str(f.relative_to(root)): f.read_bytes()
                      for f in sorted(root.rglob("*")) if f.is_file()})
    assert sorted(files[0]) == sorted(files[1])
    assert {"plan.json", "evaluate.json", "stages.json", "run.sh"} <= set(files[0])
    assert [name for name in files[0] if files[0][name] != files[1][name]] == []


def test_a_model_that_fits_gets_a_plan_with_every_expert_resident(user, tmp_path):
    """No --offload, no --budget, and the tiny box holds every expert: a plan, exit 0, every
    expert resident, nothing staged, and the command that runs it."""
    model, corpus = user
    out = tmp_path / "out"
    result = invoke("plan", "--model", model, "--corpus", corpus, "--hardware", BOX, "--out",
                    out, "--solver", "greedy", "--max-length", 24, "--oracle-time-limit", 1,
                    "--concurrency", "1,2", "--json")
    assert result.exit_code == 0, result.output
    p = json.loads((out / "plan.json").read_text())
    assert p["solver"]["status"] == "everything fits"
    assert all(e["resident_bytes"] == e["bytes"] for e in p["experts"])
    assert all(c["staging_bytes"] == 0 and c["cache_slots"] == 0 for c in p["cards"])
    assert all(r["placement"]["stall_ms_per_step"] == 0 for r in p["predicted"])
    assert json.loads(result.stdout)["command"].startswith("placer emit --plan")


def test_a_corpus_that_is_not_utf8_fails_the_first_stage_and_leaves_nothing(user, tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"prose \xff\xfe\n")
    result = invoke("plan", "--model", user[0], "--corpus", bad, "--hardware", BOX, "--out",
                    tmp_path / "new" / "out", "--offload", 0.5)
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert result.stderr.splitlines() == [f"error: corpus {bad} line 1: not UTF-8 text (byte "
                                          "0xff at byte offset 6)"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.txt"]


@pytest.fixture(scope="module")
def planned(user, tmp_path_factory) -> Path:
    """One complete `plan` run, copied afresh by each test that damages it."""
    out = tmp_path_factory.mktemp("planned") / "out"
    result = plan(user, out)
    assert result.exit_code == 0, result.output
    return out


def damaged(planned: Path, tmp_path: Path, monkeypatch) -> Path:
    import shutil

    out = tmp_path / "out"
    shutil.copytree(planned, out)
    record = (out / "stages.json").read_text().replace(str(planned), str(out))
    (out / "stages.json").write_text(record)
    monkeypatch.chdir(tmp_path)
    return out


@pytest.mark.parametrize(("name", "damage", "stage"), [
    ("plan.json", b"{}", "solve"),
    ("plan.json", b"{", "solve"),
    ("evaluate.json", b"\xff\xfe", "evaluate"),
    ("split/calib", None, "split"),
])
def test_a_damaged_stage_output_reruns_that_stage_saying_so(user, planned, tmp_path,
                                                            monkeypatch, name, damage, stage):
    """placer's own outputs are inputs like any other: one replaced, emptied or removed is
    not trusted because placer wrote it once; its stage runs again, and says why."""
    import shutil

    out = damaged(planned, tmp_path, monkeypatch)
    if damage is None:
        shutil.rmtree(out / name)
    else:
        (out / name).write_bytes(damage)
    result = plan(user, out)
    assert result.exit_code == 0, result.output
    index = ["collect", "split", "solve", "evaluate", "export"].index(stage) + 1
    assert (f"[{index}/5] {stage}: {out / name} changed since placer plan wrote it: running "
            "it again") in result.stdout
    assert (out / name).is_dir() if damage is None else (out / name).read_bytes() != damage


def test_a_sparse_8_gib_stage_output_is_rerun_without_reading_it(user, planned, tmp_path,
                                                                 monkeypatch):
    out = damaged(planned, tmp_path, monkeypatch)
    with open(out / "evaluate.json", "r+b") as f:
        f.truncate(8 << 30)
    result = plan(user, out)
    assert result.exit_code == 0, result.output
    assert "[4/5] evaluate: " + str(out / "evaluate.json") + " changed" in result.stdout
    assert (out / "evaluate.json").stat().st_size < 1 << 20


@pytest.mark.parametrize(("content", "said"), [
    ("[" * 200_000, "nested deeper than"),
    ("{}x", "not valid JSON"),
    ('{"collect": 1}', "collect: expected key, outputs and files"),
    ('{"nope": {}}', "unknown stage 'nope'"),
])
def test_a_damaged_record_stops_in_one_line(user, planned, tmp_path, monkeypatch, content,
                                            said):
    out = damaged(planned, tmp_path, monkeypatch)
    (out / "stages.json").write_text(content)
    assert_one_line_error(plan(user, out), f"{out / 'stages.json'}: {said}",
                          "it is placer plan's record of what it wrote")


def test_a_stage_directory_replaced_by_a_file_stops_in_one_line(user, planned, tmp_path,
                                                                monkeypatch):
    import shutil

    out = damaged(planned, tmp_path, monkeypatch)
    shutil.rmtree(out / "traces")
    (out / "traces").write_text("mine")
    result = plan(user, out)
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert result.stderr.splitlines() == [f"error: {out / 'traces'} is no longer the directory "
                                          "placer plan wrote there: move it away (or give "
                                          "another --out) and run plan again"]
    assert (out / "traces").read_text() == "mine"


def test_a_huge_corpus_is_refused_before_it_is_hashed(user, tmp_path):
    """An 8 GiB corpus (sparse: no disk used) of no blank line is refused at its first
    document, before any stage and before it is hashed whole."""
    big = tmp_path / "big.txt"
    with open(big, "wb") as f:
        f.truncate(8 << 30)
    result = invoke("plan", "--model", user[0], "--corpus", big, "--hardware", BOX, "--out",
                    tmp_path / "out", "--offload", 0.5)
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert str(big) in result.stderr and not (tmp_path / "out").exists()
