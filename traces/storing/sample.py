"""Bounded replays: a seeded sample of whole sequences where a trace set is too large to
replay every token.

`placer solve` and `placer evaluate` replay the tokens of a trace in the order served (the
cache split, the stall replay, the intervals over sequences); a replayed token costs memory
(its [L, k] selections, its share of each step and fold), so a replay of every token of a
production trace set would grow without bound. `replay_sample` picks, from one streaming
pass over the first MoE layer's rows (memory: one small record per sequence), whole
sequences in a seeded random order until the next would take the replay past
MAX_REPLAY_SELECTIONS (tokens x MoE layers x top-k); the statistics that need no order (the
profile's counts, the homes, the drift's point figure) stay over every token, streamed. A
trace set within the bound is not sampled at all (None), so its results are those of every
token. The same trace, seed and bound give the same sample.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from traces.storing.dataset import open_traces
from traces.storing.profile import _decode_or_all, _summarize
from traces.storing.schema import KIND_COUNTS

# Selections (tokens x MoE layers x top-k) a replay holds at most: about 215k tokens of a
# DeepSeek-V3-shaped model (58 layers, top-8), 1.5M of a Qwen3-30B-A3B-shaped one (48, top-8);
# solve's peak at this many is measured in docs/benchmarks.md (benchmarks/bench_scale.py).
MAX_REPLAY_SELECTIONS = 100_000_000


@dataclass(frozen=True)
class ReplaySample:
    """The sequences a replay keeps of a trace set too large to replay whole."""

    seq_ids: frozenset[int]
    tokens: int          # tokens of the kept sequences (rows of the replayed phase)
    of_tokens: int       # tokens of every sequence
    of_sequences: int
    seed: int
    max_selections: int

    @property
    def sequences(self) -> int:
        return len(self.seq_ids)

    def json(self) -> dict:
        """What a report says of the sample (`replay_sample` in --json)."""
        return {"sequences": self.sequences, "tokens": self.tokens,
                "of_sequences": self.of_sequences, "of_tokens": self.of_tokens,
                "seed": self.seed, "max_selections": self.max_selections}


def sample_note(where: str | Path, sample: dict) -> str:
    """One line saying what a replay of `where` kept (`sample`: ReplaySample.json())."""
    return (f"{where}: replayed a seeded sample of {sample['sequences']:,} whole sequences "
            f"({sample['tokens']:,} of {sample['of_tokens']:,} tokens, "
            f"{sample['of_sequences']:,} sequences; seed {sample['seed']}): a replay holds at "
            f"most {sample['max_selections']:,} selections (tokens x MoE layers x top-k); the "
            "profile's counts are over every token")


def replay_sample(trace_dir: Path, seed: int, *, tags: list[str] | None = None,
                  seq_ids: set[int] | None = None, phase: str | None = "decode",
                  max_selections: int | None = None) -> ReplaySample | None:
    """The whole sequences a replay of `trace_dir` keeps (of `tags` and `seq_ids` where given;
    rows of `phase`, all rows where none has it, as every_token_steps reads them), or None
    where every token fits `max_selections` (default MAX_REPLAY_SELECTIONS) or the set holds
    imported counts (no tokens to replay). Sequences are taken in a random order of `seed`
    while the next one fits; at least one is kept (a single sequence over the bound is
    replayed whole)."""
    bound = MAX_REPLAY_SELECTIONS if max_selections is None else max_selections
    td = open_traces(trace_dir)
    if td.kind == KIND_COUNTS:
        return None
    per_token = len(td.model["moe_layers"]) * td.model["top_k"]
    summary = _summarize(td, _decode_or_all(td, phase, tags, seq_ids), tags, seq_ids)
    total = int(summary.count.sum())
    if total * per_token <= bound:
        return None
    order = np.random.default_rng(seed).permutation(len(summary.ids))
    within = np.cumsum(summary.count[order]) * per_token <= bound
    keep = order[:max(1, int(np.argmin(within)) if not within.all() else len(order))]
    return ReplaySample(frozenset(summary.ids[keep].tolist()), int(summary.count[keep].sum()),
                        total, len(summary.ids), seed, bound)
