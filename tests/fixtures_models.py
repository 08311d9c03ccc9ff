"""Fixtures of the trace tests: tiny checkpoints of all five architectures that `placer collect`
runs, and traces collected from them. Loaded by tests/test_collect*.py and test_traces*.py as
a plugin (`pytest_plugins = ["fixtures_models"]`), so each session fixture is built once.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from once_per_run import once_per_run
from typer.testing import CliRunner

from placer.checkpoint.tiny import ARCHITECTURES, build_tiny_model

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared" / "data"
DATA = SHARED if SHARED.is_dir() else REPO / "examples" / "data"
PROSE = DATA / ("shakespeare.txt" if (DATA / "shakespeare.txt").exists()
                else "shakespeare_head.txt")
CHAT = DATA / "vicuna_bench_questions.jsonl"
MT_BENCH = DATA / "mt_bench_questions.jsonl"


@functools.cache
def prose_blocks() -> list[str]:
    """Blank-line-separated blocks of the real prose corpus."""
    return [b for b in PROSE.read_text().split("\n\n") if b.strip()]


def make_deepseek_runnable(model_dir: Path, seed: int = 0) -> None:
    """Make the tiny deepseek_v3 checkpoint exercise what real DeepSeek routing does.

    - num_key_value_heads = num_attention_heads: MLA expands keys and values to every head,
      and transformers 5 repeats them num_heads / num_key_value_heads more times, so the tiny
      builder's 2 KV heads make every forward pass fail (a shape mismatch in attention).
    - a non-zero `e_score_correction_bias` (a fresh model has zeros), so that a capture that
      ignored the bias correction would record different experts.
    """
    from safetensors.torch import load_file, save_file

    config_path = model_dir / "config.json"
    config = json.loads(config_path.read_text())
    config["num_key_value_heads"] = config["num_attention_heads"]
    config_path.write_text(json.dumps(config, indent=2) + "\n")
    weights_path = model_dir / "model.safetensors"
    tensors = load_file(weights_path)
    rng = np.random.default_rng(seed)
    import torch

    for name, tensor in tensors.items():
        if name.endswith("e_score_correction_bias"):
            tensors[name] = torch.from_numpy(
                rng.normal(0.0, 0.3, tensor.shape).astype(np.float32))
    save_file(tensors, weights_path, metadata={"format": "pt"})


@pytest.fixture(scope="session")
def trace_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """{arch: tiny checkpoint dir} for the five architectures (3 layers, 8 experts, top-2);
    built once per test run (once_per_run.py)."""
    return once_per_run(tmp_path_factory, "trace_models", build_trace_models)


def build_trace_models(root: Path) -> dict[str, Path]:
    texts = prose_blocks()[:600]
    models = {}
    for arch in ARCHITECTURES:
        out = build_tiny_model(arch, root / arch, texts=texts, router_scale=3.0)
        if arch == "deepseek_v3":
            make_deepseek_runnable(out)
        models[arch] = out
    return models


def invoke(*args: str | Path, ok: bool = True):
    """Run `placer ARGS` in-process; with ok=True, fail the test unless it exits 0."""
    from placer.cli import app

    result = CliRunner().invoke(app, [str(a) for a in args])
    if ok and result.exit_code != 0:
        raise AssertionError(f"placer {' '.join(map(str, args))} exited {result.exit_code}:\n"
                             f"{result.output}\n{result.exception!r}")
    return result


def write_prose_corpus(path: Path, blocks: int = 12, start: int = 40) -> Path:
    """A .txt corpus of `blocks` real prose blocks of varied lengths."""
    path.write_text("\n\n".join(prose_blocks()[start:start + blocks]) + "\n")
    return path


@dataclass(frozen=True)
class TraceData:
    """The real corpora of the trace tests, and helpers over them."""

    prose: Path = PROSE
    chat: Path = CHAT
    mt_bench: Path = MT_BENCH

    @staticmethod
    def blocks() -> list[str]:
        return prose_blocks()

    @staticmethod
    def prose_corpus(path: Path, blocks: int = 12, start: int = 40) -> Path:
        return write_prose_corpus(path, blocks, start)


@pytest.fixture(scope="session")
def trace_data() -> TraceData:
    """Real public text: prose blocks, chat prompts (`turns`)."""
    return TraceData()


@pytest.fixture(scope="session")
def placer_run():
    """`placer_run(*args, ok=True)`: run `placer ARGS` in-process via typer's CliRunner."""
    return invoke


@pytest.fixture(scope="session")
def collected(tmp_path_factory: pytest.TempPathFactory,
              trace_models: dict[str, Path]) -> dict[tuple[str, str], Path]:
    """{(arch, mode): trace dir}: score mode over 12 prose blocks (batches of 5, so padded)
    plus 150 random tokens; generate mode over real chat prompts (batches of 3, left-padded),
    6 new tokens each, 400 tokens at most; built once per test run (once_per_run.py)."""
    return once_per_run(tmp_path_factory, "collected",
                        lambda root: collect_all(root, trace_models))


def collect_all(root: Path, trace_models: dict[str, Path]) -> dict[tuple[str, str], Path]:
    prose = write_prose_corpus(root / "prose.txt")
    out = {}
    for arch, model in trace_models.items():
        score = root / f"{arch}-score"
        invoke("collect", "--model", model, "--corpus", prose, "--random-tokens", 150,
               "--max-length", 48, "--batch-size", 5, "--out", score, "--no-progress")
        generate = root / f"{arch}-generate"
        invoke("collect", "--model", model, "--corpus", CHAT, "--mode", "generate",
               "--max-new-tokens", 6, "--max-tokens", 400, "--max-length", 40, "--batch-size", 3,
               "--out", generate, "--no-progress")
        out[(arch, "score")], out[(arch, "generate")] = score, generate
    return out

