"""Workers and formats (issue #53 item 7): every wait on the llama.cpp worker has a deadline
and a stopped worker fails the command in one line (traces/llamacpp/channel.py); GGUF names
by llama.cpp's own rules, no NUL and the exact expert suffixes (traces/formats/gguf_header.py,
placer/checkpoint/gguf.py); a config's head counts checked before any tensor is built
(placer/checkpoint/config.py check_heads); text a terminal would act on shown escaped
(placer/progress.py, placer/errors.py)."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from cli_errors import assert_one_line_error
from gguf import GGUFWriter
from gguf_files import names_gguf
from tiny_pipeline import invoke

import traces.llamacpp.channel as channel
from traces.errors import TraceError
from traces.formats.gguf_header import read_gguf_header
from traces.llamacpp.runner import LlamaCpp

pytest_plugins = ["gguf_models", "fixtures_models", "fake_llama"]

STOPPED_S = 2.0  # the stopped-worker grace the tests run with (channel.STOPPED_S is 10 s)


def no_children_left() -> bool:
    """No child process of this one is still alive (zombies are reaped by wait)."""
    kids = Path(f"/proc/{os.getpid()}/task/{os.getpid()}/children").read_text().split()
    return all(not Path(f"/proc/{k}").exists()
               or "Z" in Path(f"/proc/{k}/stat").read_text().split()[2] for k in kids)


@pytest.fixture
def stop_after_start(monkeypatch):
    """Every worker started is stopped (SIGSTOP) at once, before it answers."""
    start = channel.Worker.__init__

    def stopped(self, *args, **kwargs):
        start(self, *args, **kwargs)
        os.kill(self.proc.pid, signal.SIGSTOP)

    monkeypatch.setattr(channel, "STOPPED_S", STOPPED_S, raising=False)
    monkeypatch.setattr(channel.Worker, "__init__", stopped)


def test_a_stopped_collect_gguf_worker_fails_in_one_line(gguf_pair, tmp_path, trace_data,
                                                         stop_after_start) -> None:
    """The real llama.cpp worker, SIGSTOPped as it starts: `collect --gguf` used to wait on
    its reply forever; now one line within the stated time, no trace directory, no child."""
    corpus = trace_data.prose_corpus(tmp_path / "prose.txt", blocks=2)
    began = time.monotonic()
    result = invoke("collect", "--gguf", gguf_pair[1], "--corpus", corpus, "--out",
                    tmp_path / "out", "--no-progress")
    assert time.monotonic() - began < STOPPED_S + 15
    assert_one_line_error(result, "llama.cpp's worker on", "is stopped (SIGSTOP",
                          f"for {STOPPED_S:g} s")
    assert not (tmp_path / "out").exists()
    assert no_children_left()


def test_a_worker_stopped_between_requests_fails_in_one_line(gguf_pair, tmp_path, trace_data,
                                                             monkeypatch) -> None:
    """Stopped after it answered (model loaded), while a run is asked of it."""
    run = LlamaCpp.run

    def stop_then_run(self, *args, **kwargs):
        os.kill(self.worker.proc.pid, signal.SIGSTOP)
        return run(self, *args, **kwargs)

    monkeypatch.setattr(channel, "STOPPED_S", STOPPED_S, raising=False)
    monkeypatch.setattr(LlamaCpp, "run", stop_then_run)
    corpus = trace_data.prose_corpus(tmp_path / "prose.txt", blocks=2)
    result = invoke("collect", "--gguf", gguf_pair[1], "--corpus", corpus, "--out",
                    tmp_path / "out", "--no-progress")
    assert_one_line_error(result, "is stopped (SIGSTOP")
    assert no_children_left()


@pytest.fixture
def fake(fake, monkeypatch):
    """The fake worker (tests/fake_llama.py) with a reply deadline of 2 s
    (PLACER_WORKER_TIMEOUT)."""
    monkeypatch.setenv("PLACER_WORKER_TIMEOUT", "2")
    return fake


def test_a_worker_that_never_answers_fails_at_the_deadline(fake) -> None:
    began = time.monotonic()
    with fake("hang") as llama, pytest.raises(TraceError) as err:
        llama.run([1, 2, 3])
    assert time.monotonic() - began < 2 + 10
    message = str(err.value)
    assert "\n" not in message and "sent no reply within 2 s" in message, message
    assert "PLACER_WORKER_TIMEOUT" in message
    assert no_children_left()


def test_a_worker_that_never_reads_fails_at_the_deadline_of_the_send(fake) -> None:
    """A request longer than the pipe holds, to a worker that reads nothing: the write has
    a deadline too."""
    with fake("deaf") as llama, pytest.raises(TraceError) as err:
        llama.tokenize(text="x" * 20_000_000, max_tokens=2048)
    assert "took no request within 2 s" in str(err.value), str(err.value)
    assert no_children_left()


def test_a_stopped_fake_worker_fails_even_with_a_long_deadline(fake, monkeypatch) -> None:
    monkeypatch.setenv("PLACER_WORKER_TIMEOUT", "3600")
    monkeypatch.setattr(channel, "STOPPED_S", STOPPED_S, raising=False)
    with fake("chatty") as llama:
        os.kill(llama.worker.proc.pid, signal.SIGSTOP)
        began = time.monotonic()
        with pytest.raises(TraceError, match="is stopped"):
            llama.run([1, 2])
        assert time.monotonic() - began < STOPPED_S + 8
    assert no_children_left()


@pytest.mark.parametrize(("value", "seconds"), [("2", 2.0), ("nan", None), ("-1", None),
                                                ("inf", None), ("soon", None)])
def test_the_deadline_is_read_from_the_environment(monkeypatch, value, seconds) -> None:
    """PLACER_WORKER_TIMEOUT where it is a positive number of seconds, else the default."""
    monkeypatch.setenv("PLACER_WORKER_TIMEOUT", value)
    assert channel.reply_timeout() == (channel.REPLY_TIMEOUT_S if seconds is None else seconds)


# GGUF tensor names as llama.cpp reads them.

BASE = ["blk.0.ffn_up_exps.weight", "blk.1.ffn_gate_exps.weight"]


def test_a_tensor_name_with_a_nul_is_refused(cli, tmp_path: Path) -> None:
    """`blk.1.ffn_up_exps.weight\\0x` is layer 1's up experts to llama.cpp (C strings) and
    a dense tensor to a reader of the whole name: refused, one line, by every reader."""
    path = names_gguf(tmp_path / "m.gguf", [*BASE, "blk.1.ffn_up_exps.weight\x00x"])
    assert_one_line_error(cli("inspect", path, ok=False), "m.gguf", "holds a NUL byte",
                          "'blk.1.ffn_up_exps.weight'")
    with pytest.raises(ValueError, match="holds a NUL byte"):
        read_gguf_header(path, ValueError)


def test_a_key_with_a_nul_is_refused(cli, tmp_path: Path) -> None:
    path = tmp_path / "m.gguf"
    writer = GGUFWriter(path, "qwen3moe")
    writer.add_block_count(2)
    writer.add_expert_count(4)
    writer.add_uint32("qwen3moe.expert_used_count\x00x", 2)
    writer.add_tensor(BASE[0], np.zeros((4, 8, 32), np.float32))
    for step in (writer.write_header_to_file, writer.write_kv_data_to_file,
                 writer.write_tensors_to_file, writer.close):
        step()
    assert_one_line_error(cli("inspect", path, ok=False), "holds a NUL byte")


@pytest.mark.parametrize("name", ["blk.1.ffn_up_exps.weightx", "blk.1.ffn_up_exps.Weight",
                                  "blk.1.ffn_up_exps.weight\n", "blk.1.ffn_up_exps",
                                  "blk.1.ffn_up_exps.weight.1", "blk.1.ffn_up_exps.scales"])
def test_an_expert_tensor_with_a_suffix_llamacpp_never_loads_is_refused(cli, tmp_path: Path,
                                                                        name: str) -> None:
    path = names_gguf(tmp_path / "m.gguf", [*BASE, name])
    assert_one_line_error(cli("inspect", path, ok=False), "m.gguf",
                          "is no routed expert tensor llama.cpp loads")


def test_the_exact_suffixes_still_read(cli, tmp_path: Path) -> None:
    path = names_gguf(tmp_path / "m.gguf", [*BASE, "blk.1.ffn_up_exps.weight",
                                            "blk.0.ffn_gate_exps.weight",
                                            "blk.0.ffn_down_exps.weight",
                                            "blk.1.ffn_down_exps.weight"])
    assert cli("inspect", path).exit_code == 0


# A config's head counts, before any tensor is built.

def edited_model(src: Path, dst: Path, **config) -> Path:
    import shutil

    shutil.copytree(src, dst)
    data = json.loads((dst / "config.json").read_text())
    data.update(config)
    (dst / "config.json").write_text(json.dumps(data))
    return dst


@pytest.mark.parametrize(("arch", "config", "says"), [
    ("qwen3_moe", {"num_key_value_heads": 3},
     "num_key_value_heads 3 does not divide num_attention_heads 4"),
    ("qwen3_moe", {"num_key_value_heads": 8}, "num_key_value_heads 8 does not divide"),
    ("qwen3_moe", {"head_dim": 7}, "head_dim is 7, odd"),
    ("olmoe", {"num_attention_heads": 3, "num_key_value_heads": 3},
     "hidden_size 32 is not a multiple"),
    ("deepseek_v3", {"qk_rope_head_dim": 5}, "qk_rope_head_dim is 5, odd"),
    ("deepseek_v3", {"v_head_dim": 0}, "v_head_dim: expected an integer in 1.."),
], ids=["kv-3-of-4", "kv-more-than-heads", "odd-head-dim", "hidden-not-multiple",
        "mla-odd-rope", "mla-no-value-width"])
def test_probe_step_refuses_head_counts_before_building(tiny_models, tmp_path, arch, config,
                                                        says) -> None:
    """One line, before anything is said or built (torch's forward used to end in a
    117-line traceback)."""
    model = edited_model(tiny_models[arch], tmp_path / "m", **config)
    result = invoke("probe", "--step", "--model", model, "--device", "cpu", "--batch", "1")
    assert_one_line_error(result, "config.json", says)


# Text a terminal would act on, shown escaped.

ESCAPES = "\x1b[2J\x1b]0;owned\x07\x08\x9b31m\r"
CONTROLS = {c for c in ESCAPES if ord(c) < 0x20 or 0x7f <= ord(c) <= 0x9f}


def test_hardware_show_escapes_a_descriptions_terminal_sequences(tmp_path: Path) -> None:
    spec = tmp_path / "box.toml"
    text = invoke("hardware", "show", "1x-rtx4090", "--toml").output
    spec.write_text(text.replace('description = "', 'description = "evil'
                                 + json.dumps(ESCAPES)[1:-1], 1)
                    .replace('model = "', 'model = "card' + json.dumps(ESCAPES)[1:-1], 1))
    result = invoke("hardware", "show", spec)
    assert result.exit_code == 0, result.output
    assert not CONTROLS & set(result.output), repr(result.output[:300])
    assert "evil\\u001b[2J\\u001b]0;owned\\u0007" in result.output


MARKUP = "[/bold][red]x[link=http://e.com]y[/link]"


def test_rich_markup_in_a_name_is_shown_as_written(tmp_path: Path) -> None:
    """Was a MarkupError traceback: rich read "[/bold]" in a spec's name as a closing tag."""
    spec = tmp_path / "box.toml"
    text = invoke("hardware", "show", "1x-rtx4090", "--toml").output
    spec.write_text(text.replace('name = "', 'name = "' + MARKUP, 1))
    result = invoke("hardware", "show", spec)
    assert result.exit_code == 0, result.output
    assert MARKUP + "1x-rtx4090" in result.output, result.output


