"""Nothing placer writes lands on or inside what it reads (issue 27): every writer refuses a
path into a checkpoint, given or not, in one line, before it writes anything, and the
checkpoint's bytes stay as they were; the one check (placer.files.check_apart) itself; every
export goes through the atomic writer (a named pipe is written to, a full disk leaves no
truncated file)."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from cli_errors import assert_one_line_error
from tiny_pipeline import BOX, Pipeline, build_pipeline, invoke, tree

from placer.checkpoint.inventory import read_inventory
from placer.errors import PlacerError

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def pipe(tmp_path_factory: pytest.TempPathFactory, prose: list[str]) -> Pipeline:
    return build_pipeline(tmp_path_factory.mktemp("writes"), prose)


def routing_npz(pipe: Pipeline, path: Path) -> Path:
    """A plain per-token routing file of the pipeline's model (8 tokens)."""
    inv = read_inventory(pipe.model)
    rng = np.random.default_rng(0)
    experts = np.stack([[rng.permutation(inv.experts_per_layer)[:inv.top_k]
                         for _ in inv.moe_layers] for _ in range(8)])
    np.savez(path, expert_ids=experts.astype(np.int16))
    return path


WRITERS = {
    "solve --out CKPT/model.safetensors": lambda p, c: [
        "solve", "--model", p.model, "--hardware", BOX, "--traces", p.traces, "--offload", 0.5,
        "--solver", "greedy", "--steps", 8, "--out", c / "model.safetensors"],
    "solve --out CKPT/config.json": lambda p, c: [
        "solve", "--model", p.model, "--hardware", BOX, "--traces", p.traces, "--offload", 0.5,
        "--solver", "greedy", "--steps", 8, "--out", c / "config.json"],
    "export sglang --out CKPT/config.json": lambda p, c: [
        "export", "sglang", p.plan, "--out", c / "config.json"],
    "export llamacpp --out CKPT/config.json": lambda p, c: [
        "export", "llamacpp", p.plan, "--out", c / "config.json"],
    "export ktransformers --out CKPT/x.pt": lambda p, c: [
        "export", "ktransformers", p.placed, "--out", c / "x.pt"],
    "collect --out CKPT": lambda p, c: [
        "collect", "--model", p.model, "--random-tokens", 8, "--max-length", 8, "--out", c,
        "--no-progress"],
    "collect --out CKPT/sub": lambda p, c: [
        "collect", "--model", p.model, "--random-tokens", 8, "--max-length", 8,
        "--out", c / "sub", "--no-progress"],
    "traces import --out CKPT": lambda p, c: [
        "traces", "import", routing_npz(p, p.root / "r.npz"), "--model", p.model, "--out", c],
    "traces import --out CKPT/sub": lambda p, c: [
        "traces", "import", routing_npz(p, p.root / "r.npz"), "--model", p.model,
        "--out", c / "sub"],
    "traces stats --plot CKPT/x.png": lambda p, c: [
        "traces", "stats", p.traces, "--plot", c / "x.png"],
    "evaluate PLACED --plot CKPT/x.png": lambda p, c: [
        "evaluate", p.placed, "--traces", p.traces, "--steps", 4, "--oracle-time-limit", 1,
        "--plot", c / "x.png"],
    "evaluate plan.json --plot CKPT/x.png": lambda p, c: [
        "evaluate", p.plan, "--traces", p.traces, "--steps", 4, "--oracle-time-limit", 1,
        "--plot", c / "x.png"],
    "emit --out CKPT/placed": lambda p, c: [
        "emit", "--plan", p.plan, "--model", p.model, "--out", c / "placed"],
    "bench --plot CKPT/x.png": lambda p, c: [
        "bench", p.placed, "--model", p.model, "--prompts", p.root / "prompts.txt",
        "--plot", c / "x.png"],
    "bench --spec-out CKPT/x.toml": lambda p, c: [
        "bench", p.placed, "--prompts", p.root / "prompts.txt", "--spec-out", c / "x.toml"],
    "probe --step --out CKPT/x.toml": lambda p, c: [
        "probe", "--step", "--model", p.model, "--hardware", BOX, "--out", c / "x.toml"],
    "traces split --out-a CKPT/a": lambda p, c: [
        "traces", "split", p.traces, "--out-a", c / "a", "--out-b", p.root / "split-b"],
}


@pytest.mark.parametrize("via", ["the checkpoint", "a link to it"])
@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_no_writer_writes_into_a_checkpoint(pipe: Pipeline, writer: str, via: str,
                                            tmp_path: Path) -> None:
    ckpt = pipe.model
    if via == "a link to it":
        (tmp_path / "link").symlink_to(ckpt)
        ckpt = tmp_path / "link"
    (pipe.root / "prompts.txt").write_text("To be, or not to be\n")
    before = tree(pipe.model)
    result = invoke(*WRITERS[writer](pipe, ckpt))
    assert_one_line_error(result, "is inside the checkpoint")
    assert tree(pipe.model) == before


