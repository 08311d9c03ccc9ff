"""Shared fixtures: tiny real MoE checkpoints of all five architectures, real text, the CLI."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from placer.checkpoint.tiny import ARCHITECTURES, build_tiny_model

REPO = Path(__file__).resolve().parent.parent
SHARED_DATA = REPO.parent / "shared" / "data"


@pytest.fixture(autouse=True, scope="session")
def _digest_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Emit's source sha256 cache (placer/digests.py) in a temporary directory, not ~/.cache."""
    os.environ["PLACER_CACHE_DIR"] = str(tmp_path_factory.mktemp("placer-cache"))


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """Real public text: ../shared/data where it exists (CI), else the bundled slice."""
    return SHARED_DATA if SHARED_DATA.is_dir() else REPO / "examples" / "data"


@pytest.fixture(scope="session")
def prose(data_dir: Path) -> list[str]:
    name = "shakespeare.txt" if (data_dir / "shakespeare.txt").exists() else "shakespeare_head.txt"
    return [b for b in (data_dir / name).read_text().split("\n\n") if b.strip()]


@pytest.fixture
def quick_host_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    """`placer probe --host` (run in-process) at a test's cost: its expert pool sized for a
    1 MiB last-level cache instead of this host's (4 x 32 MiB of 64x32 experts is ~11,000 of
    them, each run once untimed before the timing starts: most of a probe's time), each
    curve timed for at least 0.2 s, at most 1 s, instead of 2 s and 10 s, and the copy and
    the matmul for at least 0.05 s, at most 0.3 s, instead of 0.25 s and 2 s. The figures
    come out rougher; what the tests check (which figures, their shapes, types and order,
    the TOML they make) does not depend on any of these."""
    import functools

    import placer.hardware.expert_probe as expert_probe
    import placer.hardware.probe as probe

    monkeypatch.setattr(probe, "last_level_cache_bytes", lambda: 2**20)
    monkeypatch.setattr(expert_probe, "MIN_PROBE_S", 0.2)
    monkeypatch.setattr(expert_probe, "PROBE_BUDGET_S", 1.0)
    monkeypatch.setattr(probe, "best_seconds",
                        functools.partial(probe.best_seconds, min_s=0.05, budget_s=0.3))


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory, prose: list[str]) -> dict[str, Path]:
    """One tiny checkpoint per architecture (mixtral sharded, with an index file)."""
    root = tmp_path_factory.mktemp("tiny")
    return {arch: build_tiny_model(arch, root / arch, texts=prose[:2000],
                                   max_shard_size="100KB" if arch == "mixtral" else None)
            for arch in ARCHITECTURES}


class Cli:
    """Run `placer` commands in-process, as a user would type them."""

    def __init__(self) -> None:
        self.runner = CliRunner()

    def __call__(self, *args: str | Path, ok: bool = True):
        from placer.cli import app

        result = self.runner.invoke(app, [str(a) for a in args])
        if ok and result.exit_code != 0:
            raise AssertionError(f"placer {' '.join(map(str, args))} exited {result.exit_code}:"
                                 f"\n{result.output}\n{result.exception!r}")
        return result


@pytest.fixture(scope="session")
def cli() -> Cli:
    return Cli()


@pytest.fixture(scope="session")
def warm_placer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The command a shell line runs for `placer ARGS` (then "$@"): a fork of a warm server
    that imported placer and torch once (tests/warm_placer.py), for the tests that run the
    README's blocks line by line. The server is not this process's child (a shell starts it
    in the background and exits), so the tests that check that nothing they started is left
    running see none of it; it stops when killed here, or when this process is gone."""
    sock = tmp_path_factory.mktemp("warm") / "placer.sock"
    log = sock.with_name("server.log")
    command = (f'"{sys.executable}" "{REPO / "tests" / "warm_placer.py"}" serve "{sock}" '
               f'{os.getpid()} > "{log}" 2>&1 < /dev/null & echo $!')
    pid = int(subprocess.run(["bash", "-c", command], capture_output=True, text=True, check=True,
                             env={**os.environ, "PYTHONPATH": str(REPO)}).stdout)
    deadline = time.monotonic() + 300
    while not sock.exists():
        if not Path(f"/proc/{pid}").exists() or time.monotonic() > deadline:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            raise RuntimeError(f"warm_placer did not start: {log.read_text()[-2000:]}")
        time.sleep(0.1)
    yield f'"{sys.executable}" -S "{REPO / "tests" / "warm_placer.py"}" call "{sock}"'
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
