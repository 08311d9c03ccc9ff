"""The routing-trace format: one Parquet row per (token, MoE layer).

A trace directory is a Parquet dataset: any number of `*.parquet` files, flat or in
hive-style sub-directories (`host=a/tag=chat/...`); every reader finds them recursively and
streams them with `pyarrow.dataset` in bounded memory. Files ending in `.parquet.tmp` are
unfinished (an interrupted `placer collect`) and are never read.

Columns (one row per token and per MoE layer; padding tokens are never recorded):

| column    | type                               | meaning                                        |
|-----------|------------------------------------|------------------------------------------------|
| `seq_id`  | int64                              | sequence id, unique across the directory       |
| `pos`     | int32                              | 0-based position of the token in its sequence  |
| `token`   | int32                              | token id                                       |
| `phase`   | dictionary<int32, string>          | `prefill` or `decode`                          |
| `layer`   | int16                              | decoder layer index (not the MoE ordinal)      |
| `experts` | fixed_size_list<int16>[top_k]      | the k experts the router selected, router order|
| `weights` | fixed_size_list<float32>[top_k]    | their gate weights as passed to the experts    |
|           | (nullable)                         | (null when collected with `--no-weights`)      |
| `tag`     | dictionary<int32, string>          | corpus tag (file stem, `--tag`, or `random`)   |
| `spec_experts` | fixed_size_list<int16>[top_k] | speculative routing (version 2, only in files  |
|           |                                    | whose metadata has `speculative`): see below   |

Speculative routing (schema version 2; `placer collect` from a checkpoint records it): on
the row of MoE layer m, `spec_experts` holds the k experts that layer m's router selects when
applied to the hidden state at the *previous* MoE layer p's prefetch point, the input of p's
MoE block (the residual stream after p's attention, through p's post-attention norm: what
p's own router reads), in descending router-score order, with m's own top-k, grouping and
bias correction. That is what a prefetcher issuing copies for m while p's experts compute
would have predicted. The first MoE layer has no earlier MoE layer: its `spec_experts` are
all -1. Metadata key `speculative` names the point (`{"point": "moe_input", "depth": 1}`);
files without it (version 1, other collectors, imports) have no `spec_experts` column.

Rows are written sorted by (`seq_id`, `pos`, `layer`) within each Parquet row group.

`--mode score` runs one forward pass over each document; a token's routing there is what
decoding that text would route, so those rows have phase `decode`. `--mode generate` feeds
a prompt (phase `prefill`, every prompt token) and then greedily decodes; every generated
token that is fed back through the model is a `decode` row (so `--max-new-tokens N` gives
up to N - 1 decode rows per sequence: the last generated token is never fed). Decoding of a
sequence stops at its end-of-sequence token; tokens after it are not recorded.

File metadata: key `placer` holds a JSON object:

    {"schema_version": 2, "kind": "tokens", "placer_version": "0.1.0",
     "fingerprint": "<hex: model config + inventory>", "num_layers": 48,
     "moe_layers": [0, 1, ...], "experts_per_layer": 128, "top_k": 8,
     "tag": "chat", "corpus": "chat.jsonl", "corpus_sha256": "<hex>",
     "mode": "score" | "generate", "run_id": 123456789, "seq_id_base": 530242871224172544,
     "weights": true, "max_length": 512, "max_new_tokens": null, "seed": 0}

Sequence ids: every file (one per corpus and `placer collect` run) gets a 31-bit `run_id`,
derived from a hash of the run's identity (fingerprint, corpus sha256, tag, mode, options)
and bumped until it is unused in the directory; its sequences are numbered
`seq_id = run_id * 2**32 + n`, where n = 0, 1, ... counts the recorded (non-empty)
documents of the corpus in order. So ids never collide within a directory, and directories
collected on different hosts can be merged with negligible collision odds.

Imported count matrices (`placer traces import`) are stored as `counts.parquet`: one row per
MoE layer ordinal with columns `layer` (int16, the ordinal i: the i-th MoE layer) and
`counts` (list<int64>, one per expert), metadata `placer` =
`{"schema_version": 1, "kind": "counts", "placer_version": ..., "tag": ..., "top_k": k,
"tokens": T, "num_moe_layers": L, "num_experts": E, "source": ..., "source_sha256": ...,
"decoder_layers": [...]}`; `decoder_layers` (the decoder layer index of each ordinal) is there
when the source or the model names the layers (engine files; any import given --model or
--config), and a profile then names its layers by it, as a collected trace does. Sources
that know their phase say it (`"phases": "prefill"` for llama-imatrix).
They carry no fingerprint and no per-token rows; a directory holds one or the other.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from importlib.metadata import version

import pyarrow as pa
import pyarrow.parquet as pq

from traces.errors import TraceError, first_line
from traces.formats.jsontext import loads_json

SCHEMA_VERSION = 2
READABLE_VERSIONS = (1, 2)  # 2 added the optional `spec_experts` column; 1 lacks it
SPECULATIVE_COLUMN = "spec_experts"
NO_PREDICTION = -1  # spec_experts of the first MoE layer: nothing before it to predict from
METADATA_KEY = b"placer"
KIND_TOKENS = "tokens"
KIND_COUNTS = "counts"
PHASES = ("prefill", "decode")
PLACER_VERSION = version("placer")
SEQ_ID_SHIFT = 32
COUNTS_FILE = "counts.parquet"
MAX_SELECTIONS = 2**53  # per MoE layer of a count matrix: exact in float64, no int64 wrap

_DICT = pa.dictionary(pa.int32(), pa.string())


def trace_schema(top_k: int, meta: dict | None = None, *,
                 speculative: bool = False) -> pa.Schema:
    """The Arrow schema of a per-token trace file with `top_k` experts per row (and the
    `spec_experts` column where `speculative`)."""
    fields = [
        pa.field("seq_id", pa.int64(), nullable=False),
        pa.field("pos", pa.int32(), nullable=False),
        pa.field("token", pa.int32(), nullable=False),
        pa.field("phase", _DICT, nullable=False),
        pa.field("layer", pa.int16(), nullable=False),
        pa.field("experts", pa.list_(pa.int16(), top_k), nullable=False),
        pa.field("weights", pa.list_(pa.float32(), top_k), nullable=True),
        pa.field("tag", _DICT, nullable=False),
    ]
    if speculative:
        fields.append(pa.field(SPECULATIVE_COLUMN, pa.list_(pa.int16(), top_k), nullable=False))
    return pa.schema(fields, metadata=None if meta is None else encode_meta(meta))


def counts_schema(meta: dict) -> pa.Schema:
    """The Arrow schema of an imported count matrix (`counts.parquet`)."""
    return pa.schema([pa.field("layer", pa.int16(), nullable=False),
                      pa.field("counts", pa.list_(pa.int64()), nullable=False)],
                     metadata=encode_meta(meta))


def encode_meta(meta: dict) -> dict[bytes, bytes]:
    """File metadata `{b"placer": JSON}` with the schema and placer versions filled in."""
    full = {"schema_version": SCHEMA_VERSION, "placer_version": PLACER_VERSION, **meta}
    return {METADATA_KEY: json.dumps(full, sort_keys=True).encode()}


def read_meta(path) -> dict:
    """The `placer` metadata of one Parquet file (reads only its footer)."""
    try:
        raw = pq.read_schema(path).metadata or {}
    except (OSError, pa.ArrowInvalid) as exc:
        raise TraceError(f"{path} is not a readable Parquet file: {first_line(exc)}") from None
    if METADATA_KEY not in raw:
        raise TraceError(f"{path} is not a placer trace (no 'placer' metadata)")
    meta = loads_json(raw[METADATA_KEY], f"{path}: its placer metadata")
    if not isinstance(meta, dict):
        raise TraceError(f"{path}: its placer metadata is not a JSON object")
    if meta.get("schema_version") not in READABLE_VERSIONS:
        raise TraceError(f"{path} has trace schema version {meta.get('schema_version')}, "
                         f"this placer reads versions {', '.join(map(str, READABLE_VERSIONS))}")
    return meta


def has_speculative(meta: dict) -> bool:
    """Whether a trace file with metadata `meta` holds the `spec_experts` column."""
    return bool(meta.get("speculative"))


@dataclass(frozen=True)
class ModelIdentity:
    """What the traces record about the model (from the checkpoint inventory)."""

    fingerprint: str
    num_layers: int
    moe_layers: tuple[int, ...]
    experts_per_layer: int
    top_k: int


TAG_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
MAX_TAG = 200  # a tag names files (`<tag>-<run id>.parquet.tmp`): 255 bytes at most in all


def check_tag(tag: str) -> str:
    """`tag` if it is a safe file-name token, else a TraceError."""
    if not TAG_PATTERN.match(tag):
        raise TraceError(f"bad tag {tag[:MAX_TAG]!r}: use letters, digits, '_', '-', '.'")
    if len(tag) > MAX_TAG:
        raise TraceError(f"tag {tag[:20]}... is {len(tag)} characters long: at most {MAX_TAG} "
                         "(it names the trace file)")
    return tag