def test_a_config_given_alone_is_not_overwritten(pipe: Pipeline, tmp_path: Path) -> None:
    """--config names a file, maybe outside any checkpoint: it is an input all the same."""
    config = tmp_path / "config.json"
    config.write_bytes((pipe.model / "config.json").read_bytes())
    before = config.read_bytes()
    result = invoke("solve", "--config", config, "--hardware", BOX, "--solver", "layer",
                    "--offload", 0.5, "--out", config)
    assert_one_line_error(result, "is the config")
    assert config.read_bytes() == before


def test_the_one_check(tmp_path: Path) -> None:
    from placer.files import check_apart, is_checkpoint

    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text("{}")
    assert not is_checkpoint(str(ckpt))  # a config alone: a directory being prepared
    (ckpt / "model-00001-of-00002.safetensors").write_bytes(b"")
    assert is_checkpoint(str(ckpt))
    with pytest.raises(PlacerError, match="is inside the checkpoint"):
        check_apart(ckpt / "deep" / "er" / "plan.json")  # recognized, though not given
    plan = tmp_path / "plan.json"
    plan.write_text("{}")
    os.link(plan, tmp_path / "hard.json")
    with pytest.raises(PlacerError, match=r"is the plan \("):
        check_apart(tmp_path / "hard.json", [("the plan", plan)])  # the same file
    with pytest.raises(PlacerError, match="holds the placed directory"):
        check_apart(tmp_path, [("the placed directory", tmp_path / "placed")])
    check_apart(tmp_path / "elsewhere.json", [("the plan", plan), ("the config", None)])
    (tmp_path / "loop").symlink_to("loop")
    check_apart(tmp_path / "loop")  # a loop resolves to itself: the writer then refuses it


def test_a_ktransformers_export_to_a_named_pipe_is_written_to(pipe: Pipeline,
                                                              tmp_path: Path) -> None:
    import torch

    fifo = tmp_path / "placer_kt.pt"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # so the writer's open does not block
    try:
        result = invoke("export", "ktransformers", pipe.plan, "--out", fifo, "--union")
        data = os.read(reader, 1 << 20)
    finally:
        os.close(reader)
    assert result.exit_code == 0, result.output
    assert os.path.exists(fifo) and not os.path.isfile(fifo)  # still the pipe
    assert sorted(os.listdir(tmp_path)) == ["placer_kt.pt"]
    saved = torch.load(io.BytesIO(data), weights_only=True)
    assert saved["logical_count"].shape[0] == 1


FULL_DISK = ("import resource, signal, sys; signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "
             "resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv.pop(1)),) * 2); "
             "from placer.cli import main; sys.argv[0] = 'placer'; main()")


def placer_on_a_full_disk(limit: int, *args: object) -> subprocess.CompletedProcess:
    """`placer ARGS` in a process that cannot write a file past `limit` bytes (RLIMIT_FSIZE:
    writes fail with EFBIG there, as on a full disk)."""
    return subprocess.run([sys.executable, "-c", FULL_DISK, str(limit), *map(str, args)],
                          capture_output=True, text=True, cwd=REPO, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(REPO)})


def test_a_full_disk_leaves_no_truncated_export(pipe: Pipeline, tmp_path: Path) -> None:
    out = tmp_path / "args.txt"
    done = placer_on_a_full_disk(16, "export", "llamacpp", pipe.plan, "--out", out)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.count("\n") == 1 and done.stderr.startswith(f"error: cannot write {out}")
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("command", ["traces import", "collect", "traces stats --plot"])
def test_a_full_disk_is_one_line_and_leaves_nothing(pipe: Pipeline, tmp_path: Path,
                                                    command: str) -> None:
    out = tmp_path / ("x.png" if command == "traces stats --plot" else "out")
    args = {"traces import": ["traces", "import", routing_npz(pipe, tmp_path.parent / "f.npz"),
                              "--model", pipe.model, "--out", out],
            "collect": ["collect", "--model", pipe.model, "--random-tokens", 16,
                        "--max-length", 8, "--out", out, "--no-progress"],
            "traces stats --plot": ["traces", "stats", pipe.traces, "--plot", out]}
    done = placer_on_a_full_disk(64, *args[command])
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("error: "), done.stderr
    assert str(out) in done.stderr
    assert os.listdir(tmp_path) == []


def test_sigterm_to_collect_leaves_no_temporary_file(pipe: Pipeline, tmp_path: Path,
                                                     monkeypatch) -> None:
    """SIGTERM arrives while the trace is written (here: sent by the writer itself, so that
    it arrives mid-file); the command stops in one line and removes what it wrote."""
    import traces.storing.writer

    class Terminated(Exception):
        pass

    def fallback(signum: int, frame: object) -> None:  # pytest dies of SIGTERM otherwise
        raise Terminated

    write = traces.storing.writer.TraceWriter.write

    def write_then_term(self, *args, **kwargs):
        write(self, *args, **kwargs)
        os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(traces.storing.writer.TraceWriter, "write", write_then_term)
    previous = signal.signal(signal.SIGTERM, fallback)
    try:
        result = invoke("collect", "--model", pipe.model, "--random-tokens", 16,
                        "--max-length", 8, "--out", tmp_path / "tr", "--no-progress")
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert_one_line_error(result, "interrupted by SIGTERM", code=143)
    assert os.listdir(tmp_path) == []