def test_the_report_room_styles_with_text_not_markup() -> None:
    """placer's own bold labels carry user text (profile names, prompts, trace names):
    styled as rich Text, never as markup that text could close."""
    import re

    reports = Path(__file__).resolve().parent.parent / "placer" / "report"
    markup = [f"{p.name}:{i}" for p in sorted(reports.glob("*.py"))
              for i, line in enumerate(p.read_text().splitlines(), 1)
              if re.search(r"\[/?(bold|red|green|yellow|dim|italic)\]", line)]
    assert not markup, markup


def test_an_error_line_escapes_what_it_quotes() -> None:
    result = invoke("hardware", "show", "preset" + ESCAPES)
    assert_one_line_error(result, "unknown hardware preset", "\\u001b[2J")
    assert not CONTROLS & set(result.output)


def test_json_and_toml_output_read_back_the_same_text(tmp_path: Path) -> None:
    """The escapes are what JSON and TOML read back as the very characters."""
    import tomllib

    spec = tmp_path / "box.toml"
    text = invoke("hardware", "show", "1x-rtx4090", "--toml").output
    spec.write_text(text.replace('description = "', 'description = "evil\\u009b\\u007f', 1))
    shown = invoke("hardware", "show", spec, "--json").output
    assert "\x9b" not in shown and json.loads(shown)["description"].startswith("evil\x9b\x7f")
    toml = invoke("hardware", "show", spec, "--toml").output
    assert "\x9b" not in toml and tomllib.loads(toml)["description"].startswith("evil\x9b")


def test_stdout_and_stderr_are_filtered_while_a_command_runs(capsys) -> None:
    """What a command writes itself (typer.echo, print, a warning on stderr) is escaped; a
    rich console writes past the filter, its strings escaped before its styles."""

    from placer.progress import console, printable_output

    with printable_output():
        print("out" + ESCAPES)
        sys.stderr.write("err" + ESCAPES + "\n")
        console(width=200).print("rich" + ESCAPES)
    out, err = capsys.readouterr()
    assert not CONTROLS & set(out + err), (out, err)
    assert "out\\u001b[2J" in out and "err\\u001b[2J" in err and "rich\\u001b[2J" in out
