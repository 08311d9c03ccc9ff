"""A trace directory as a dataset: finding its files, their metadata, compatibility checks.

A directory holds either per-token trace files (kind `tokens`, from `placer collect`) or one
imported count matrix (kind `counts`, `counts.parquet`); see `traces.storing.schema`. Files are
found recursively (hive partitions such as `host=a/tag=chat/` are fine); names starting with `.` or
`_` and unfinished `*.parquet.tmp` files are skipped. Only file footers are read by `scan`
(and a count matrix, which is small); `stream_rows` streams each file in turn with
`pyarrow.dataset`, and a file it cannot decode, or whose rows name experts or layers the
model does not have, is a TraceError naming that file.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from traces.errors import TraceError, first_line
from traces.storing.schema import KIND_COUNTS, KIND_TOKENS, MAX_SELECTIONS, read_meta

BATCH_ROWS = 1 << 16
READAHEAD = 2  # batches read ahead: memory stays a few batches, whatever the trace size
MODEL_KEYS = ("fingerprint", "num_layers", "moe_layers", "experts_per_layer", "top_k")


@dataclass(frozen=True)
class TraceDir:
    """The trace files under `root` and their metadata; `kind` is tokens, counts or empty."""

    root: Path
    kind: str
    files: tuple[Path, ...]
    metas: tuple[dict, ...]

    @property
    def model(self) -> dict:
        """The model identity the traces share: fingerprint, num_layers, moe_layers,
        experts_per_layer, top_k (for counts: num_moe_layers, num_experts, top_k)."""
        meta = self.metas[0]
        if self.kind == KIND_COUNTS:
            return {k: meta[k] for k in ("num_moe_layers", "num_experts", "top_k")}
        return {k: meta[k] for k in MODEL_KEYS}


def _visible(path: Path, root: Path) -> bool:
    return not any(part.startswith((".", "_")) for part in path.relative_to(root).parts)


def scan(trace_dir: Path) -> TraceDir:
    """All trace files under `trace_dir` (which must be a directory; it may be empty)."""
    root = Path(trace_dir)
    if root.exists() and not root.is_dir():
        raise TraceError(f"{root} is not a directory (a trace directory holds *.parquet files)")
    if not root.is_dir():
        raise TraceError(f"trace directory not found: {root}")
    files = tuple(sorted(p for p in root.rglob("*.parquet") if p.is_file() and _visible(p, root)))
    metas = tuple(_checked_meta(f) for f in files)
    kinds = {m.get("kind") for m in metas}
    if len(kinds) > 1:
        raise TraceError(f"{root} mixes per-token traces and imported counts; keep them apart")
    kind = kinds.pop() if kinds else "empty"
    if kind not in (KIND_TOKENS, KIND_COUNTS, "empty"):
        raise TraceError(f"{files[0]}: unknown trace kind {kind!r}")
    if kind == KIND_COUNTS and len(files) > 1:
        raise TraceError(f"{root} holds {len(files)} count matrices; one directory, one matrix")
    if kind == KIND_COUNTS:
        _check_counts(files[0], metas[0])
    if kind == KIND_TOKENS:
        first = {k: metas[0].get(k) for k in MODEL_KEYS}
        for f, m in zip(files[1:], metas[1:], strict=True):
            if {k: m.get(k) for k in MODEL_KEYS} != first:
                raise TraceError(f"{root} holds traces of different models ({files[0].name} "
                                 f"and {f.relative_to(root)})")
    return TraceDir(root, kind, files, metas)


# Metadata keys every reader uses, by kind, and their JSON types.
META_TYPES = {
    KIND_TOKENS: {"fingerprint": str, "num_layers": int, "moe_layers": list,
                  "experts_per_layer": int, "top_k": int, "tag": str},
    KIND_COUNTS: {"num_moe_layers": int, "num_experts": int, "top_k": int, "tokens": int,
                  "tag": str},
}


def _checked_meta(path: Path) -> dict:
    """The `placer` metadata of `path` with every key a reader uses of the right type."""
    try:
        meta = read_meta(path)
    except TraceError:
        raise
    except (ValueError, TypeError, AttributeError) as exc:  # JSON that is not an object
        raise TraceError(f"{path}: unreadable 'placer' metadata ({first_line(exc)})") from None
    kind = meta.get("kind")
    for key, kind_of in META_TYPES.get(kind, {}).items():
        value = meta.get(key)
        if not isinstance(value, kind_of) or isinstance(value, bool) or (
                kind_of is int and value < (0 if key == "tokens" else 1)):
            raise TraceError(f"{path}: metadata {key} is {value!r}, expected "
                             f"{'a positive integer' if kind_of is int else kind_of.__name__}")
    if kind == KIND_TOKENS and not (meta["moe_layers"] and all(
            isinstance(x, int) and not isinstance(x, bool) and x >= 0
            for x in meta["moe_layers"])):
        raise TraceError(f"{path}: metadata moe_layers is {meta['moe_layers']!r}, expected "
                         "decoder layer indices")
    return meta


def _check_counts(path: Path, meta: dict) -> None:
    """TraceError unless the count matrix at `path` decodes to the metadata's MoE layers x
    experts of non-negative counts. Read whole: it is L x E int64, small."""
    try:
        table = pq.read_table(path)
        layers = table.column("layer").to_numpy()
        counts = np.array(table.column("counts").to_pylist(), dtype=np.int64)
    except (pa.ArrowException, OSError, KeyError, ValueError, TypeError) as exc:
        raise TraceError(f"{path}: cannot read its count matrix ({first_line(exc)})") from None
    shape = (meta["num_moe_layers"], meta["num_experts"])
    if counts.shape != shape or sorted(layers.tolist()) != list(range(shape[0])):
        raise TraceError(f"{path}: count matrix of shape {list(counts.shape)}, its metadata says "
                         f"{list(shape)}")
    if (counts < 0).any():
        raise TraceError(f"{path}: negative counts")
    if counts.astype(np.float64).sum(axis=1).max(initial=0.0) > MAX_SELECTIONS:
        raise TraceError(f"{path}: a MoE layer counts more than 2**53 selections (a count "
                         "that wrapped around?)")


def open_traces(trace_dir: Path) -> TraceDir:
    """Like `scan`, but a directory without any trace is a TraceError."""
    td = scan(trace_dir)
    if td.kind == "empty":
        raise TraceError(f"no traces in {td.root} (no *.parquet files)")
    return td


def check_fingerprint(trace_dir: Path, fingerprint: str) -> None:
    """TraceError unless every per-token trace in `trace_dir` was collected from the model
    with `fingerprint` (imported counts carry none and are refused here: see check_shape)."""
    td = open_traces(trace_dir)
    if td.kind == KIND_COUNTS:
        raise TraceError(f"{td.root} holds imported counts without a model fingerprint")
    found = td.model["fingerprint"]
    if found != fingerprint:
        raise TraceError(f"traces in {td.root} were collected from another model "
                         f"(fingerprint {found[:16]}, this model {fingerprint[:16]})")


def check_shape(trace_dir: Path, num_moe_layers: int, num_experts: int) -> None:
    """TraceError unless the traces in `trace_dir` have `num_moe_layers` x `num_experts`."""
    td = open_traces(trace_dir)
    model = td.model
    if td.kind == KIND_COUNTS:
        shape = (model["num_moe_layers"], model["num_experts"])
    else:
        shape = (len(model["moe_layers"]), model["experts_per_layer"])
    if shape != (num_moe_layers, num_experts):
        raise TraceError(f"traces in {td.root} are for {shape[0]} MoE layers x {shape[1]} "
                         f"experts, the model has {num_moe_layers} x {num_experts}")


def check_compatible(trace_dir: Path, fingerprint: str, moe_layers: list[int] | tuple[int, ...],
                     num_experts: int) -> None:
    """The one check every command that reads traces makes: the fingerprint for per-token
    traces, the (MoE layers x experts) shape for imported count matrices and for per-token
    traces imported with a config.json alone (`estimated`: no checkpoint to fingerprint),
    whose MoE layers must also be the model's."""
    td = open_traces(trace_dir)
    if td.kind == KIND_COUNTS:
        check_shape(trace_dir, len(moe_layers), num_experts)
    elif td.model.get("estimated"):
        check_shape(trace_dir, len(moe_layers), num_experts)
        if list(td.model["moe_layers"]) != list(moe_layers):
            raise TraceError(f"traces in {td.root} route in decoder layers "
                             f"{list(td.model['moe_layers'])}, the model in {list(moe_layers)}")
    else:
        check_fingerprint(trace_dir, fingerprint)


