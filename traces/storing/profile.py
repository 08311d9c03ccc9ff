"""Profiles: what the solver consumes from a trace directory.

`load_profile` aggregates per-(MoE layer, expert) selection counts, `sequence_counts`
the same per sequence (what a bootstrap over sequences resamples). Decode steps of B
concurrent tokens of distinct sequences come as the tokens in them (`TokenSteps`): every
token of a trace (`every_token_steps`, what `placer evaluate` replays) or a sample
(`sampled_token_steps`); `step_mask` turns them into the [S, L, E] selections the stage cost
model reads (`sample_steps` = the mask of a sample). `split_sequences` makes k folds of
sequence ids for calibration / held-out evaluation. Every reader streams the Parquet dataset
batch by batch (`traces.storing.dataset`), so memory is bounded by one batch plus the outputs (and
one small record per sequence, or per token when every token is replayed).
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from traces.errors import TraceError
from traces.storing.dataset import TraceDir, open_traces, stream_rows
from traces.storing.schema import KIND_COUNTS

CHUNK_CELLS = 1 << 23


@dataclass(frozen=True)
class Profile:
    """Selection counts of one trace directory (or of an imported count matrix)."""

    name: str                     # tag(s) or directory name
    moe_layers: tuple[int, ...]   # decoder layer indices (imported counts: where the source
                                  # or the model named them, else the ordinals 0..L-1)
    num_experts: int
    top_k: int
    fingerprint: str | None       # None for imported count matrices
    counts: np.ndarray            # [L, E] int64 selections per (MoE layer ordinal, expert)
    tokens: int                   # tokens counted
    sequences: int
    per_token: bool               # False for imported count matrices (frequencies only)

    def frequency(self) -> np.ndarray:
        """[L, E] float64: P(expert selected by one token) = counts / tokens."""
        return self.counts / max(self.tokens, 1)


def _layer_lut(moe_layers: tuple[int, ...]) -> np.ndarray:
    lut = np.full(max(moe_layers) + 1, -1, dtype=np.int64)
    lut[list(moe_layers)] = np.arange(len(moe_layers))
    return lut


def _name(td: TraceDir, tags: list[str] | None) -> str:
    if tags:
        return "+".join(tags)
    found = sorted({m["tag"] for m in td.metas})
    return found[0] if len(found) == 1 else td.root.name


def _decode_or_all(td: TraceDir, phase: str | None, tags: list[str] | None,
                   seq_ids: set[int] | None) -> str | None:
    """`phase` if any selected row has it, else None (use every row)."""
    if phase is None:
        return None
    for _ in stream_rows(td, ["seq_id"], phase, tags, seq_ids, first_layer_only=True):
        return phase
    return None


def load_profile(trace_dir: Path, *, phase: str | None = "decode",
                 tags: list[str] | None = None, seq_ids: set[int] | None = None) -> Profile:
    """Aggregate the rows of `phase` (None: all rows; if no row has `phase`, all rows are
    used), restricted to `tags` and `seq_ids` when given, into a Profile. Streams."""
    td = open_traces(trace_dir)
    if td.kind == KIND_COUNTS:
        return _counts_profile(td, tags, seq_ids)
    model = td.model
    layers, num_experts, k = tuple(model["moe_layers"]), model["experts_per_layer"], model["top_k"]
    lut = _layer_lut(layers)
    phase = _decode_or_all(td, phase, tags, seq_ids)
    counts = np.zeros(len(layers) * num_experts, dtype=np.int64)
    rows = np.zeros(len(layers), dtype=np.int64)
    seen: list[np.ndarray] = []
    for b in stream_rows(td, ["seq_id", "layer", "experts"], phase, tags, seq_ids):
        ordinal = lut[b["layer"]]
        counts += np.bincount((ordinal[:, None] * num_experts + b["experts"]).ravel(),
                              minlength=counts.size)
        rows += np.bincount(ordinal, minlength=len(layers))
        seen.append(np.unique(b["seq_id"][ordinal == 0]))
    if not seen:
        raise TraceError(f"no trace rows in {td.root} match tags={tags} and the given seq_ids")
    return Profile(name=_name(td, tags), moe_layers=layers, num_experts=num_experts, top_k=k,
                   fingerprint=model["fingerprint"], counts=counts.reshape(len(layers), -1),
                   tokens=int(rows.max()), sequences=len(np.unique(np.concatenate(seen))),
                   per_token=True)


def sequence_counts(trace_dir: Path, *, phase: str | None = "decode",
                    tags: list[str] | None = None, seq_ids: set[int] | None = None
                    ) -> tuple[np.ndarray, np.ndarray]:
    """Selection counts of each sequence: (ids [n] sorted sequence ids, counts [n, L, E] int32
    selections of sequence i per (MoE layer ordinal, expert)), of the rows `load_profile` (same
    arguments) aggregates, so counts.sum(axis=0) is its `counts`. Streams; memory n*L*E int32
    plus one batch (dense: a sequence of a hundred tokens at top-8 of 256 experts already
    selects most experts of every layer; 10,000 sequences of a DeepSeek-V3-shaped model are
    0.6 GB). Imported counts have no sequences: a TraceError."""
    td = open_traces(trace_dir)
    if td.kind == KIND_COUNTS:
        raise TraceError(f"{td.root} holds imported counts: no sequences to count")
    model = td.model
    layers, num_experts = tuple(model["moe_layers"]), model["experts_per_layer"]
    lut = _layer_lut(layers)
    cells = len(layers) * num_experts
    per_seq: dict[int, np.ndarray] = {}
    phase = _decode_or_all(td, phase, tags, seq_ids)
    for b in stream_rows(td, ["seq_id", "layer", "experts"], phase, tags, seq_ids):
        ids, inverse = np.unique(b["seq_id"], return_inverse=True)
        cell = (inverse * len(layers) + lut[b["layer"]])[:, None] * num_experts + b["experts"]
        block = np.bincount(cell.ravel(), minlength=len(ids) * cells).reshape(
            len(ids), cells).astype(np.int32)
        for sid, row in zip(ids.tolist(), block, strict=True):
            per_seq[sid] = per_seq[sid] + row if sid in per_seq else row.copy()
    if not per_seq:
        raise TraceError(f"no trace rows in {td.root} match tags={tags} and the given seq_ids")
    ids = np.array(sorted(per_seq), dtype=np.int64)
    counts = np.stack([per_seq[sid] for sid in ids.tolist()])
    return ids, counts.reshape(len(ids), len(layers), num_experts)


def _counts_profile(td: TraceDir, tags: list[str] | None, seq_ids: set[int] | None) -> Profile:
    meta = td.metas[0]
    if tags is not None and meta["tag"] not in tags:
        raise TraceError(f"{td.root} holds imported counts tagged {meta['tag']!r}, not {tags}")
    if seq_ids is not None:
        raise TraceError(f"{td.root} holds imported counts: no sequences to restrict to")
    table = pq.read_table(td.files[0])
    order = np.argsort(table.column("layer").to_numpy())
    counts = np.array(table.column("counts").to_pylist(), dtype=np.int64)[order]
    layers = tuple(meta.get("decoder_layers") or range(meta["num_moe_layers"]))
    if len(layers) != meta["num_moe_layers"]:
        raise TraceError(f"{td.files[0]}: decoder_layers {list(layers)} for "
                         f"{meta['num_moe_layers']} MoE layers")
    return Profile(name=meta["tag"], moe_layers=layers,
                   num_experts=meta["num_experts"], top_k=meta["top_k"], fingerprint=None,
                   counts=counts, tokens=meta["tokens"], sequences=0, per_token=False)


def split_sequences(trace_dir: Path, folds: int, seed: int = 0, *,
                    tags: list[str] | None = None) -> list[set[int]]:
    """Partition the trace's sequence ids into `folds` random sets of near-equal size."""
    td = open_traces(trace_dir)
    if td.kind == KIND_COUNTS:
        raise TraceError(f"{td.root} holds imported counts: no sequences to split")
    if folds < 2:
        raise TraceError(f"folds must be >= 2, got {folds}")
    ids = np.unique(np.concatenate(
        [b["seq_id"] for b in stream_rows(td, ["seq_id"], None, tags, None, first_layer_only=True)]
        or [np.zeros(0, np.int64)]))
    return split_ids(ids, folds, seed, str(td.root))


