"""What every importer shares: the request, the output-directory check, the per-token writer.

A per-token source becomes `TokenRows` (one entry per token, in sequence order, MoE layers of
the model only) and `write_rows` stores them as one trace file with the model's identity, as
`placer collect` does (`traces.storing.schema`): `seq_id = run_id * 2**32 + n`, run_id from the
sha256 of the source files. A count-only source goes through `traces.importers.counts`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from traces.errors import TraceError
from traces.storing.dataset import scan
from traces.storing.schema import KIND_TOKENS, SEQ_ID_SHIFT, ModelIdentity, check_tag
from traces.storing.writer import TraceWriter

UNKNOWN_TOKEN = -1  # the `token` column where the source records no token ids


@dataclass(frozen=True)
class ImportRequest:
    """What `placer traces import` was told besides the files (see its --help)."""

    identity: ModelIdentity | None = None  # the model: layers, experts, k (None: not given)
    estimated: bool = False    # the identity comes from config.json alone (shape checks only)
    top_k: int | None = None   # --top-k, for count sources without a model
    tag: str | None = None
    tokens: int | None = None  # --tokens, for count matrices
    prompt_lens: Path | None = None  # --prompt-lens, for vLLM routed experts
    load_balancer: Path | None = None  # --load-balancer, TensorRT-LLM's static slot map
    prompt_start: int | None = None  # --prompt-start: rows start at this prompt position
    shared_experts: int | None = None  # the model's shared experts (None: no model given)


@dataclass(frozen=True)
class TokenRows:
    """Per-token routing of one source file: N tokens in sequence order."""

    source: Path
    seq: np.ndarray      # [N] int64 sequence number within the file (0, 1, ...)
    pos: np.ndarray      # [N] int position in its sequence (write_rows: must fit int32)
    token: np.ndarray    # [N] int32 token id, UNKNOWN_TOKEN where the source has none
    phase: np.ndarray    # [N] int8 index into traces.storing.schema.PHASES
    experts: np.ndarray  # [N, moe_layers, k] int logical expert ids, the model's MoE layers
    weights: np.ndarray | None  # [N, moe_layers, k] float32 gate weights, or None


def check_empty(out_dir: Path) -> None:
    """Refuse an output directory that already holds traces."""
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise TraceError(f"--out {out_dir} exists and is not a directory")
    if out_dir.exists() and scan(out_dir).kind != "empty":
        raise TraceError(f"{out_dir} already holds traces; import into an empty directory")


def sources_sha256(paths: Iterable[Path]) -> str:
    """sha256 over the bytes of every file under `paths` (directories: their files, sorted)."""
    digest = hashlib.sha256()
    for path in paths:
        path = Path(path)
        files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        for f in files:
            with f.open("rb") as fh:
                for block in iter(lambda: fh.read(1 << 20), b""):
                    digest.update(block)
    return digest.hexdigest()


def need_identity(request: ImportRequest, what: str) -> ModelIdentity:
    """The model identity of a per-token import, or a TraceError saying that `what` needs
    --model or --config (or was given a count-only option that contradicts it)."""
    identity = request.identity
    if identity is None:
        raise TraceError(f"{what} needs --model CKPT or --config config.json (it names the "
                         "decoder layers, experts and top-k the rows are checked against)")
    if request.top_k not in (None, identity.top_k):
        raise TraceError(f"--top-k {request.top_k} differs from the model's {identity.top_k}")
    if request.tokens is not None:
        raise TraceError(f"--tokens is for count matrices; {what} counts its own tokens")
    return identity


def check_experts(path: Path | str, field: str, experts: np.ndarray,
                  identity: ModelIdentity) -> None:
    """`experts` [N, moe_layers, k] must hold ids in [0, experts_per_layer) of the model, k
    distinct ones per token and layer (check_distinct)."""
    want = (len(identity.moe_layers), identity.top_k)
    if experts.ndim != 3 or experts.shape[1:] != want:
        raise TraceError(f"{path}: {field} has shape {experts.shape}, expected [tokens, "
                         f"{want[0]} MoE layers, top-k {want[1]}]")
    if not np.issubdtype(experts.dtype, np.integer):
        raise TraceError(f"{path}: {field} has dtype {experts.dtype}, expected integers")
    if experts.size and (experts.min() < 0 or experts.max() >= identity.experts_per_layer):
        raise TraceError(f"{path}: {field} holds expert ids in [{experts.min()}, "
                         f"{experts.max()}], expected [0, {identity.experts_per_layer})")
    check_distinct(f"{path}: {field}", experts)


def check_distinct(where: str, experts: np.ndarray) -> None:
    """A router selects k distinct experts: a TraceError, prefixed `where`, naming the first
    token of `experts` [N, layers, k] that selects one expert twice in a layer."""
    ordered = np.sort(experts, axis=-1)
    twice = np.argwhere(ordered[..., 1:] == ordered[..., :-1])
    if len(twice):
        token, layer, col = twice[0]
        raise TraceError(f"{where}: token {token} selects expert {ordered[token, layer, col]} "
                         f"twice in MoE layer {layer} (a router selects k distinct experts)")


MAX_TOKEN_ID = 2**31 - 1  # the trace's `token` column is int32
MAX_POSITION = 2**31 - 1  # and its `pos` column


def token_ids(value: object, where: str) -> list[int]:
    """`value` as a list of token ids (integers in 0..2**31-1, never booleans); a TraceError
    naming `where` for anything else (strings, None, nested lists, 2**40)."""
    if not isinstance(value, list) or not all(
            isinstance(t, int) and not isinstance(t, bool) and 0 <= t <= MAX_TOKEN_ID
            for t in value):
        shown = repr(value)[:60]
        raise TraceError(f"{where}: expected a list of token ids (integers in "
                         f"0..{MAX_TOKEN_ID}), got {shown}")
    return value


def write_rows(parts: Iterable[TokenRows], out_dir: Path, sources: list[Path],
               request: ImportRequest, *, mode: str, default_tag: str, weights: bool,
               extra: dict | None = None, late: Callable[[], dict] | None = None) -> Path:
    """Write every part as (token, MoE layer) rows of one trace file in the empty `out_dir`.

    `mode` names the source in the metadata (like collect's score/generate); `weights`: the
    parts carry gate weights; sequences of successive parts are numbered on; `late()`: more
    metadata, asked for once every part is written (what reading them found). Returns the
    written file."""
    identity = need_identity(request, mode)
    out_dir = Path(out_dir)
    check_empty(out_dir)
    tag = check_tag(request.tag or default_tag)
    sha = sources_sha256(sources)
    run_id = int(sha[:8], 16) & 0x7FFFFFFF
    base = run_id << SEQ_ID_SHIFT
    layers = np.asarray(identity.moe_layers, dtype=np.int16)
    k = identity.top_k
    meta = {"kind": KIND_TOKENS, **asdict(identity), "tag": tag,
            "corpus": ",".join(Path(s).name for s in sources), "corpus_sha256": sha,
            "mode": mode, "run_id": run_id, "seq_id_base": base, "weights": weights,
            "estimated": request.estimated, **(extra or {})}
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{tag}-{run_id:08x}.parquet"
    offset = rows = 0
    with TraceWriter(path, tag=tag, top_k=k, meta=meta) as writer:
        for part in parts:
            check_experts(part.source, "expert ids", part.experts, identity)
            if len(part.pos) and not 0 <= part.pos.min() <= part.pos.max() <= MAX_POSITION:
                raise TraceError(f"{part.source}: positions {part.pos.min()}.."
                                 f"{part.pos.max()} do not fit the trace's int32 pos "
                                 f"(0..{MAX_POSITION})")
            n, num_layers = len(part.seq), len(layers)
            if (part.weights is not None) != weights:
                raise TraceError(f"{part.source}: gate weights are "
                                 f"{'missing' if weights else 'present'}, unlike the other files")
            if part.weights is not None and not np.isfinite(part.weights).all():
                raise TraceError(f"{part.source}: gate weights hold NaN or infinity (expected "
                                 "the router's finite weights)")
            writer.write(seq_id=np.repeat(base + offset + part.seq, num_layers),
                         pos=np.repeat(part.pos, num_layers),
                         token=np.repeat(part.token, num_layers),
                         phase=np.repeat(part.phase, num_layers),
                         layer=np.tile(layers, n),
                         experts=part.experts.reshape(n * num_layers, k),
                         weights=None if part.weights is None
                         else part.weights.reshape(n * num_layers, k))
            offset += int(part.seq.max(initial=-1)) + 1
            rows += n
        if rows == 0:
            raise TraceError(f"{', '.join(map(str, sources))}: no token to import")
        return writer.close(None if late is None else late())
