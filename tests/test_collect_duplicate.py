"""`placer collect` twice into one --out with the same corpus: refused (it would count twice)."""

from __future__ import annotations

from pathlib import Path

import pytest

from traces.collecting.runs import SAME_SAMPLE, refuse_duplicate
from traces.errors import TraceError
from traces.storing.schema import read_meta

pytest_plugins = ["fixtures_models"]  # trace_models, trace_data, placer_run


def test_the_same_corpus_twice_is_refused_with_one_line(tmp_path: Path, trace_models,
                                                         placer_run, trace_data) -> None:
    corpus = trace_data.prose_corpus(tmp_path / "p.txt", blocks=2)
    out = tmp_path / "t"
    args = ["collect", "--model", trace_models["qwen3_moe"], "--corpus", corpus, "--out", out,
            "--no-progress", "--max-length", "16"]
    placer_run(*args)
    first = sorted(out.glob("*.parquet"))
    result = placer_run(*args, "--no-weights", ok=False)  # other options: the same sample
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 1 and len(lines) == 1, result.output
    assert lines[0].startswith(f"error: {first[0]} already holds corpus {corpus.name} "
                             "(tag p, mode score)")
    assert sorted(out.glob("*.parquet")) == first
    placer_run(*args, "--tag", "again")  # another tag is another sample
    assert len(list(out.glob("*.parquet"))) == 2


def test_refuse_duplicate_compares_model_corpus_tag_and_mode(tmp_path: Path, trace_models,
                                                              placer_run) -> None:
    out = tmp_path / "t"
    refuse_duplicate(out, {"fingerprint": "x"})  # no directory yet: nothing to compare
    placer_run("collect", "--model", trace_models["olmoe"], "--out", out, "--no-progress",
               "--random-tokens", "20", "--max-length", "10")
    (path,) = out.glob("*.parquet")
    meta = read_meta(path)
    with pytest.raises(TraceError, match="would count it twice"):
        refuse_duplicate(out, meta)
    for key in SAME_SAMPLE:
        refuse_duplicate(out, {**meta, key: "other"})  # differs in one: no error