def split_ids(ids: np.ndarray, folds: int, seed: int, where: str) -> list[set[int]]:
    """Partition the sorted sequence ids `ids` (of `where`) into `folds` random sets of
    near-equal size."""
    if folds < 2:
        raise TraceError(f"folds must be >= 2, got {folds}")
    if len(ids) < folds:
        raise TraceError(f"{where} has {len(ids)} sequences, fewer than {folds} folds")
    perm = np.random.default_rng(seed).permutation(ids)
    return [set(perm[i::folds].tolist()) for i in range(folds)]


@dataclass(frozen=True)
class TokenSteps:
    """Decode steps as the tokens in them.

    tokens: [S, B, L, k] int16 expert ids of each step's B tokens (per MoE layer ordinal),
            -1 where a step has fewer than B tokens (or a token lacks a layer's row).
    seqs:   [S, B] int64 sequence id of each token (-1 where none: imported counts have no
            sequences, and a missing token has none).
    """

    tokens: np.ndarray
    seqs: np.ndarray

    @property
    def batch(self) -> int:
        return int(self.tokens.shape[1])

    def __len__(self) -> int:
        return int(self.tokens.shape[0])


def step_mask(tokens: np.ndarray, num_experts: int) -> np.ndarray:
    """[S, B, L, k] expert ids (-1: none) -> [S, L, E] bool: the experts at least one of each
    step's tokens selected, per MoE layer ordinal."""
    num_steps, _, num_layers, _ = tokens.shape
    step = np.arange(num_steps)[:, None, None, None]
    layer = np.arange(num_layers)[None, None, :, None]
    flat = (step * num_layers + layer) * num_experts + tokens
    out = np.zeros(num_steps * num_layers * num_experts, dtype=bool)
    out[flat[tokens >= 0]] = True
    return out.reshape(num_steps, num_layers, num_experts)


