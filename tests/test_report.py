"""What `solve`, `evaluate` and `plan` end with (placer/report/): a summary of at most about
25 lines of at most 100 columns, the full tables in a file beside the output and, with
--verbose, on the terminal; table rows that keep their labels short however long the path
of the traffic."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from tiny_pipeline import BOX, Pipeline, build_pipeline, invoke

from placer.plan.placement import read_plan
from placer.report.figures import SUMMARY_LINES, TABLE_WIDTH, shell_lines
from placer.report.plan import plan_summary

LONG = "a-folder-named-at-length-by-its-user/split/held-out-traffic-of-the-first-kind"


@pytest.fixture(scope="module")
def pipe(tmp_path_factory: pytest.TempPathFactory, prose: list[str]) -> Pipeline:
    return build_pipeline(tmp_path_factory.mktemp("report"), prose)


@pytest.fixture
def here(pipe: Pipeline, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """tmp_path as the working directory, the pipe's traces copied under a long path (short
    relative paths: the summaries' own widths are measured, not pytest's)."""
    monkeypatch.chdir(tmp_path)
    shutil.copytree(pipe.traces, tmp_path / LONG)
    return tmp_path


def summary_fits(text: str) -> None:
    lines = text.rstrip("\n").splitlines()
    assert 3 <= len(lines) <= SUMMARY_LINES, text
    assert max(map(len, lines)) <= TABLE_WIDTH, text
    assert "┃" not in text and "│" not in text  # no table: aligned columns


def test_solve_prints_a_summary_and_writes_the_full_tables_beside_the_plan(pipe, here):
    args = ["solve", "--model", pipe.model, "--hardware", BOX, "--traces", LONG, "--offload",
            0.5, "--solver", "greedy", "--steps", 16, "--concurrency", "1,2", "--out",
            "plan.json"]
    result = invoke(*args)
    assert result.exit_code == 0, result.output
    summary_fits(result.output)
    assert result.output.startswith("plan written to plan.json\n")
    assert "B=2  0." in result.output and "the full tables: plan.txt" in result.output
    full = Path("plan.txt").read_text()
    assert "predicted on calibration traffic" in full and "┃" in full
    verbose = invoke(*args, "--verbose")
    assert verbose.exit_code == 0 and verbose.output == Path("plan.txt").read_text()


def test_evaluate_prints_a_summary_and_with_out_writes_the_report_and_its_tables(pipe, here):
    args = ["evaluate", pipe.plan, "--traces", LONG, "--concurrency", "1,2",
            "--oracle-time-limit", 1]
    result = invoke(*args, "--out", "report.json")
    assert result.exit_code == 0, result.output
    summary_fits(result.output)
    assert "too little traffic" in result.output  # 4 sequences: the verdict, in the summary
    assert "held-out-traffic-of-the-first-kind" in result.output  # the short name's path
    assert "the full tables: report.txt" in result.output
    report = json.loads(Path("report.json").read_text())
    assert len(report["results"]) == 2 and "per_layer" not in report
    full = Path("report.txt").read_text()
    rows = [line for line in full.splitlines() if line.startswith("│")]
    assert rows and not any("split" in line for line in rows)  # the path is in the title
    assert all(len(line) <= TABLE_WIDTH for line in rows)
    verbose = invoke(*args, "--verbose", "--out", "again.json")  # the same run's tables
    assert verbose.exit_code == 0 and verbose.output == Path("again.txt").read_text()
    assert verbose.output.splitlines()[0] == full.splitlines()[0]  # the full tables, not a summary


def test_evaluate_out_is_refused_on_an_input(pipe, here):
    result = invoke("evaluate", pipe.plan, "--traces", LONG, "--out", pipe.plan)
    assert result.exit_code == 1 and result.output.startswith("error: --out"), result.output


def test_the_plan_summary_names_the_choice_ratios_verdicts_tables_and_command(pipe, here):
    out = Path("myplan")
    out.mkdir()
    shutil.copy(pipe.plan, out / "plan.json")
    assert invoke("evaluate", out / "plan.json", "--traces", LONG, "--concurrency", "1,2",
                  "--oracle-time-limit", 1, "--out", out / "evaluate.json").exit_code == 0
    command = (f"placer emit --plan {out / 'plan.json'} --model {pipe.model} --out "
               f"{out / 'placed'} && placer serve {out / 'placed'}")
    lines = plan_summary(read_plan(out / "plan.json"),
                         json.loads((out / "evaluate.json").read_text()), command, out)
    summary_fits("\n".join(lines[:-2]))  # the command's lines hold pytest's long tmp path
    text = "\n".join(lines)
    assert lines[0].startswith("plan: myplan/plan.json for placer's runtime")
    assert "/ layer offload" in text and "too little traffic" in text
    assert "the full tables: myplan/evaluate.txt" in text
    assert "".join(x.removesuffix(" \\").strip() + " " for x in
                   lines[lines.index("to run it (myplan/run.sh):") + 1:]).strip() == command


@pytest.mark.parametrize("command", [
    "placer emit --plan p/plan.json --model /m --out p/placed && placer serve p/placed",
    "llama-server -m 'a b.gguf' -ngl all -ot '" + "|".join(map(str, range(60)))
    + "=CPU' --moe-cache-mib 217 --host 127.0.0.1 --port 8080 --ctx-size 4096 -np 8"])
def test_a_long_command_is_cut_into_lines_that_run_as_it(command):
    lines = shell_lines(command)
    words = command.split(" ")
    assert " ".join(w for x in lines for w in x.removesuffix(" \\").split(" ") if w) == \
        " ".join(w for w in words if w)
    alone = [x for x in lines if " " not in x.strip().removesuffix(" \\")]  # a word too long
    assert all(len(x) <= TABLE_WIDTH for x in lines if x not in alone) and len(lines) > 1
