"""Count matrices (MoE layers x experts) from anywhere, and the count-profile writer.

A count matrix `[L, E]` (`.npy`, or `.csv` with an optional header row) holds, in row i, how
often each expert of the i-th MoE layer was selected. It is stored as `counts.parquet`
(see `traces.storing.schema`) so that `load_profile(DIR)` returns a per_token=False Profile.
It has no fingerprint: `traces.storing.dataset.check_shape` guards its use with a model.
"""

from __future__ import annotations

import csv
import io
import math
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from traces.errors import TraceError, first_line
from traces.formats.jsontext import decode_utf8
from traces.importers.common import ImportRequest, check_empty, sources_sha256
from traces.importers.npfiles import load_npy
from traces.storing.schema import COUNTS_FILE, KIND_COUNTS, MAX_SELECTIONS, check_tag, counts_schema


def read_count_matrix(path: Path, want: tuple[int, int] | None = None) -> np.ndarray:
    """[L, E] int64 from a `.npy` or `.csv` file of non-negative integer counts; `want`: the
    model's (MoE layers, experts), checked against a `.npy` header before its data is read."""
    path = Path(path)
    if not path.is_file():
        raise TraceError(f"count matrix not found: {path}")
    suffix = path.suffix.lower()
    if suffix == ".npy":
        raw = load_npy(path, lambda headers: _check_shape(path, headers["expert_ids"].shape,
                                                          want))
    elif suffix == ".csv":
        raw = _read_csv(path)
    else:
        raise TraceError(f"{path}: unknown count format {suffix!r} (use .npy or .csv)")
    _check_shape(path, raw.shape, want)
    return check_counts(raw, str(path))


def _check_shape(path: Path, shape: tuple[int, ...], want: tuple[int, int] | None) -> None:
    if len(shape) != 2 or 0 in shape:
        raise TraceError(f"{path}: expected a 2-D (MoE layers x experts) matrix, got shape "
                         f"{tuple(shape)}")
    if want is not None and tuple(shape) != want:
        raise TraceError(f"{path}: {shape[0]} MoE layers x {shape[1]} experts, expected the "
                         f"model's {want[0]} x {want[1]}")


def check_counts(counts: np.ndarray, where: str) -> np.ndarray:
    """`counts` [L, E] as int64, or a TraceError naming what is wrong: not finite
    non-negative whole numbers, or a layer whose selections sum past MAX_SELECTIONS (an int64
    sum of such counts wraps around to nonsense, and frequencies are float64)."""
    if not np.issubdtype(counts.dtype, np.integer) and not np.issubdtype(counts.dtype,
                                                                          np.floating):
        raise TraceError(f"{where}: counts of dtype {counts.dtype}, expected numbers")
    values = counts.astype(np.float64)
    if not np.isfinite(values).all() or (values < 0).any() or (values != np.round(values)).any():
        raise TraceError(f"{where}: counts must be finite non-negative integers")
    most = float(values.sum(axis=1).max(initial=0.0))
    if most > MAX_SELECTIONS:
        raise TraceError(f"{where}: a MoE layer counts {most:.3g} selections, more than 2**53 "
                         "(no traffic selects that often: a count that wrapped around?)")
    return counts.astype(np.int64)


def _read_csv(path: Path) -> np.ndarray:
    text = decode_utf8(path.read_bytes(), str(path))  # a count matrix: a few KB
    try:
        rows = [r for r in csv.reader(io.StringIO(text, newline=""))
                if any(cell.strip() for cell in r)]
    except csv.Error as exc:
        raise TraceError(f"{path}: not a CSV file ({first_line(exc)})") from None
    if rows and not _numeric(rows[0]):
        rows = rows[1:]
    if not rows or len({len(r) for r in rows}) != 1:
        raise TraceError(f"{path}: expected rows of equal length (one per MoE layer)")
    for number, row in enumerate(rows, 1):
        if not _numeric(row):
            raise TraceError(f"{path}: data row {number} is not numeric")
    return np.array([[float(c) for c in r] for r in rows])


def _numeric(row: list[str]) -> bool:
    try:
        [float(c) for c in row]
    except ValueError:
        return False
    return True


