"""Shared fixtures: tiny real MoE checkpoints of all five architectures, real text, the CLI."""

from __future__ import annotations

import os
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
