"""The decode tokens of a trace with speculative routing, as arrays for a prefetch replay.

Traces collected from a checkpoint carry `spec_experts` (traces.storing.schema); this reads
them with the recorded routing, one token a step (batch 1) in (sequence, position) order.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from traces.errors import TraceError
from traces.storing.dataset import open_traces, stream_rows
from traces.storing.schema import SPECULATIVE_COLUMN, has_speculative


def has_speculative_dir(trace_dir: Path) -> bool:
    """Whether every per-token trace file under `trace_dir` holds `spec_experts`."""
    td = open_traces(trace_dir)
    return bool(td.metas) and all(has_speculative(m) for m in td.metas)


def speculative_steps(trace_dir: Path, max_steps: int | None = None
                      ) -> tuple[np.ndarray, np.ndarray]:
    """(actual, predicted): [S, L, k] int64 expert ids of the decode tokens (the first
    `max_steps`, None: all), in (sequence, position) order, and their `spec_experts` (-1 on
    the first MoE layer); a TraceError if a file lacks the column."""
    td = open_traces(trace_dir)
    if not has_speculative_dir(trace_dir):
        raise TraceError(f"{trace_dir}: a trace without {SPECULATIVE_COLUMN} (collect it "
                         "again with `placer collect --model`)")
    columns = ["seq_id", "pos", "layer", "experts", SPECULATIVE_COLUMN]
    parts = list(stream_rows(td, columns, "decode", None, None))
    if not parts:
        raise TraceError(f"{trace_dir}: no decode tokens")
    rows = {c: np.concatenate([p[c] for p in parts]) for c in columns}
    order = np.lexsort((rows["layer"], rows["pos"], rows["seq_id"]))
    shape = (-1, len(td.model["moe_layers"]), td.model["top_k"])
    actual = rows["experts"][order].reshape(shape)[:max_steps].astype(np.int64)
    predicted = rows[SPECULATIVE_COLUMN][order].reshape(shape)[:max_steps].astype(np.int64)
    return actual, predicted