def sample_steps(source: Path | Profile, batch: int, num_steps: int, seed: int = 0, *,
                 tags: list[str] | None = None,
                 seq_ids: set[int] | None = None) -> np.ndarray:
    """[S, L, E] bool: for each of `num_steps` decode steps, the experts selected by at least
    one of `batch` concurrent tokens, per MoE layer ordinal: the step_mask of
    `sampled_token_steps` (which says how steps are drawn). Same inputs and seed -> same out."""
    steps = sampled_token_steps(source, batch, num_steps, seed, tags=tags, seq_ids=seq_ids)
    num_experts = (source.num_experts if isinstance(source, Profile)
                   else _num_experts(open_traces(source)))
    return step_mask(steps.tokens, num_experts)


def _num_experts(td: TraceDir) -> int:
    model = td.model
    return model["num_experts"] if td.kind == KIND_COUNTS else model["experts_per_layer"]


def sampled_token_steps(source: Path | Profile, batch: int, num_steps: int, seed: int = 0, *,
                        tags: list[str] | None = None,
                        seq_ids: set[int] | None = None) -> TokenSteps:
    """`num_steps` sampled decode steps of `batch` concurrent tokens each.

    From a per-token trace directory: step s takes B tokens of B *distinct* sequences (decode
    rows; all rows if there are none): sequences are drawn without replacement with
    probability proportional to their number of tokens (a long sequence is in flight longer),
    then one token uniformly within each; the tokens keep their real selections at every
    layer, so co-selection within a token is kept. The sampled (seq, pos) keys are chosen
    first from a per-sequence summary, then one streaming pass gathers them (bounded memory).
    Fewer distinct sequences than B is a TraceError.

    From imported counts (a directory or a Profile with per_token=False) there are no tokens:
    each of the B tokens independently picks `top_k` distinct experts per layer with
    probability proportional to the frequency (Gumbel top-k; -1 where fewer than k experts
    occur); `seqs` is all -1. A per-token Profile is refused: pass its trace directory so
    that real steps are sampled.
    """
    if batch < 1 or num_steps < 1:
        raise TraceError(f"batch and num_steps must be >= 1, got {batch} and {num_steps}")
    if isinstance(source, Profile):
        if source.per_token:
            raise TraceError("sampling steps needs the trace directory of a per-token profile "
                             "(steps are drawn from real tokens of distinct sequences)")
        return _frequency_steps(source, batch, num_steps, seed)
    td = open_traces(source)
    if td.kind == KIND_COUNTS:
        return _frequency_steps(_counts_profile(td, tags, seq_ids), batch, num_steps, seed)
    return _trace_steps(td, batch, num_steps, seed, tags, seq_ids)