def _filter(phase: str | None, tags: list[str] | None) -> ds.Expression | None:
    expr = None
    if phase is not None:
        expr = pc.field("phase") == phase
    if tags is not None:
        tag_expr = pc.field("tag").isin(list(tags))
        expr = tag_expr if expr is None else expr & tag_expr
    return expr


def stream_rows(td: TraceDir, columns: list[str], phase: str | None, tags: list[str] | None,
                seq_ids: set[int] | None, first_layer_only: bool = False) -> Iterator[dict]:
    """Stream the per-token rows of `phase` (None: all), `tags` and `seq_ids` (None: all),
    only of the first MoE layer if `first_layer_only` (one row per token), as batches
    {column: numpy array}; `experts` is [N, k] int16, dictionary columns become str arrays."""
    expr = _filter(phase, tags)
    if first_layer_only:
        first = pc.field("layer") == pa.scalar(td.model["moe_layers"][0], pa.int16())
        expr = first if expr is None else expr & first
    needed = list(dict.fromkeys([*columns, *(["seq_id"] if seq_ids is not None else [])]))
    allowed = None if seq_ids is None else np.fromiter(seq_ids, dtype=np.int64)
    k = td.model["top_k"]
    for path, batch in _batches(td, needed, expr):
        try:
            out = {name: _column(batch.column(name), k) for name in needed}
        except (pa.ArrowException, ValueError, IndexError) as exc:
            raise TraceError(f"{path}: cannot read its Parquet data ({first_line(exc)})"
                             ) from None
        _check_values(path, td, out)
        if allowed is not None:
            keep = np.isin(out["seq_id"], allowed)
            out = {name: arr[keep] for name, arr in out.items()}
        if len(out[needed[0]]):
            yield out


