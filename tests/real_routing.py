"""Real routing recorded from a trained MoE model, as trace directories for tests.

`../shared/data/routing/esft-deepseek-v2-lite/<task>.npz` (see that folder's README): the
top-6 routed expert ids `expert_ids` int16 [tokens, 26, 6] of ESFT-vanilla-lite
(DeepSeek-V2-Lite architecture: MoE at decoder layers 1..26 of 27, 64 experts) over a task's
text, teacher-forced, tokens in sequence order with `seq_lens` int64 [sequences]. A slice of
its sequences is written as a tokens file and imported as a user would
(`placer traces import --format tokens --config config.json`: every token a `decode` row).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from typer.testing import CliRunner

from placer.cli import app

ROUTING = Path(__file__).resolve().parent.parent.parent / "shared" / "data" / "routing"
ESFT = ROUTING / "esft-deepseek-v2-lite"
ESFT_CONFIG = ESFT / "config.json"
GPTOSS = ROUTING / "gptoss20b-decode"  # gpt-oss-20b decode routing: 24 layers x 32, top-4


def esft_trace(task: str, out: Path, max_tokens: int = 2000,
               first_sequence: int = 0) -> Path:
    """out/: the sequences of ESFT `task` from `first_sequence` on, up to `max_tokens` tokens
    (the last sequence cut there), imported as a per-token trace directory."""
    return routing_trace(ESFT, task, out, max_tokens, first_sequence)


def routing_trace(folder: Path, task: str, out: Path, max_tokens: int = 2000,
                  first_sequence: int = 0) -> Path:
    """esft_trace of any folder of the same npz format (its config.json)."""
    data = np.load(folder / f"{task}.npz")
    ids, lengths = data["expert_ids"], data["seq_lens"]
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    rows, lens = [], []
    for s in range(first_sequence, len(lengths)):
        n = int(min(lengths[s], max_tokens - sum(lens)))
        if n <= 0:
            break
        rows.append(ids[starts[s]:starts[s] + n])
        lens.append(n)
    source = out.parent / f"{out.name}.npz"
    np.savez(source, expert_ids=np.concatenate(rows), seq_lens=np.array(lens, dtype=np.int64))
    result = CliRunner().invoke(app, ["traces", "import", str(source), "--format", "tokens",
                                      "--config", str(folder / "config.json"), "--out", str(out),
                                      "--tag", task])
    assert result.exit_code == 0, result.output
    return out
