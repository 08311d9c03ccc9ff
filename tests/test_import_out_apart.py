"""`traces import` never writes into or over what it imports (issue 35): --out inside an
imported directory, onto an imported file, or a directory holding one is refused in one line,
after the format is detected (a source of no known format says that first), for every
format, and nothing is written."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from cli_errors import assert_one_line_error
from importer_files import EXPERTS, MOE_LAYERS, random_routing, write_config
from safetensors.torch import save_file
from test_hostile_files import sglang_dump, sglang_record, sglang_response
from test_importers_counts_engines import write_imatrix

# format -> (file name, writer of one valid source of it, extra arguments)
SOURCES = {
    "counts": ("m.npy", lambda p: np.save(p, np.ones((len(MOE_LAYERS), EXPERTS), np.int64))),
    "tokens": ("r.npz", lambda p: np.savez(p, expert_ids=random_routing(
        np.random.default_rng(0), 6))),
    "sglang-http": ("r.jsonl", lambda p: p.write_text(json.dumps(sglang_response(
        np.random.default_rng(1), 3, 2)) + "\n")),
    "sglang": ("d.pt", lambda p: sglang_dump(p, [sglang_record()])),
    "imatrix": ("i.gguf", lambda p: write_imatrix(p, {layer: np.arange(1, EXPERTS + 1)
                                                      for layer in MOE_LAYERS})),
    "vllm": ("v.npy", lambda p: np.save(p, vllm_rows())),
}


def vllm_rows() -> np.ndarray:
    """[3 tokens, 4 decoder layers, top-2]: layer 0 is dense (zeros), the others route."""
    rows = np.zeros((3, 4, 2), np.int32)
    rows[:, 1:] = [0, 1]
    return rows


def tree(root: Path) -> list[tuple[str, int]]:
    return sorted((str(p.relative_to(root)), p.stat().st_size if p.is_file() else -1)
                  for p in root.rglob("*"))


def trtllm_stats(directory: Path) -> Path:
    directory.mkdir()
    (directory / "meta_info.json").write_text(json.dumps({"num_experts": EXPERTS,
                                                          "num_experts_per_token": 2}))
    save_file({f"10_{layer}": torch.ones(EXPERTS, dtype=torch.int64) for layer in MOE_LAYERS},
              directory / "rank0.safetensors")
    return directory


@pytest.mark.parametrize("fmt", [*SOURCES, "trtllm"])
def test_out_inside_or_onto_an_imported_source_is_refused(cli, tmp_path: Path,
                                                          fmt: str) -> None:
    config = write_config(tmp_path / "model")
    (tmp_path / "w").mkdir()
    src = tmp_path / "w" / "src"
    if fmt == "trtllm":
        source = trtllm_stats(src)
        cases = [(source, src / "inside", "is inside the imported"),
                 (source, tmp_path / "w", "holds the imported")]
    else:
        src.mkdir()
        name, write = SOURCES[fmt]
        source = src / name
        write(source)
        cases = [(src, src / "inside", "is inside the imported"),
                 (source, source, "is the imported"),
                 (source, src, "holds the imported"),
                 (source, source / "below", "not a directory")]
    extra = ["--format", fmt, "--config", config]
    if fmt in ("counts", "imatrix"):
        extra = ["--format", fmt, "--top-k", 2]
    for given, out, said in cases:
        before = tree(tmp_path)
        result = cli("traces", "import", given, "--out", out, *extra, ok=False)
        assert_one_line_error(result, said)
        assert tree(tmp_path) == before, fmt
    # and the same source imports where it may
    cli("traces", "import", source if fmt != "trtllm" else src, "--out", tmp_path / "o", *extra)
    assert any(p.suffix == ".parquet" for p in (tmp_path / "o").iterdir())


def test_out_holding_the_prompt_lens_file_is_refused(cli, tmp_path: Path) -> None:
    config = write_config(tmp_path / "model")
    np.save(tmp_path / "v.npy", vllm_rows())
    (tmp_path / "o").mkdir()
    (tmp_path / "o" / "lens.json").write_text('{"v": 2}')
    result = cli("traces", "import", tmp_path / "v.npy", "--format", "vllm", "--config", config,
                 "--prompt-lens", tmp_path / "o" / "lens.json", "--out", tmp_path / "o",
                 ok=False)
    assert_one_line_error(result, "holds --prompt-lens")
    assert os.listdir(tmp_path / "o") == ["lens.json"]


def test_a_source_of_no_known_format_says_so_before_the_out_check(cli, tmp_path: Path) -> None:
    """The check that was reverted ran before detection: a directory of no known format with
    --out inside it got the --out refusal instead of the format error."""
    np.save(tmp_path / "zero.npy", np.zeros((3, EXPERTS), np.int64))
    assert_one_line_error(cli("traces", "import", tmp_path, "--out", tmp_path / "o", ok=False),
                          "cannot tell the format of this directory")