def _frequency_steps(profile: Profile, batch: int, num_steps: int, seed: int) -> TokenSteps:
    num_layers, num_experts, k = len(profile.moe_layers), profile.num_experts, profile.top_k
    rng = np.random.default_rng(seed)
    with np.errstate(divide="ignore"):
        logits = np.log(profile.frequency())
    out = np.full((num_steps, batch, num_layers, k), -1, dtype=np.int16)
    chunk = max(1, CHUNK_CELLS // (batch * num_experts))
    for start in range(0, num_steps, chunk):
        steps = min(chunk, num_steps - start)
        for layer in range(num_layers):
            keys = logits[layer] + rng.gumbel(size=(steps * batch, num_experts))
            picks = np.argpartition(-keys, k - 1, axis=1)[:, :k]
            finite = np.isfinite(np.take_along_axis(keys, picks, axis=1))
            out[start:start + steps, :, layer, :] = np.where(finite, picks, -1).reshape(
                steps, batch, k)
    return TokenSteps(out, np.full((num_steps, batch), -1, dtype=np.int64))


@dataclass(frozen=True)
class _SeqSummary:
    """Per sequence with selected rows (sorted by id): token count, first and last position."""

    ids: np.ndarray
    count: np.ndarray
    first: np.ndarray
    last: np.ndarray


def _summarize(td: TraceDir, phase: str | None, tags: list[str] | None,
               seq_ids: set[int] | None) -> _SeqSummary:
    parts = []
    for b in stream_rows(td, ["seq_id", "pos"], phase, tags, seq_ids, first_layer_only=True):
        ids, inv = np.unique(b["seq_id"], return_inverse=True)
        first = np.full(len(ids), np.iinfo(np.int64).max)
        last = np.full(len(ids), -1, dtype=np.int64)
        np.minimum.at(first, inv, b["pos"])
        np.maximum.at(last, inv, b["pos"])
        parts.append((ids, np.bincount(inv), first, last))
    if not parts:
        raise TraceError(f"no trace rows in {td.root} match tags={tags} and the given seq_ids")
    all_ids = np.concatenate([p[0] for p in parts])
    ids, inv = np.unique(all_ids, return_inverse=True)
    count = np.bincount(inv, weights=np.concatenate([p[1] for p in parts])).astype(np.int64)
    first = np.full(len(ids), np.iinfo(np.int64).max)
    last = np.full(len(ids), -1, dtype=np.int64)
    np.minimum.at(first, inv, np.concatenate([p[2] for p in parts]))
    np.maximum.at(last, inv, np.concatenate([p[3] for p in parts]))
    return _SeqSummary(ids, count, first, last)


def _positions(td: TraceDir, phase: str | None, tags: list[str] | None,
               wanted: np.ndarray) -> dict[int, np.ndarray]:
    """Sorted positions of each sequence in `wanted` (for sequences with gaps)."""
    found: dict[int, list[np.ndarray]] = {}
    for b in stream_rows(td, ["seq_id", "pos"], phase, tags, set(wanted.tolist()),
                     first_layer_only=True):
        for sid in np.unique(b["seq_id"]):
            found.setdefault(int(sid), []).append(b["pos"][b["seq_id"] == sid])
    return {sid: np.sort(np.concatenate(p)) for sid, p in found.items()}


def _trace_steps(td: TraceDir, batch: int, num_steps: int, seed: int,
                 tags: list[str] | None, seq_ids: set[int] | None) -> TokenSteps:
    phase = _decode_or_all(td, "decode", tags, seq_ids)
    summary = _summarize(td, phase, tags, seq_ids)
    n = len(summary.ids)
    if n < batch:
        raise TraceError(f"{td.root} has only {n} sequences with {phase or 'any'} tokens; a step "
                         f"of batch {batch} needs {batch} distinct sequences")
    rng = np.random.default_rng(seed)
    log_weight = np.log(summary.count.astype(np.float64))
    chosen = np.empty((num_steps, batch), dtype=np.int64)
    chunk = max(1, CHUNK_CELLS // n)
    for start in range(0, num_steps, chunk):
        steps = min(chunk, num_steps - start)
        keys = log_weight + rng.gumbel(size=(steps, n))
        chosen[start:start + steps] = np.argpartition(-keys, batch - 1, axis=1)[:, :batch]
    rank = rng.integers(0, summary.count[chosen])
    pos = summary.first[chosen] + rank
    gappy = summary.last - summary.first + 1 != summary.count
    if gappy[chosen].any():
        lists = _positions(td, phase, tags, np.unique(summary.ids[chosen[gappy[chosen]]]))
        for s, b in zip(*np.nonzero(gappy[chosen]), strict=True):
            pos[s, b] = lists[int(summary.ids[chosen[s, b]])][rank[s, b]]
    span = int(summary.last.max()) + 1
    keys, inverse = np.unique(chosen * span + pos, return_inverse=True)
    table = _token_table(td, summary.ids, span, keys, phase, tags, seq_ids)
    return TokenSteps(table[inverse.reshape(chosen.shape)], summary.ids[chosen])


def _token_table(td: TraceDir, ids: np.ndarray, span: int, keys: np.ndarray,
                 phase: str | None, tags: list[str] | None, seq_ids: set[int] | None
                 ) -> np.ndarray:
    """[U, L, k] int16 selections of the U tokens with `keys` (sorted, distinct; a key is the
    index of the token's sequence in `ids` * span + its position), gathered in one streaming
    pass; -1 where a token has no row at a layer."""
    model = td.model
    lut = _layer_lut(tuple(model["moe_layers"]))
    out = np.full((len(keys), len(model["moe_layers"]), model["top_k"]), -1, dtype=np.int16)
    if not len(keys):
        return out
    for b in stream_rows(td, ["seq_id", "pos", "layer", "experts"], phase, tags, seq_ids):
        seq_index = np.minimum(np.searchsorted(ids, b["seq_id"]), len(ids) - 1)
        row_keys = np.where(ids[seq_index] == b["seq_id"], seq_index * span + b["pos"], -1)
        at = np.minimum(np.searchsorted(keys, row_keys), len(keys) - 1)
        hit = np.flatnonzero(keys[at] == row_keys)
        out[at[hit], lut[b["layer"][hit]]] = b["experts"][hit]
    return out


def every_token_steps(trace_dir: Path, batch: int, *, groupings: int = 4, seed: int = 0,
                      tags: list[str] | None = None, seq_ids: set[int] | None = None,
                      phase: str | None = "decode") -> TokenSteps:
    """Every token of the trace (rows of `phase`; all rows if none has it) replayed, not
    sampled.

    B = 1: each token is one step, once, in (sequence id, position) order: exact.
    B > 1: continuous batching. B slots each decode one sequence token by token and take the
    next sequence of a seeded random order when theirs ends (one in flight in another slot is
    passed over, so every step holds B distinct sequences); the order is cyclic, and stepping
    stops at the first step by which every token has been used, so every step is full and
    every token is used (the few taken a second time at the end, twice). `groupings` such
    schedules, each from its own order, are concatenated. Fewer sequences than B is a
    TraceError; so are imported counts, which have no tokens (sample them instead).

    Two streaming passes (token keys of the first MoE layer, then every row): memory is the
    [N, L, k] int16 table of the N tokens plus the output.
    """
    if batch < 1 or groupings < 1:
        raise TraceError(f"batch and groupings must be >= 1, got {batch} and {groupings}")
    td = open_traces(trace_dir)
    if td.kind == KIND_COUNTS:
        raise TraceError(f"{td.root} holds imported counts: it has no tokens to replay one by "
                         f"one (steps can only be sampled from its frequencies)")
    phase = _decode_or_all(td, phase, tags, seq_ids)
    ids, keys, span = _token_keys(td, phase, tags, seq_ids)
    table = _token_table(td, ids, span, keys, phase, tags, seq_ids)
    seq_of = ids[keys // span]
    if batch == 1:
        return TokenSteps(table[:, None], seq_of[:, None])
    if len(ids) < batch:
        raise TraceError(f"{td.root} has only {len(ids)} sequences with {phase or 'any'} "
                         f"tokens; a step of batch {batch} needs {batch} distinct sequences")
    return _batched(table, seq_of, np.bincount(keys // span, minlength=len(ids)), batch,
                    groupings, seed)


def batched_steps(single: TokenSteps, batch: int, seed: int = 0,
                  seq_ids: set[int] | None = None) -> TokenSteps:
    """every_token_steps(trace_dir, batch, groupings=1, seed=seed, seq_ids=seq_ids) from the
    trace's B = 1 steps `single` (all of its tokens, in (sequence, position) order), without
    reading the trace again: the same steps, for the folds of a cache split."""
    seqs = single.seqs[:, 0]
    keep = np.ones(len(seqs), dtype=bool) if seq_ids is None else np.isin(
        seqs, np.fromiter(seq_ids, dtype=np.int64))
    table, seq_of = single.tokens[keep, 0], seqs[keep]
    if batch == 1:
        return TokenSteps(table[:, None], seq_of[:, None])
    _, lengths = np.unique(seq_of, return_counts=True)
    if len(lengths) < batch:
        raise TraceError(f"only {len(lengths)} sequences: a step of batch {batch} needs "
                         f"{batch} distinct sequences")
    return _batched(table, seq_of, lengths, batch, 1, seed)


def _batched(table: np.ndarray, seq_of: np.ndarray, lengths: np.ndarray, batch: int,
             groupings: int, seed: int) -> TokenSteps:
    """`groupings` continuous-batching schedules of the tokens `table` [N, L, k] (sequence
    after sequence, lengths [n] tokens each; seq_of [N] their sequence ids)."""
    rng = np.random.default_rng(seed)
    index = np.concatenate([_continuous_batching(lengths, batch, rng)
                            for _ in range(groupings)])
    return TokenSteps(table[index], seq_of[index])


def _token_keys(td: TraceDir, phase: str | None, tags: list[str] | None,
                seq_ids: set[int] | None) -> tuple[np.ndarray, np.ndarray, int]:
    """(sorted distinct sequence ids, sorted distinct token keys, span) of the selected
    tokens, a token's key being (index of its sequence in ids) * span + position."""
    seqs, positions = [], []
    for b in stream_rows(td, ["seq_id", "pos"], phase, tags, seq_ids, first_layer_only=True):
        seqs.append(b["seq_id"])
        positions.append(b["pos"].astype(np.int64))
    if not seqs:
        raise TraceError(f"no trace rows in {td.root} match tags={tags} and the given seq_ids")
    seq, pos = np.concatenate(seqs), np.concatenate(positions)
    ids = np.unique(seq)
    span = int(pos.max()) + 1
    return ids, np.unique(np.searchsorted(ids, seq) * span + pos), span


def _continuous_batching(lengths: np.ndarray, batch: int, rng: np.random.Generator
                         ) -> np.ndarray:
    """[S, B] token indices (tokens numbered sequence after sequence, `lengths` [n] tokens
    each) of one continuous-batching schedule over a random cyclic order of the sequences
    (see every_token_steps)."""
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    order = deque(rng.permutation(len(lengths)).tolist())
    ends: dict[int, int] = {}  # sequence -> step its latest run ends (exclusive)
    first_taken = np.zeros(len(lengths), dtype=bool)
    horizon = 0
    free = [(0, slot) for slot in range(batch)]  # (step a slot is free from, slot)
    runs: list[tuple[int, int, int]] = []  # (slot, sequence, first step)
    while True:
        step, slot = heapq.heappop(free)
        if first_taken.all() and step >= horizon:
            break
        while ends.get(order[0], -1) > step:  # in flight in another slot
            order.rotate(-1)
        seq = order.popleft()
        order.append(seq)
        ends[seq] = step + int(lengths[seq])
        runs.append((slot, seq, step))
        if not first_taken[seq]:
            first_taken[seq] = True
            horizon = max(horizon, ends[seq])
        heapq.heappush(free, (ends[seq], slot))
    index = np.empty((horizon, batch), dtype=np.int64)
    for slot, seq, start in runs:
        stop = min(start + int(lengths[seq]), horizon)
        index[start:stop, slot] = offsets[seq] + np.arange(stop - start)
    return index