def write_counts(counts: np.ndarray, out_dir: Path, *, top_k: int, tag: str,
                 tokens: int | None = None, sources: list[Path],
                 decoder_layers: list[int] | tuple[int, ...] | None = None,
                 extra: dict | None = None) -> Path:
    """Store `counts` [MoE layers, experts] (non-negative int) as `out_dir/counts.parquet`.

    `sources`: the files they came from (named and hashed in the metadata); `decoder_layers`:
    the decoder layer index of each row, where the source or the model says it (recorded as
    `decoder_layers`, so that profiles and `traces stats` name layers as a collected trace
    does); `extra`: more metadata (e.g. what the counts cover). A matrix without any
    selection, or a layer row without any, is refused: frequencies would be 0/0 there."""
    names = ", ".join(str(s) for s in sources)
    counts = check_counts(np.asarray(counts), names)
    num_layers, num_experts = counts.shape
    if decoder_layers is not None:
        decoder_layers = [int(layer) for layer in decoder_layers]
        if len(decoder_layers) != num_layers or decoder_layers != sorted(set(decoder_layers)):
            raise TraceError(f"decoder layers {decoder_layers} do not name the {num_layers} "
                             "count rows in increasing order")
        extra = {**(extra or {}), "decoder_layers": decoder_layers}
    if not counts.any():
        raise TraceError(f"{names}: every count is zero (expected selections to import)")
    empty = np.flatnonzero(counts.sum(axis=1) == 0).tolist()
    if empty:
        raise TraceError(f"{names}: MoE layer row(s) {empty} have no selection (expected "
                         "counts in every MoE layer)")
    if not 1 <= top_k <= num_experts:
        raise TraceError(f"--top-k must be in [1, {num_experts}], got {top_k}")
    tag = check_tag(tag)
    implied = math.ceil(int(counts.sum(axis=1).max()) / top_k)
    if tokens is None:
        tokens = implied
    elif tokens < implied:
        raise TraceError(f"--tokens {tokens} is too few: a layer has "
                         f"{int(counts.sum(axis=1).max())} selections of top-k {top_k}")
    out_dir = Path(out_dir)
    check_empty(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    meta = {"kind": KIND_COUNTS, "tag": tag, "top_k": top_k, "tokens": tokens,
            "num_moe_layers": num_layers, "num_experts": num_experts,
            "source": ",".join(Path(s).name for s in sources),
            "source_sha256": sources_sha256(sources), **(extra or {})}
    schema = counts_schema(meta)
    table = pa.Table.from_arrays([pa.array(np.arange(num_layers, dtype=np.int16)),
                                  pa.array(list(counts), type=pa.list_(pa.int64()))],
                                 schema=schema)
    final = out_dir / COUNTS_FILE
    tmp = final.with_name(final.name + ".tmp")
    try:
        pq.write_table(table, tmp)
        os.replace(tmp, final)
    except OSError as exc:
        raise TraceError(f"cannot write {tmp}: {exc.strerror or exc}") from None
    finally:
        tmp.unlink(missing_ok=True)
    return final


def import_matrix(paths: list[Path], out_dir: Path, request: ImportRequest) -> Path:
    """`placer traces import --format counts`: one count matrix, checked against the model's
    (MoE layers x experts) when one is given."""
    if len(paths) != 1:
        raise TraceError(f"give one count matrix ({len(paths)} files given)")
    path = Path(paths[0])
    top_k = resolve_top_k(request, path)
    identity = request.identity
    counts = read_count_matrix(path, None if identity is None
                               else (len(identity.moe_layers), identity.experts_per_layer))
    return write_counts(counts, out_dir, top_k=top_k,
                        tag=request.tag if request.tag is not None else path.stem,
                        tokens=request.tokens, sources=[path],
                        decoder_layers=None if request.identity is None
                        else request.identity.moe_layers)


def resolve_top_k(request: ImportRequest, path: Path, found: int | None = None) -> int:
    """The top-k of a count import: the model's, else --top-k, else `found` in the file;
    values that disagree are refused."""
    given = [(name, value) for name, value in (
        ("the model's", request.identity.top_k if request.identity else None),
        ("--top-k", request.top_k), (f"{path}'s", found)) if value is not None]
    if not given:
        raise TraceError(f"{path}: --top-k (or --model or --config) is needed to import counts")
    for name, value in given[1:]:
        if value != given[0][1]:
            raise TraceError(f"top-k {value} ({name}) differs from {given[0][0]} "
                             f"{given[0][1]}")
    return given[0][1]
