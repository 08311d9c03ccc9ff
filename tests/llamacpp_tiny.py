"""A tiny llama.cpp plan, solved end to end from a tiny GGUF on one or two small cards, for
the llama.cpp plan tests (engine-section checks, export, the newcomer fixes)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from llamacpp_boxes import write_one_card_spec
from typer.testing import CliRunner

from placer.cli import app

LAYERS, EXPERTS = 4, 4


def expert_bytes() -> int:
    """Bytes of one expert of the tiny GGUF (gguf_files.write_moe_gguf, hidden 256, ff 512)."""
    from gguf import GGMLQuantizationType as T
    from gguf_files import row_bytes

    return (512 * row_bytes(T.Q4_K, 256) + 512 * row_bytes(T.Q6_K, 256)
            + 256 * row_bytes(T.Q8_0, 512))


def tiny_gguf(root: Path, name: str = "tiny.gguf", **kw) -> Path:
    from gguf_files import write_moe_gguf

    model = root / name
    write_moe_gguf(model, layers=LAYERS, experts=EXPERTS, top_k=2, hidden=256, ff=512, **kw)
    return model


def tiny_traces(root: Path, model: Path, name: str = "tr", seed: int = 0) -> Path:
    """Routing of 12 sequences x 50 tokens with a skew (experts 0 and 1 most often)."""
    rng = np.random.default_rng(seed)
    p = np.array([0.4, 0.3, 0.2, 0.1])
    ids = np.stack([rng.choice(EXPERTS, 2, replace=False, p=p)
                    for _ in range(600 * LAYERS)]).reshape(600, LAYERS, 2)
    np.savez(root / f"{name}.npz", expert_ids=ids.astype(np.int16),
             seq_lens=np.full(12, 50, dtype=np.int64))
    done = CliRunner().invoke(app, ["traces", "import", str(root / f"{name}.npz"), "--format",
                                    "tokens", "--model", str(model), "--out", str(root / name)])
    assert done.exit_code == 0, done.output
    return root / name


def two_card_spec(path: Path, vram: int) -> Path:
    """Two cards of `vram` bytes each (nothing reserved but 1 MiB of KV), 10 GB/s links."""
    path.write_text(f'name = "two"\ndescription = "two"\nhost_ram = "1GiB"\ncards = 2\n'
                    f'[card]\nmodel = "t"\nvram = "{vram}B"\nreserved_kv = "1MiB"\n'
                    f'h2d_bandwidth = "10GB/s"\nlatency_us = 5.0\n'
                    f'[decode]\nbase_step_ms = {{ 1 = 5.0, 4 = 6.0 }}\n'
                    f'[host]\nmemory_bandwidth = "50GB/s"\nflops = "1TFLOPS"\nsync_us = 20.0\n')
    return path


def solve(root: Path, model: Path, traces: Path, spec: Path, *extra: str,
          out: str = "plan.json") -> tuple[Path, str]:
    plan = root / out
    done = CliRunner().invoke(app, ["solve", "--engine", "llamacpp", "--model", str(model),
                                    "--hardware", str(spec), "--traces", str(traces),
                                    "--concurrency", "1,4", "--out", str(plan), *extra])
    assert done.exit_code == 0, done.output
    return plan, done.output


def two_card_plan(root: Path, *extra: str) -> tuple[Path, Path, Path]:
    """(plan.json, its GGUF, traces) of a two-card plan with host layers and a cached option
    (solved with `extra` options): 4 layers at -ts 1,1 (0-2 on card 0, 3 on card 1); card 0
    holds one layer and 1 MiB more."""
    model = tiny_gguf(root)
    traces = tiny_traces(root, model)
    spec = two_card_spec(root / "two.toml", (1 << 20) + 4 * expert_bytes() + (1 << 20))
    plan, _ = solve(root, model, traces, spec, *extra)
    return plan, model, traces


def one_card(root: Path, layers_that_fit: float = 2) -> Path:
    """A one-card spec with room for `layers_that_fit` layers' experts."""
    return write_one_card_spec(root / "box.toml",
                               int(layers_that_fit * EXPERTS * expert_bytes()) + 1000)


def load(path: Path) -> dict:
    return json.loads(path.read_text())
