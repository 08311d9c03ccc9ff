"""Text that is not Unicode (issue 44, class 10): a corpus is decoded strictly, its first
byte that is not UTF-8 one line naming the file, line and byte offset; `run --prompt` with
bytes that are not UTF-8 is one line, not a traceback."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
from cli_errors import assert_one_line_error

from traces.collecting.corpora import open_corpus
from traces.errors import TraceError

REPO = Path(__file__).resolve().parent.parent


def test_a_txt_corpus_with_a_byte_that_is_not_utf8_names_its_line_and_offset(tmp_path):
    good = "A first block of prose.\n\nAnd a second, ü é.\n".encode()
    path = tmp_path / "mixed.txt"
    path.write_bytes(good + b"third block \xff here\n")
    with pytest.raises(TraceError) as caught:
        open_corpus(path)
    assert str(caught.value) == (f"corpus {path} line 4: not UTF-8 text (byte 0xff at byte "
                                 f"offset {len(good) + len('third block ')})")


def test_a_corpus_of_random_bytes_is_refused_by_collect_in_one_line(cli, tmp_path):
    """It was collected silently, every bad byte replaced by U+FFFD."""
    path = tmp_path / "noise.txt"
    path.write_bytes(bytes(random.Random(0).randrange(256) for _ in range(4096)))
    result = cli("collect", "--model", tmp_path / "no-model", "--corpus", path, "--out",
                 tmp_path / "traces", ok=False)
    assert_one_line_error(result, f"corpus {path} line", "not UTF-8 text", "byte offset")
    assert not (tmp_path / "traces").exists()


def test_a_utf8_txt_corpus_reads_as_before(tmp_path):
    path = tmp_path / "ok.txt"
    path.write_text("one\r\ntwo\n\n\nthree ü\n", encoding="utf-8")
    assert [d.text for d in open_corpus(path).documents()] == ["one\ntwo", "three ü"]


def test_run_with_a_prompt_that_is_not_utf8_is_one_line(tmp_path):
    """argv's undecodable bytes reach Python as lone surrogates: one line, exit 1."""
    done = subprocess.run([sys.executable, "-m", "placer", "run", str(tmp_path / "placed"),
                           "--prompt", b"caf\xe9 \xff"], cwd=REPO, capture_output=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120)
    err = done.stderr.decode(errors="replace").strip()
    assert done.returncode == 1 and done.stdout == b"", err
    assert err == "error: --prompt: not UTF-8 text (byte 0xe9 at byte offset 3)", err
