"""Splitting a per-token trace dataset in two (`placer traces split`): calibration and held-out
traffic from one collection, by sequence (a seeded random share of the sequences) or by tag.

Each output is a trace dataset in its own right: every source file that keeps rows is
rewritten at the same relative path (hive partitions kept) with the same schema and
`placer` metadata (fingerprint, layers, tag, corpus), row group by row group, so memory stays
bounded. A sequence's rows all go to one side. Both outputs are written under hidden
temporary directories beside them and renamed into place only when both are complete; on
any failure or interrupt they are removed, with every parent folder made for them, so a split
leaves both outputs or neither and nothing else; the outputs may not nest.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from traces.errors import TraceError
from traces.options import check_rules
from traces.storing.dataset import open_traces, stream_rows
from traces.storing.schema import KIND_COUNTS, SEQ_ID_SHIFT


@dataclass(frozen=True)
class SplitResult:
    """What went where: sequences, tokens (rows of the first MoE layer) and files per side."""

    sequences: tuple[int, int]
    tokens: tuple[int, int]
    files: tuple[int, int]
    by: str  # "sequence" or "tag"


def split_traces(trace_dir: Path, out_a: Path, out_b: Path, *, fraction: float = 0.5,
                 seed: int = 0, tags: list[str] | None = None) -> SplitResult:
    """Split `trace_dir` into `out_a` and `out_b` (see module docstring): with `tags`, the
    rows of those tags go to A and the rest to B; else a seeded random `fraction` of the
    sequences (at least one on each side) goes to A, the rest to B."""
    check_rules({"fraction": fraction, "seed": seed}, "split")
    td = open_traces(trace_dir)
    if td.kind == KIND_COUNTS:
        raise TraceError(f"{td.root} holds imported counts: they have no sequences to split")
    for out in (out_a, out_b):
        if os.path.lexists(out):
            raise TraceError(f"{out} already exists: split writes two new trace directories")
    check_outputs_apart(Path(out_a), Path(out_b))
    ids, tokens, tag_of = _sequences(td)
    if tags:
        unknown = sorted(set(tags) - set(tag_of.values()))
        if unknown:
            raise TraceError(f"{td.root} has no tag {unknown[0]!r} (tags: "
                             f"{', '.join(sorted(set(tag_of.values())))})")
        in_a = np.array([tag_of[int(s)] in tags for s in ids])
        by = "tag"
    else:
        if len(ids) < 2:
            raise TraceError(f"{td.root} has {len(ids)} sequence: nothing to split")
        take = min(max(round(fraction * len(ids)), 1), len(ids) - 1)
        in_a = np.zeros(len(ids), dtype=bool)
        order = run_free_order(ids, tag_of)
        in_a[order[np.random.default_rng(seed).permutation(len(ids))[:take]]] = True
        by = "sequence"
    if in_a.all() or not in_a.any():
        raise TraceError(f"the tags {tags} hold {'every' if in_a.all() else 'no'} sequence of "
                         f"{td.root}: one side would be empty")
    files = [0, 0]
    with _committed([Path(out_a), Path(out_b)]) as temps:
        for path in td.files:
            rel = path.relative_to(td.root)
            for side, keep in enumerate((ids[in_a], ids[~in_a])):
                files[side] += _copy_rows(path, temps[side] / rel, keep)
    return SplitResult((int(in_a.sum()), int((~in_a).sum())),
                       (int(tokens[in_a].sum()), int(tokens[~in_a].sum())), tuple(files), by)


def run_free_order(ids: np.ndarray, tag_of: dict[int, str]) -> np.ndarray:
    """The positions of `ids` ordered by tag, then by each sequence's number within its run
    (its id less the run's base, traces.storing.schema SEQ_ID_SHIFT): what the seeded
    permutation draws from does not depend on the run ids, so the same corpora, options and
    seed split the same way whatever ids their runs were given."""
    local = ids & ((1 << SEQ_ID_SHIFT) - 1)
    _, tag_rank = np.unique([tag_of[int(s)] for s in ids.tolist()], return_inverse=True)
    return np.lexsort((ids, local, tag_rank))


def _sequences(td) -> tuple[np.ndarray, np.ndarray, dict[int, str]]:
    """(sorted sequence ids, tokens of each, the tag of each) from the first MoE layer's
    rows; a sequence under two tags is a TraceError (it could not go to one side)."""
    counts: dict[int, int] = {}
    tag_of: dict[int, str] = {}
    for b in stream_rows(td, ["seq_id", "tag"], None, None, None, first_layer_only=True):
        seq, first = np.unique(b["seq_id"], return_index=True)
        for s, n in zip(seq.tolist(), np.bincount(np.searchsorted(seq, b["seq_id"])).tolist(),
                        strict=True):
            counts[s] = counts.get(s, 0) + n
        for s, i in zip(seq.tolist(), first.tolist(), strict=True):
            if tag_of.setdefault(s, str(b["tag"][i])) != str(b["tag"][i]):
                raise TraceError(f"{td.root}: sequence {s} is under tags {tag_of[s]!r} and "
                                 f"{b['tag'][i]!r}")
    ids = np.array(sorted(counts), dtype=np.int64)
    return ids, np.array([counts[s] for s in ids.tolist()], dtype=np.int64), tag_of


def _copy_rows(source: Path, target: Path, seq_ids: np.ndarray) -> int:
    """The rows of `source` whose sequence is in `seq_ids`, streamed into `target` with the
    source's schema and metadata; 1 if it wrote a file, 0 where no row was kept."""
    keep = pa.array(seq_ids, pa.int64())
    reader = pq.ParquetFile(source)
    writer = None
    try:
        for batch in reader.iter_batches():
            kept = batch.filter(pc.is_in(batch.column("seq_id"), value_set=keep))
            if kept.num_rows == 0:
                continue
            if writer is None:
                target.parent.mkdir(parents=True, exist_ok=True)
                writer = pq.ParquetWriter(target, reader.schema_arrow, compression="zstd")
            writer.write_batch(kept)
    except (pa.ArrowException, OSError) as exc:
        raise TraceError(f"cannot split {source} into {target}: {exc}") from None
    finally:
        if writer is not None:
            writer.close()
    return int(writer is not None)


def check_outputs_apart(out_a: Path, out_b: Path) -> None:
    """A TraceError when the two outputs are one directory or one lies inside the other (a
    reader of the outer one would read the inner one's files as its own)."""
    a, b = os.path.realpath(out_a), os.path.realpath(out_b)
    if a == b:
        raise TraceError("--out-a and --out-b are the same directory")
    for inner, outer, names in ((b, a, ("--out-b", out_b, "--out-a", out_a)),
                                (a, b, ("--out-a", out_a, "--out-b", out_b))):
        if inner.startswith(outer.rstrip("/") + "/"):
            raise TraceError(f"{names[0]} {names[1]} is inside {names[2]} {names[3]}: two "
                             "trace directories cannot nest; give two apart")


@contextlib.contextmanager
def _committed(outs: list[Path]) -> Iterator[list[Path]]:
    """Hidden temporary directories beside `outs`, renamed onto them when the body ends
    without error; removed, with whatever was in them, an output already renamed and every
    parent folder made for them, when anything raises or is interrupted."""
    temps = [out.parent / f".{out.name}.split-{secrets.token_hex(4)}.tmp" for out in outs]
    made = list(dict.fromkeys(p for out in outs for p in out.parents if not os.path.lexists(p)))
    made.sort(key=lambda p: len(p.parts), reverse=True)  # innermost first
    done: list[Path] = []
    try:
        for temp in temps:
            temp.mkdir(parents=True)
        yield temps
        for temp, out in zip(temps, outs, strict=True):
            temp.rename(out)
            done.append(out)
    except OSError as exc:
        _remove(temps + done, made)
        raise TraceError(f"cannot write the split: {exc.strerror or exc}") from None
    except BaseException:
        _remove(temps + done, made)
        raise


def _remove(paths: list[Path], made: list[Path]) -> None:
    for path in paths:
        shutil.rmtree(path, ignore_errors=True)
    for path in made:
        with contextlib.suppress(OSError):
            path.rmdir()
