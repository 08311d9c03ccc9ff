"""Fixtures of the llama.cpp engine tests: a tiny Hugging Face MoE and the GGUF llama.cpp's
own converter makes of it, built once per session (plugin: `pytest_plugins =
["gguf_models"]`).

The converter is `convert_hf_to_gguf.py` of the llama.cpp that llama-cpp-python 0.3.36
vendors (0c1e5709), unpacked by `make llama-env` into `.venv-llama/llama.cpp/` and run by
this interpreter (torch, transformers, numpy). One thing is changed at run time, not in its
files: the tiny tokenizer, trained here, is no BPE pre-tokenizer the converter knows by
hash (`get_vocab_base_pre` raises), so it is declared byte-level GPT-2's, which it is
(`placer.checkpoint.tiny.train_tokenizer`); token ids are fed to llama.cpp directly anyway.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from once_per_run import once_per_run

from placer.checkpoint.tiny import build_tiny_model

REPO = Path(__file__).resolve().parent.parent
CONVERTER = REPO / ".venv-llama" / "llama.cpp"

CONVERT = """
import runpy, sys
from pathlib import Path
src = Path(sys.argv[1])
sys.argv = [str(src / "convert_hf_to_gguf.py")] + sys.argv[2:]
sys.path[:0] = [str(src), str(src / "gguf-py")]
import conversion.base
conversion.base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "gpt-2"
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def convert(model_dir: Path, out: Path, outtype: str = "f32") -> Path:
    """`convert_hf_to_gguf.py model_dir --outtype outtype --outfile out`."""
    if not (CONVERTER / "convert_hf_to_gguf.py").is_file():
        pytest.fail(f"no llama.cpp converter in {CONVERTER}: run `make llama-env`")
    done = subprocess.run([sys.executable, "-c", CONVERT, str(CONVERTER), str(model_dir),
                           "--outtype", outtype, "--outfile", str(out)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise AssertionError(f"convert_hf_to_gguf.py failed:\n{done.stderr[-3000:]}")
    return out


@pytest.fixture(scope="session")
def gguf_pair(tmp_path_factory: pytest.TempPathFactory, prose: list[str]) -> tuple[Path, Path]:
    """(tiny qwen3_moe checkpoint dir, its F32 GGUF): 3 layers, 8 experts, top-2; built once
    per test run (once_per_run.py)."""
    def build(root: Path) -> tuple[Path, Path]:
        model = build_tiny_model("qwen3_moe", root / "qwen3_moe", texts=prose[:600],
                                 router_scale=3.0)
        return model, convert(model, root / "qwen3_moe-f32.gguf")

    return once_per_run(tmp_path_factory, "gguf", build)


@pytest.fixture(scope="session")
def gguf_bench(tmp_path_factory: pytest.TempPathFactory, prose: list[str]) -> tuple[Path, Path]:
    """(checkpoint dir, F32 GGUF) of a tiny qwen3_moe whose experts are big enough for a
    1 MiB --moe-cache-mib to hold a fraction of them: hidden 128 (experts of 96 KiB), 16
    experts, 3 layers, top-2; built once per test run (once_per_run.py)."""
    def build(root: Path) -> tuple[Path, Path]:
        model = build_tiny_model("qwen3_moe", root / "qwen3_moe", texts=prose[:600],
                                 router_scale=3.0, hidden=128, experts=16)
        return model, convert(model, root / "qwen3_moe-f32.gguf")

    return once_per_run(tmp_path_factory, "gguf-bench", build)
