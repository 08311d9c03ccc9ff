"""The llama.cpp worker's pipe (issue #44, class 4): replies come as frames on a channel of
their own, so llama.cpp's prints and an abort's backtrace on stdout cannot garble them; a
dead or garbled worker is one line with how it ended and its last output; sizes are bounded
before they cross. The misbehaving workers are tests/fake_llama_worker.py."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

import traces.llamacpp.runner as runner
from traces.errors import TraceError
from traces.llamacpp.runner import MAX_CONTEXT, TOKEN_BYTES, EngineOptions, LlamaCpp

pytest_plugins = ["gguf_models", "fixtures_models", "fake_llama"]

FAKE = Path(__file__).with_name("fake_llama_worker.py")

def no_children_left() -> bool:
    """No child process of this one is still alive (zombies are reaped by wait)."""
    kids = Path(f"/proc/{os.getpid()}/task/{os.getpid()}/children").read_text().split()
    return all(Path(f"/proc/{k}").exists() is False
               or "Z" in Path(f"/proc/{k}/stat").read_text().split()[2] for k in kids)


def test_prints_on_stdout_do_not_reach_the_replies(fake):
    with fake("chatty") as llama:
        assert llama.n_vocab == 64
        run = llama.run([5, 6, 7])
        assert run.tokens.tolist() == [5, 6, 7] and run.experts.shape == (3, 1, 2)
        assert llama.close() == {"alignment": None, "log": []}
    assert no_children_left()


def test_an_abort_with_a_backtrace_on_stdout_is_one_line_with_its_last_output(fake):
    with fake("abort") as llama, pytest.raises(TraceError) as err:
        llama.run([1, 2])
    message = str(err.value)
    assert "\n" not in message
    assert "killed by SIGABRT" in message and "model.gguf" in message
    assert "GGML_ASSERT(slot < n_slots) failed" in message
    assert no_children_left()


@pytest.mark.parametrize("mode, says", [
    ("garbage", "not a frame"),
    ("huge", "announced a reply of 1099511627776 bytes"),
    ("notjson", "not JSON"),
    ("silent-exit", "exit status 3"),
])
def test_a_garbled_or_dead_worker_is_one_line(fake, mode, says):
    with pytest.raises(TraceError) as err:
        fake(mode)
    message = str(err.value)
    assert "\n" not in message and says in message, message
    if mode == "silent-exit":
        assert "ggml_vulkan: no device found" in message
    assert no_children_left()


def test_a_long_text_is_cut_before_it_is_sent(fake):
    """A 20 MB line tokenized for 512 tokens sends (512 + 1) x TOKEN_BYTES characters."""
    with fake("chatty") as llama:
        ids = llama.tokenize(text="x" * 20_000_000, max_tokens=512)
        assert len(ids) == 512 and ids[0] == 513 * TOKEN_BYTES
        ids = llama.tokenize(chat=[{"role": "user", "content": "y" * 20_000_000}],
                             max_tokens=8)
        assert len(ids) == 8 and ids[0] == 9 * TOKEN_BYTES


def test_sizes_past_the_context_are_refused_before_the_worker_starts(fake, tmp_path):
    for n_ctx, n_batch in ((2**32 + 8, 64), (64, 2**32 + 8), (0, 8)):
        with pytest.raises(TraceError, match=f"1 .. {MAX_CONTEXT}"):
            LlamaCpp(EngineOptions(str(tmp_path / "model.gguf"), n_ctx=n_ctx, n_batch=n_batch))
    with fake("chatty") as llama, pytest.raises(TraceError, match="does not fit"):
        llama.run(list(range(40)))


def test_collect_gguf_max_length_2_32_is_refused_in_one_line(gguf_pair, tmp_path, placer_run,
                                                             trace_data):
    corpus = trace_data.prose_corpus(tmp_path / "prose.txt", blocks=2)
    result = placer_run("collect", "--gguf", gguf_pair[1], "--corpus", corpus, "--out",
                        tmp_path / "out", "--max-length", 2**32, "--no-progress", ok=False)
    lines = result.output.strip().splitlines()
    assert result.exit_code == 1 and len(lines) == 1
    assert "--max-length" in lines[0] and "4294967296" in lines[0]
    assert not (tmp_path / "out").exists()


def test_collect_gguf_when_llama_cpp_aborts_is_one_line(gguf_pair, tmp_path, placer_run,
                                                        trace_data, monkeypatch):
    """ggml's abort prints gdb's backtrace on stdout (the pipe JSON came on before): the
    command ends in one line quoting the assertion, exit 1, no trace directory."""
    monkeypatch.setattr(runner, "WORKER", FAKE)
    monkeypatch.setenv("PLACER_LLAMA_PYTHON", sys.executable)
    monkeypatch.setenv("PLACER_FAKE_MODE", "abort")
    corpus = trace_data.prose_corpus(tmp_path / "prose.txt", blocks=2)
    result = placer_run("collect", "--gguf", gguf_pair[1], "--corpus", corpus, "--out",
                        tmp_path / "out", "--no-progress", ok=False)
    lines = result.output.strip().splitlines()
    assert result.exit_code == 1 and len(lines) == 1, result.output
    assert lines[0].startswith("error: ") and "killed by SIGABRT" in lines[0]
    assert "GGML_ASSERT" in lines[0]
    assert no_children_left()
