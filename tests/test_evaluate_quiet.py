"""`placer evaluate` where the static oracle never stalls (issue 43): its ratio is no number,
and the output says so (it printed `static oracle inf ,` and leaked numpy's `RuntimeWarning:
invalid value encountered in subtract` from the percentiles of infinite ratios); the JSON
keeps null."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
from tiny_pipeline import BOX, invoke

from placer.checkpoint.tiny import build_tiny_model
from solvers.judge.intervals import Estimate

REPO = Path(__file__).resolve().parent.parent


def test_infinite_ratios_have_percentiles_without_warnings() -> None:
    replicates = np.array([np.inf] * 50 + [3.0] * 50)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert Estimate(np.inf, replicates).ci95() == [3.0, np.inf]
    assert Estimate(1.0, np.arange(100.0)).ci95() == [2.475, np.percentile(np.arange(100.0),
                                                                             97.5)]


def test_an_oracle_that_never_stalls_reads_na_and_stderr_stays_clean(tmp_path: Path,
                                                                     prose: list[str]) -> None:
    """Held-out traffic of one short text twelve times: the oracle pins every expert it
    selects (stall 0) where a plan solved on random tokens does not."""
    model = build_tiny_model("qwen3_moe", tmp_path / "model", texts=prose[:50])
    (tmp_path / "same.txt").write_text("\n\n".join(["to be"] * 12) + "\n")
    plan = tmp_path / "plan.json"
    for args in (["collect", "--model", model, "--random-tokens", 64, "--max-length", 16,
                  "--out", tmp_path / "calib", "--no-progress"],
                 ["collect", "--model", model, "--corpus", tmp_path / "same.txt",
                  "--max-length", 4, "--out", tmp_path / "heldout", "--no-progress"],
                 ["solve", "--model", model, "--hardware", BOX, "--traces",
                  tmp_path / "calib", "--offload", 0.2, "--solver", "greedy", "--steps", 16,
                  "--cache", 0, "--out", plan]):
        result = invoke(*args)
        assert result.exit_code == 0, result.output

    def evaluate(*extra: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "placer", "evaluate", str(plan),
                               "--traces", str(tmp_path / "heldout"), *extra],
                              capture_output=True, text=True, cwd=REPO, timeout=600,
                              env={**os.environ, "PYTHONPATH": str(REPO)})

    summary = evaluate()
    assert summary.returncode == 0, summary.stderr
    assert summary.stderr == "" and " inf" not in summary.stdout
    shown = evaluate("--verbose")  # the full tables and each row's ratios
    assert shown.returncode == 0, shown.stderr
    assert shown.stderr == ""  # no RuntimeWarning
    assert "static oracle n/a (static oracle stalls 0 ms/step" in shown.stdout
    assert " inf" not in shown.stdout
    result = invoke("evaluate", plan, "--traces", tmp_path / "heldout", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    (row,) = report["results"]
    assert row["oracle"]["stall_ms_per_step"] == 0 and row["ratio_to_oracle"] is None
