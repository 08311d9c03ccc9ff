"""A plugin fixture (tests name it in `pytest_plugins`): `fake`, llama.cpp's runner driving
tests/fake_llama_worker.py instead of the real worker, for the worker-protocol tests."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import traces.llamacpp.runner as runner
from traces.llamacpp.runner import EngineOptions, LlamaCpp

FAKE = Path(__file__).with_name("fake_llama_worker.py")


@pytest.fixture
def fake(monkeypatch, tmp_path):
    """`fake(mode)`: LlamaCpp on a stand-in GGUF runs the fake worker in `mode`."""
    monkeypatch.setattr(runner, "WORKER", FAKE)
    monkeypatch.setenv("PLACER_LLAMA_PYTHON", sys.executable)
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")

    def start(mode: str) -> LlamaCpp:
        monkeypatch.setenv("PLACER_FAKE_MODE", mode)
        return LlamaCpp(EngineOptions(str(gguf), n_ctx=64, n_batch=32))

    return start
