"""Real routing recorded from a trained MoE model, as trace directories for tests.

`../shared/data/routing/esft-deepseek-v2-lite/<task>.npz` (see that folder's README): the
top-6 routed expert ids `expert_ids` int16 [tokens, 26, 6] of ESFT-vanilla-lite
(DeepSeek-V2-Lite architecture: MoE at decoder layers 1..26 of 27, 64 experts) over a task's
text, teacher-forced, tokens in sequence order with `seq_lens` int64 [sequences]. Written
here with traces.writer.TraceWriter as `placer collect --mode score` writes (every token a
`decode` row); to be replaced by `placer traces import --format tokens` once it lands.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from traces.schema import PHASES, SEQ_ID_SHIFT
from traces.writer import TraceWriter

ROUTING = Path(__file__).resolve().parent.parent.parent / "shared" / "data" / "routing"
ESFT = ROUTING / "esft-deepseek-v2-lite"
ESFT_CONFIG = ESFT / "config.json"
ESFT_MOE_LAYERS = tuple(range(1, 27))


def esft_trace(task: str, out: Path, max_tokens: int = 2000, run_id: int = 1,
               first_sequence: int = 0) -> Path:
    """out/: the sequences of ESFT `task` from `first_sequence` on, up to `max_tokens` tokens
    (the last sequence cut there), as a per-token trace directory (sequence ids keep their
    index in the task: held-out sets from other `first_sequence`s never share one)."""
    data = np.load(ESFT / f"{task}.npz")
    ids, lengths = data["expert_ids"], data["seq_lens"]
    num_layers, top_k = ids.shape[1], ids.shape[2]
    meta = {"kind": "tokens", "fingerprint": f"esft-vanilla-lite-{task}", "num_layers": 27,
            "moe_layers": list(ESFT_MOE_LAYERS), "experts_per_layer": 64, "top_k": top_k,
            "tag": task, "run_id": run_id}
    out.mkdir(parents=True, exist_ok=True)
    writer = TraceWriter(out / f"{task}-{run_id:08x}.parquet", tag=task, top_k=top_k, meta=meta)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    written = 0
    with writer:
        for s in range(first_sequence, len(lengths)):
            n = int(min(lengths[s], max_tokens - written))
            if n <= 0:
                break
            seq = np.repeat((run_id << SEQ_ID_SHIFT) + s, n * num_layers)
            pos = np.repeat(np.arange(n), num_layers)
            layer = np.tile(np.array(ESFT_MOE_LAYERS), n)
            writer.write(seq, pos, np.zeros(n * num_layers), np.full(n * num_layers,
                         PHASES.index("decode")), layer,
                         ids[starts[s]:starts[s] + n].reshape(-1, top_k), None)
            written += n
        writer.close()
    return out