def _column(col: pa.Array, k: int) -> np.ndarray:
    """One column as numpy: `experts` [N, k] int16, dictionary columns as str arrays."""
    if pa.types.is_fixed_size_list(col.type):
        return col.flatten().to_numpy().reshape(-1, k)
    if pa.types.is_dictionary(col.type):
        return np.array(col.dictionary.to_pylist())[col.indices.to_numpy()]
    return col.to_numpy()


def _batches(td: TraceDir, columns: list[str], expr: ds.Expression | None
             ) -> Iterator[tuple[Path, pa.RecordBatch]]:
    """The record batches of every file of `td` in turn, with the file they came from; a
    file pyarrow cannot decode (a corrupt page, a wrong column type) is a TraceError naming
    it."""
    if td.kind != KIND_TOKENS:
        raise TraceError(f"{td.root} holds imported counts, not per-token traces")
    for path in td.files:
        try:
            batches = ds.dataset(str(path), format="parquet").to_batches(
                columns=columns, filter=expr, batch_size=BATCH_ROWS,
                batch_readahead=READAHEAD, fragment_readahead=1,
                fragment_scan_options=ds.ParquetFragmentScanOptions(pre_buffer=False))
            for batch in batches:
                yield path, batch
        except (pa.ArrowException, OSError) as exc:
            raise TraceError(f"{path}: cannot read its Parquet data ({first_line(exc)})"
                             ) from None


def _check_values(path: Path, td: TraceDir, batch: dict[str, np.ndarray]) -> None:
    """TraceError naming `path` when a row names an expert or layer the trace's model does
    not have (a corrupt page that still decodes)."""
    experts = batch.get("experts")
    if experts is not None and experts.size and (
            experts.min() < 0 or experts.max() >= td.model["experts_per_layer"]):
        raise TraceError(f"{path}: an expert id outside [0, {td.model['experts_per_layer']}) "
                         "(corrupt data?)")
    layers = batch.get("layer")
    if layers is not None and not np.isin(layers, td.model["moe_layers"]).all():
        raise TraceError(f"{path}: a layer outside the MoE layers {td.model['moe_layers']} "
                         "(corrupt data?)")
