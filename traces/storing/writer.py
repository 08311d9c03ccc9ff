"""Writing one trace file: buffered Parquet row groups, atomic rename at the end.

Rows go to `NAME.parquet.tmp` in row groups as they come (memory stays bounded by one row
group); `close()` renames it to `NAME.parquet`. If anything fails before that, the temporary
file is deleted, so an interrupted run never leaves a file that looks complete (and readers
ignore `*.parquet.tmp` even when a killed process could not delete it).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from traces.errors import TraceError
from traces.storing.schema import (
    METADATA_KEY,
    PHASES,
    encode_meta,
    trace_schema,
)

ROW_GROUP_ROWS = 1 << 18


class TraceWriter:
    """Append (token, layer) rows to the trace file `path` (schema in `traces.storing.schema`;
    with the `spec_experts` column where `meta` has `speculative`)."""

    def __init__(self, path: Path, *, tag: str, top_k: int, meta: dict,
                 row_group_rows: int = ROW_GROUP_ROWS) -> None:
        self.path = Path(path)
        self.tmp = self.path.with_name(self.path.name + ".tmp")
        self.top_k = top_k
        self.speculative = bool(meta.get("speculative"))
        self.schema = trace_schema(top_k, meta, speculative=self.speculative)
        self.row_group_rows = row_group_rows
        self.rows = 0
        self._tag = pa.array([tag])
        self._phases = pa.array(list(PHASES))
        self._pending: list[pa.RecordBatch] = []
        self._pending_rows = 0
        with self._naming_failures():
            self._writer = pq.ParquetWriter(self.tmp, self.schema, compression="zstd")

    @contextlib.contextmanager
    def _naming_failures(self) -> Iterator[None]:
        """An OSError (a full disk, a read-only filesystem: pyarrow's name no file) as a
        TraceError naming the file being written."""
        try:
            yield
        except OSError as exc:
            raise TraceError(f"cannot write {self.tmp}: {exc.strerror or exc}") from None

    def write(self, seq_id: np.ndarray, pos: np.ndarray, token: np.ndarray,
              phase: np.ndarray, layer: np.ndarray, experts: np.ndarray,
              weights: np.ndarray | None, speculative: np.ndarray | None = None) -> None:
        """Buffer N rows: 1-D arrays of length N (`phase` = index into PHASES) and
        `experts` [N, k] int, `weights` [N, k] float32 or None, `speculative` [N, k] int
        (the spec_experts column: given exactly when the file has it)."""
        n = len(seq_id)
        if n == 0:
            return
        if (speculative is not None) != self.speculative:
            raise ValueError(f"{self.path}: spec_experts must be given exactly when the file "
                             f"has that column (it {'has' if self.speculative else 'has not'})")
        k = self.top_k
        weights_array = (pa.nulls(n, self.schema.field("weights").type) if weights is None
                         else pa.FixedSizeListArray.from_arrays(
                             pa.array(np.ascontiguousarray(weights, np.float32).ravel()), k))
        batch = pa.RecordBatch.from_arrays([
            pa.array(np.asarray(seq_id, np.int64)),
            pa.array(np.asarray(pos, np.int32)),
            pa.array(np.asarray(token, np.int32)),
            pa.DictionaryArray.from_arrays(pa.array(np.asarray(phase, np.int32)), self._phases),
            pa.array(np.asarray(layer, np.int16)),
            pa.FixedSizeListArray.from_arrays(
                pa.array(np.ascontiguousarray(experts, np.int16).ravel()), k),
            weights_array,
            pa.DictionaryArray.from_arrays(pa.array(np.zeros(n, np.int32)), self._tag),
            *([] if speculative is None else [pa.FixedSizeListArray.from_arrays(
                pa.array(np.ascontiguousarray(speculative, np.int16).ravel()), k)]),
        ], schema=self.schema)
        self._pending.append(batch)
        self._pending_rows += n
        self.rows += n
        if self._pending_rows >= self.row_group_rows:
            self._flush()

    def _flush(self) -> None:
        if self._pending:
            table = pa.Table.from_batches(self._pending, schema=self.schema)
            with self._naming_failures():
                self._writer.write_table(table, row_group_size=self.row_group_rows)
            self._pending, self._pending_rows = [], 0

    def close(self, more_meta: dict | None = None) -> Path:
        """Flush, close and rename to the final name; returns it. `more_meta`: metadata only
        known once every row is written (what an import dropped, say), merged into the
        file's: the rows are streamed once more into a file with the merged schema."""
        self._flush()
        with self._naming_failures():
            self._writer.close()
            if more_meta:
                self._rewrite_meta(more_meta)
            with open(self.tmp, "rb") as f:
                os.fsync(f.fileno())
            os.replace(self.tmp, self.path)
        return self.path

    def _rewrite_meta(self, more_meta: dict) -> None:
        meta = {**json.loads(self.schema.metadata[METADATA_KEY]), **more_meta}
        schema = self.schema.with_metadata(encode_meta(meta))
        staged = self.tmp.with_name(self.tmp.name + ".meta")
        try:
            source = pq.ParquetFile(self.tmp)
            with pq.ParquetWriter(staged, schema, compression="zstd") as writer:
                for group in range(source.num_row_groups):
                    writer.write_table(source.read_row_group(group).cast(schema))
            os.replace(staged, self.tmp)
        finally:
            staged.unlink(missing_ok=True)

    def abort(self) -> None:
        """Close and delete the temporary file (a failure to close is not the news: the
        error that made the caller abort is)."""
        try:
            with contextlib.suppress(OSError):
                self._writer.close()
        finally:
            self.tmp.unlink(missing_ok=True)

    def __enter__(self) -> TraceWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.abort()
