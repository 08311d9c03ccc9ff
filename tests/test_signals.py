"""Every command stops on SIGINT with exit status 130 and on SIGTERM with 143, in one line,
and leaves nothing it wrote (issue 53, item 8). The signal is sent at several points of a
`collect` (its model loading, each trace write, closing the trace, inside a finalizer that
runs meanwhile) and, in a real process, while it starts.

A signal whose handler ran inside a finalizer (`__del__`, a weakref callback) used to be
lost: Python prints `Exception ignored in ...` for an exception raised there, and further
signals were ignored, so `collect` ran on to exit 0 with its trace written (1 SIGTERM in 22
at random times). A SIGTERM before the command line was imported killed Python silently
(status -15) instead of the one line. A SIGTERM while `collect` imported torch aborted it
(status -6: raised inside torch's C++ initialisation; 1 in 150), and one while placer
started ended it by SIGINT (status -2: CPython's record of a KeyboardInterrupt raised in
`exec`'d code; 3 in 80)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_errors import assert_one_line_error

from placer.placed.commit import Interrupted, Signals

REPO = Path(__file__).resolve().parent.parent
STATUS = {signal.SIGINT: 130, signal.SIGTERM: 143}


class SendsOnDelete:
    """An object whose finalizer sends `signum` to this process and runs on a while (so that
    the handler runs inside the finalizer, where an exception cannot propagate)."""

    def __init__(self, signum: int) -> None:
        self.signum = signum

    def __del__(self) -> None:
        os.kill(os.getpid(), self.signum)
        end = time.monotonic() + 0.05
        while time.monotonic() < end:
            pass


@pytest.fixture(scope="module")
def model(tiny_models: dict[str, Path]) -> Path:
    return tiny_models["qwen3_moe"]


@pytest.fixture
def fallback_sigterm():
    """pytest itself dies of a SIGTERM that no placer handler catches: raise instead."""

    def raise_it(signum: int, frame: object) -> None:
        raise RuntimeError("SIGTERM reached the test process")

    previous = signal.signal(signal.SIGTERM, raise_it)
    yield
    signal.signal(signal.SIGTERM, previous)


def test_a_signal_inside_a_finalizer_is_not_lost(fallback_sigterm) -> None:
    seen = []
    with pytest.raises(Interrupted, match="SIGTERM"), Signals():
        obj = SendsOnDelete(signal.SIGTERM)
        del obj  # the handler runs in __del__: the Interrupted cannot leave it
        for _ in range(200):  # ... and is raised again here, within AGAIN_S
            seen.append(len(seen))
            time.sleep(0.005)
    assert len(seen) < 100


def test_a_signal_while_a_module_is_imported_waits_for_the_import(tmp_path: Path,
                                                                   fallback_sigterm) -> None:
    """The module sends SIGTERM to this process from its body and runs on: the Interrupted
    comes once the import has finished, never inside it."""
    (tmp_path / "signals_mid_import.py").write_text(
        "import os, signal\n"
        "os.kill(os.getpid(), signal.SIGTERM)\n"
        "steps = [n for n in range(100_000)]\n"
        "done = True\n")
    sys.path.insert(0, str(tmp_path))
    try:
        with pytest.raises(Interrupted, match="SIGTERM"), Signals():
            import signals_mid_import  # noqa: F401
            for _ in range(1000):  # the thread sends the signal again within IMPORT_POLL_S
                time.sleep(0.005)
        assert sys.modules["signals_mid_import"].done
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("signals_mid_import", None)


def test_an_interrupt_raised_in_exec_code_exits_with_placers_status(tmp_path: Path) -> None:
    """A KeyboardInterrupt raised inside `exec`'d code while the command line is imported
    (there: dataclasses' methods), caught by placer: `python -m` exits 143, not by SIGINT."""
    (tmp_path / "starts_interrupted.py").write_text(
        "import sys, types\n"
        "from placer import cli\n"
        "app = types.ModuleType('placer.commands.app')\n"
        "app.__getattr__ = lambda name: exec(\"raise KeyboardInterrupt('SIGTERM')\")\n"
        "sys.modules['placer.commands.app'] = app\n"
        "cli.main()\n")
    assert_ended_by_sigterm_in_one_line(tmp_path, "starts_interrupted")


def assert_ended_by_sigterm_in_one_line(where: Path, module: str) -> None:
    """`python -m MODULE` (a file in `where`) exits 143 with placer's one line, no more."""
    proc = subprocess.run([sys.executable, "-m", module], cwd=where,
                          env={**os.environ, "PYTHONPATH": f"{where}:{REPO}"},
                          capture_output=True, text=True, timeout=60)
    assert (proc.returncode, proc.stdout, proc.stderr) == (
        143, "", "error: interrupted by SIGTERM; nothing was done\n")


POINTS = {  # where: (module, attribute), and when: before or after calling it, or inside
    # a finalizer that runs after it
    "loading the model": ("traces.collecting.collect", "load_model", "before"),
    "opening the trace": ("traces.storing.writer", "TraceWriter.__init__", "before"),
    "writing the trace": ("traces.storing.writer", "TraceWriter.write", "after"),
    "closing the trace": ("traces.storing.writer", "TraceWriter.close", "after"),
    "in a finalizer": ("traces.storing.writer", "TraceWriter.write", "finalizer"),
}


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
@pytest.mark.parametrize("point", list(POINTS))
def test_collect_stops_at_any_point_and_leaves_nothing(cli, model: Path, tmp_path: Path,
                                                       monkeypatch, fallback_sigterm,
                                                       point: str, signum: int) -> None:
    import importlib

    module_name, attribute, when = POINTS[point]
    owner = importlib.import_module(module_name)
    *path, name = attribute.split(".")
    for part in path:
        owner = getattr(owner, part)
    real = getattr(owner, name)
    sent = []

    def send() -> None:
        if sent:
            return
        sent.append(True)
        if when == "finalizer":
            obj = SendsOnDelete(signum)
            del obj
        else:
            os.kill(os.getpid(), signum)

    def patched(*args, **kwargs):
        if when == "before":
            send()
        result = real(*args, **kwargs)
        if when != "before":
            send()
        return result

    monkeypatch.setattr(owner, name, patched)
    result = cli("collect", "--model", model, "--random-tokens", 64, "--max-length", 16,
                 "--out", tmp_path / "tr", "--no-progress", ok=False)
    assert sent, "the signal was never sent"
    assert_one_line_error(result, f"interrupted by {signal.Signals(signum).name}",
                          code=STATUS[signum])
    assert os.listdir(tmp_path) == []  # what it wrote before the signal removed, nothing after


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_while_placer_starts_is_one_line(tmp_path: Path, model: Path,
                                                  signum: int) -> None:
    """A real `python -m placer collect` signalled while it imports its command line."""
    proc = subprocess.Popen([sys.executable, "-m", "placer", "collect", "--model", str(model),
                             "--random-tokens", "64", "--max-length", "16", "--out",
                             str(tmp_path / "tr"), "--no-progress"], cwd=REPO,
                            env={**os.environ, "PYTHONPATH": str(REPO)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(0.3)
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=120)
    assert (proc.returncode, out) == (STATUS[signum], ""), err
    name = signal.Signals(signum).name
    assert err in (f"error: interrupted by {name}; nothing was done\n",
                   f"error: interrupted by {name}; nothing partial was left behind\n"), err
    assert os.listdir(tmp_path) == []
