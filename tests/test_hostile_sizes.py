"""Files larger than their kind ever is (issue 44, class 1): every reader goes through the one
bounded read (traces/formats/bounded.py), so a sparse 8 GiB file (`truncate`: no disk used) is one
line naming the file and its size, exit 1, before a byte is read: not a MemoryError
traceback (it was, for the plan, manifest, config.json, index, spec TOML, `--prompt-lens`,
meta_info.json, load balancer YAML and every corpus line). The commands run in a child under
a 3 GiB address-space limit (tests/bounded_cli.py), so reading one whole fails there."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from bounded_cli import run_bounded
from importer_files import EXPERTS, MOE_LAYERS, TOP_K, write_config
from safetensors.torch import save_file
from test_input_properties import CONFIG, checkpoint, header_and_data, safetensors_bytes

from traces.errors import TraceError
from traces.formats.bounded import LIMITS, LINE_LIMITS, MAX_BLOCK, bounded_lines, read_bounded

SPARSE = 8 << 30  # 8 GiB, sparse
MiB = 1 << 20


def sparse(path: Path, head: bytes = b"", size: int = SPARSE) -> Path:
    """`path` holding `head` then zero bytes up to `size` (a hole: costs no disk)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(head)
    os.truncate(path, size)
    return path


def cases(root: Path) -> list[tuple[list[str], Path, str]]:
    """(placer argv, the 8 GiB file it reads, a word of the error) for every file reader."""
    out: list[tuple[list, Path, str]] = []
    ckpt = checkpoint(root / "c1")
    sparse(ckpt / "config.json", json.dumps(CONFIG).encode())
    out.append((["inspect", ckpt], ckpt / "config.json", "config"))
    ckpt2 = checkpoint(root / "c2", shard=safetensors_bytes(*header_and_data()))
    index = sparse(ckpt2 / "model.safetensors.index.json", b'{"weight_map": {')
    out.append((["inspect", ckpt2], index, "index"))
    box = sparse(root / "box.toml", b'name = "x"\n')
    out.append((["hardware", "show", box], box, "spec"))
    plan = sparse(root / "plan.json", b'{"format": 1')
    out.append((["export", "llamacpp", plan], plan, "plan"))
    manifest = sparse(root / "placed" / "manifest.json", b"{")
    out.append((["verify", root / "placed", "--model", ckpt], manifest, "manifest"))
    config = write_config(root / "model")
    np.save(root / "r.npy", np.zeros((2, 4, 2), np.int32) + [0, 1])
    lens = sparse(root / "lens.json", b'{"r": 2')
    out.append((["traces", "import", root / "r.npy", "--format", "vllm", "--config", config,
                 "--prompt-lens", lens, "--out", root / "o1"], lens, "prompt-lens"))
    stats = root / "stats"
    meta = sparse(stats / "meta_info.json", b'{"num_experts": 8')
    (stats / "rank0.safetensors").write_bytes(b"")
    out.append((["traces", "import", stats, "--format", "trtllm", "--out", root / "o2"], meta,
                "meta"))
    stats2 = root / "stats2"
    stats2.mkdir()
    (stats2 / "meta_info.json").write_text(json.dumps({"num_experts": EXPERTS,
                                                       "num_experts_per_token": TOP_K}))
    save_file({f"10_{layer}": torch.ones(EXPERTS, dtype=torch.int64) for layer in MOE_LAYERS},
              stats2 / "rank0.safetensors")
    balancer = sparse(root / "lb.yaml", b"num_slots: 8\n")
    out.append((["traces", "import", stats2, "--format", "trtllm", "--config", config,
                 "--load-balancer", balancer, "--out", root / "o3"], balancer, "load-balancer"))
    for name, head in (("r.jsonl", b'{"meta_info": '), ("c.txt", b"a line\n"),
                       ("c.jsonl", b'{"text": "a"}\n{"text": "')):
        # streamed files: a line past its bound, not 8 GiB (the import hashes its sources
        # first: 8 GiB of zeros take 45 s, in constant memory)
        corpus = sparse(root / "corpora" / name, head, LINE_LIMITS["jsonl"] + MiB)
        if name == "r.jsonl":
            out.append((["traces", "import", corpus, "--config", config, "--out", root / "o4"],
                        corpus, "jsonl"))
        else:
            out.append((["collect", "--model", root / "model", "--corpus", corpus, "--out",
                         root / "o5", "--no-progress"], corpus, "corpus"))
    return out


def test_every_reader_refuses_a_sparse_8_gib_file_in_one_line(tmp_path: Path) -> None:
    """Every reader, one 8 GiB file each: exit 1, one `error:` line naming the file and what
    a file of its kind may hold, under a 3 GiB address space, in seconds."""
    found = cases(tmp_path)
    results = run_bounded([[str(a) for a in args] for args, _, _ in found])
    for (args, path, kind), result in zip(found, results, strict=True):
        assert result["exception"] == "SystemExit", (args, result)
        assert result["exit_code"] == 1, (args, result)
        lines = result["stderr"].splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), (args, result["stderr"])
        assert str(path) in lines[0] or path.name in lines[0], (args, lines[0])
        assert f"a {kind} " in lines[0], (args, lines[0])
        assert result["seconds"] < 20, (args, result["seconds"])
    assert not any((tmp_path / f"o{i}").exists() for i in range(1, 6))


def test_the_bound_is_checked_by_stat_before_reading(tmp_path: Path) -> None:
    """A file one byte past its kind's limit is refused from its stat, saying so; a file of
    exactly the limit is read whole."""
    path = sparse(tmp_path / "plan.json", b"{", LIMITS["plan"] + 1)
    with pytest.raises(TraceError, match=r"plan.json: 67108865 bytes, more than a plan file "
                                         r"may hold \(64 MiB\); refused before reading it"):
        read_bounded(path, "plan")
    exact = sparse(tmp_path / "exact.toml", b"", LIMITS["spec"])
    assert len(read_bounded(exact, "spec")) == LIMITS["spec"]
    with pytest.raises(TraceError, match="is a directory, expected a spec file"):
        read_bounded(tmp_path, "spec")


def test_a_pipe_or_device_is_read_at_most_one_byte_past_the_limit() -> None:
    """/dev/zero has no size to stat: the read stops one byte past the limit."""
    with pytest.raises(TraceError, match="/dev/zero: more than 1 MiB, more than a spec file"):
        read_bounded(Path("/dev/zero"), "spec")


def test_lines_are_bounded_not_files(tmp_path: Path) -> None:
    """A corpus may be any length; one line (or a .txt document) may not: the error names
    the line and its byte offset."""
    limit = LINE_LIMITS["corpus"]
    path = tmp_path / "c.txt"
    with path.open("wb") as f:
        f.write(b"short\n" * 3)
        f.write(b"x" * (limit - 1) + b"\n")  # exactly the limit, newline included
        f.write(b"y" * limit + b"\n")
    lines = bounded_lines(path, "corpus")
    assert [n for n, _, _ in (next(lines) for _ in range(4))] == [1, 2, 3, 4]
    with pytest.raises(TraceError, match=rf"c.txt:5: a line longer than 16 MiB \(at byte "
                                         rf"offset {18 + limit}\)"):
        next(lines)
    from traces.collecting.corpora import open_corpus

    block = tmp_path / "block.txt"
    block.write_bytes(b"z" * 1000 + b"\n" + (b"w" * (1 << 20) + b"\n") * (MAX_BLOCK >> 20))
    with pytest.raises(TraceError, match=r"block.txt line 17: a document \(lines up to a "
                                         r"blank one\) longer than 16 MiB"):
        open_corpus(block)
