"""SGLang routing: expert-distribution recorder dumps (`sglang`).

SGLang (`--expert-distribution-recorder-mode stat|stat_approx|per_pass|per_token`, then
`POST /start_expert_distribution_record`, traffic, `POST /dump_expert_distribution_record`)
writes the record with `torch.save` under `$SGLANG_EXPERT_DISTRIBUTION_RECORDER_DIR` (default
`/tmp`). The format below is read from sglang 0.5.23 (PyPI wheel),
`python/sglang/srt/eplb/expert_distribution.py` (`_StatAccumulator.dump`,
`_DetailAccumulator.dump`, `_DetailSinglePassGatherer.collect`); the same keys are in
sgl-project/sglang commit dd780ab9de484cf1198ff538a1b8b0da6464ab5a of that file.

- `stat`, `stat_approx`: one file `expert_distribution_recorder_{time}.pt` (rank 0 only), a dict
  `rank` (int), `logical_count` (int32 tensor [passes, num_layers, num_logical_experts]: a
  circular buffer of `--expert-distribution-recorder-buffer-size` forward passes, default 1000,
  unused slots zero, already summed over ranks by all_reduce),
  `average_utilization_rate_over_window` (float or None).
- `per_pass`, `per_token`: one file per rank `expert_distribution_recorder_{time}_{rank}.pt`, a
  dict `records` (list, one dict per forward pass) and `last_physical_to_logical_map` (int
  tensor [num_layers, num_physical_experts]). A record has `forward_pass_id`, `rank`,
  `gatherer_key` and `global_physical_count` (int32 [num_layers, num_physical_experts]);
  `per_token` records add `input_ids`, `positions` (lists, one per token of the pass),
  `extend_seq_lens` (list per sequence, or None for decode), `forward_mode` (int value of
  `ForwardMode`: EXTEND=1, DECODE=2, MIXED=3, IDLE=4, ...) and `topk_ids_of_layer` (int32
  [num_layers, num_tokens, 8]: the top-k *physical* expert ids, -1 where none; 8 columns
  whatever the model's k).

Mapping to placer: `num_layers` is every decoder layer (`get_model_config_for_expert_location`
returns `config.num_hidden_layers`, e.g. python/sglang/srt/models/deepseek_v2.py), so dense
layers (DeepSeek's `first_k_dense_replace`, Qwen's `mlp_only_layers`) are rows without a
selection. Physical ids are mapped to logical experts with `last_physical_to_logical_map`
("last": if EPLB rebalanced during recording, earlier passes used another map). SGLang does
not record request ids, so a sequence here is one `extend_seq_lens` segment of one prefill
pass, and every decode token is its own sequence. Phase: DECODE passes, and one-token
segments of MIXED passes, are `decode`; every other pass is `prefill`. Gate weights are not
recorded. Without DP attention every rank records the same tokens: import one rank's file
(stat counts are then multiplied by the number of ranks, which frequencies do not see).

Saved /generate responses with routed experts (`sglang-http`) are read by
`traces.importers.sglang_http`.
"""

from __future__ import annotations

import pickle
import warnings
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from traces.errors import TraceError, first_line
from traces.importers.common import (
    ImportRequest,
    TokenRows,
    check_empty,
    token_ids,
    write_rows,
)
from traces.importers.counts import check_counts, resolve_top_k, write_counts
from traces.importers.npfiles import check_inflation
from traces.storing.schema import PHASES, ModelIdentity

STAT, PER_PASS, PER_TOKEN = "stat", "per_pass", "per_token"
MAX_COUNT = 2**15 - 1  # layers, experts per layer: int16 in traces/storing/schema.py
DECODE_MODE, MIXED_MODE = 2, 3  # sglang ForwardMode.DECODE / .MIXED (IntEnum, auto() from 1)
DEFAULT_TAG = "sglang"


@dataclass(frozen=True)
class SGLangTokens:
    """Per-token detail of a `per_token` dump: N tokens in recording order."""

    seq: np.ndarray      # [N] int64 sequence number within the dump (see module docstring)
    pos: np.ndarray      # [N] int32 position in its sequence
    token: np.ndarray    # [N] int32 token id
    phase: np.ndarray    # [N] int8 index into traces.storing.schema.PHASES
    experts: np.ndarray  # [N, num_layers, 8] int16 logical expert ids, -1 where none


@dataclass(frozen=True)
class SGLangDump:
    """One recorder file: logical counts over every decoder layer, per-token detail if any."""

    path: Path
    mode: str                    # stat (also stat_approx), per_pass or per_token
    counts: np.ndarray           # [num_layers, num_logical_experts] int64, passes summed
    tokens: SGLangTokens | None  # per_token only

    @property
    def num_layers(self) -> int:
        return self.counts.shape[0]

    @property
    def num_experts(self) -> int:
        return self.counts.shape[1]


def check_torch_zip(path: Path) -> None:
    """A TraceError unless `path` is a zip archive, as torch.save writes (a plain pickle or
    torch's legacy format is not read), whose members inflate within check_inflation's bound
    (torch.save stores them uncompressed): torch allocates each member's claimed size."""
    try:
        with zipfile.ZipFile(path) as zf:
            for info in zf.infolist():
                check_inflation(info, f"{path}[{info.filename}]")
    except zipfile.BadZipFile:
        with path.open("rb") as fp:
            what = "a plain pickle" if fp.read(1) == b"\x80" else "not a zip archive"
        raise TraceError(f"{path}: not a readable torch.save file ({what}; torch.save, which "
                         "writes SGLang's dumps, writes a zip archive)") from None


def read_sglang_dump(path: Path) -> SGLangDump:
    """Read one SGLang expert-distribution recorder `.pt` file (format: module docstring)."""
    path = Path(path)
    if not path.is_file():
        raise TraceError(f"SGLang dump not found: {path}")
    import torch  # here, not at the top: torch takes seconds to import, every CLI run would pay

    check_torch_zip(path)
    try:
        with warnings.catch_warnings():  # torch warns on stderr of pickle protocols it meets
            warnings.simplefilter("ignore")
            data = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:  # torch's own text runs to many lines: ours instead
        raise TraceError(f"{path}: its pickle builds objects other than tensors and plain "
                         "containers, which torch.load(weights_only=True) refuses (an SGLang "
                         "dump holds only those)") from None
    except Exception as exc:  # torch raises zip and runtime errors alike
        raise TraceError(f"{path}: not a readable torch.save file ({type(exc).__name__}: "
                         f"{first_line(exc)})") from None
    if not isinstance(data, dict):
        raise TraceError(f"{path}: expected a dict, got {type(data).__name__}")
    if "logical_count" in data:
        counts = _int_array(data["logical_count"], path, "logical_count")
        if counts.ndim not in (2, 3):
            raise TraceError(f"{path}: logical_count must be [passes, layers, experts]")
        passes = counts.reshape(-1, *counts.shape[-2:])
        check_counts(passes.astype(np.float64).sum(axis=0), f"{path}: logical_count")
        counts = passes.sum(axis=0)
        return SGLangDump(path, STAT, counts, None)
    if "records" in data and "last_physical_to_logical_map" in data:
        return _read_records(path, data["records"],
                             _int_array(data["last_physical_to_logical_map"], path,
                                        "last_physical_to_logical_map"))
    raise TraceError(f"{path}: not an SGLang expert distribution dump (keys {sorted(data)})")


def _int_array(value: object, path: Path, key: str) -> np.ndarray:
    try:
        array = value.numpy()  # type: ignore[attr-defined]
    except AttributeError:
        raise TraceError(f"{path}: {key} is not a tensor") from None
    if not np.issubdtype(array.dtype, np.integer) or (array.size and array.min() < -1):
        raise TraceError(f"{path}: {key} must hold integer counts or ids")
    return array.astype(np.int64)


def _read_records(path: Path, records: object, p2l: np.ndarray) -> SGLangDump:
    if p2l.ndim != 2 or p2l.size == 0 or p2l.min() < 0:
        raise TraceError(f"{path}: last_physical_to_logical_map must be [layers, physical]")
    if not isinstance(records, list) or not all(isinstance(r, dict) for r in records):
        raise TraceError(f"{path}: records must be a list of dicts, one per forward pass")
    num_layers, num_physical = p2l.shape
    num_experts = int(p2l.max()) + 1
    if num_layers > MAX_COUNT or num_experts > MAX_COUNT:
        raise TraceError(f"{path}: last_physical_to_logical_map names {num_layers} layers and "
                         f"expert ids up to {num_experts - 1}; at most {MAX_COUNT} of each")
    rows = np.arange(num_layers)[:, None]
    counts = np.zeros((num_layers, num_experts), dtype=np.int64)
    detail = bool(records) and all("topk_ids_of_layer" in r for r in records)
    parts: list[tuple[np.ndarray, ...]] = []
    next_seq = 0
    for number, record in enumerate(records):
        if not detail:
            physical = _int_array(record.get("global_physical_count"), path,
                                  f"records[{number}].global_physical_count")
            if physical.shape != p2l.shape:
                raise TraceError(f"{path}: records[{number}] counts have shape "
                                 f"{physical.shape}, the map {p2l.shape}")
            np.add.at(counts, (np.broadcast_to(rows, p2l.shape), p2l), physical)
            continue
        where = f"{path}: records[{number}]"
        missing = sorted({"input_ids", "positions", "forward_mode"} - record.keys())
        if missing:
            raise TraceError(f"{where} has no {', '.join(missing)} (a per_token record has "
                             "input_ids, positions, forward_mode and topk_ids_of_layer)")
        ids = _int_array(record["topk_ids_of_layer"], path, f"records[{number}].topk_ids")
        input_ids = token_ids(record["input_ids"], f"{where}.input_ids")
        positions = token_ids(record["positions"], f"{where}.positions")
        n = len(input_ids)
        if ids.ndim != 3 or ids.shape[:2] != (num_layers, n) or len(positions) != n:
            raise TraceError(f"{path}: records[{number}] has topk ids {ids.shape} for {n} "
                             f"tokens of {num_layers} layers")
        if ids.max(initial=-1) >= num_physical:
            raise TraceError(f"{path}: records[{number}] selects physical expert "
                             f"{ids.max()} of {num_physical} (shared-experts fusion on? "
                             "record with --disable-shared-experts-fusion)")
        logical = np.where(ids >= 0, p2l[rows[:, :, None], np.maximum(ids, 0)], -1)
        seq, phase = _segments(record, n, path, number)
        parts.append((seq + next_seq, np.asarray(positions, np.int32),
                      np.asarray(input_ids, np.int32), phase,
                      logical.transpose(1, 0, 2).astype(np.int16)))
        next_seq += int(seq.max(initial=-1)) + 1
        valid = logical >= 0
        np.add.at(counts, (np.broadcast_to(rows[:, :, None], logical.shape)[valid],
                           logical[valid]), 1)
    tokens = None
    if detail:
        cols = [np.concatenate(c) for c in zip(*parts, strict=True)]
        tokens = SGLangTokens(*cols)
    return SGLangDump(path, PER_TOKEN if detail else PER_PASS, counts, tokens)


def _segments(record: dict, n: int, path: Path, number: int) -> tuple[np.ndarray, np.ndarray]:
    """([n] sequence number within the pass, [n] phase index) of one per-token record."""
    mode = record["forward_mode"]
    if not isinstance(mode, int) or isinstance(mode, bool):
        raise TraceError(f"{path}: records[{number}].forward_mode is {mode!r}, expected "
                         "SGLang's ForwardMode number")
    lens = record.get("extend_seq_lens")
    if mode == DECODE_MODE or lens is None:
        lens = [1] * n
    lens = np.asarray(token_ids(lens, f"{path}: records[{number}].extend_seq_lens"),
                      dtype=np.int64)
    if lens.sum() != n or (lens < 0).any():
        raise TraceError(f"{path}: records[{number}] extend_seq_lens sum to {lens.sum()}, "
                         f"not its {n} tokens")
    decode = (mode == DECODE_MODE) | ((mode == MIXED_MODE) & (lens == 1))
    phase = np.where(decode, PHASES.index("decode"), PHASES.index("prefill")).astype(np.int8)
    return np.repeat(np.arange(len(lens)), lens), np.repeat(phase, lens)


def moe_rows(dump: SGLangDump, moe_layers: Sequence[int] | None = None) -> list[int]:
    """The decoder layers of `dump` that are MoE layers: `moe_layers` if given (every other
    row must be empty), else the rows with any selection."""
    selected = dump.counts.sum(axis=1) > 0
    if moe_layers is None:
        found = np.flatnonzero(selected).tolist()
        if not found:
            raise TraceError(f"{dump.path}: no expert was selected in any layer")
        return found
    layers = sorted(set(moe_layers))
    if not layers or layers[0] < 0 or layers[-1] >= dump.num_layers:
        raise TraceError(f"{dump.path}: MoE layers {layers} are not within its "
                         f"{dump.num_layers} layers")
    stray = sorted(set(np.flatnonzero(selected).tolist()) - set(layers))
    if stray:
        raise TraceError(f"{dump.path}: layers {stray} have selections but are not MoE layers "
                         f"{layers}")
    return layers


def import_dumps(paths: list[Path], out_dir: Path, request: ImportRequest) -> Path:
    """`placer traces import --format sglang`: recorder dumps (one per rank)."""
    if request.tokens is not None:
        raise TraceError("--tokens is for count matrices; SGLang dumps count their own")
    top_k = request.top_k
    if request.identity is not None:
        top_k = resolve_top_k(request, Path(paths[0]))
    return import_sglang(paths, out_dir, identity=request.identity, top_k=top_k,
                         tag=request.tag, estimated=request.estimated)


def import_sglang(paths: Sequence[Path], out_dir: Path, *, identity: ModelIdentity | None = None,
                  top_k: int | None = None, moe_layers: Sequence[int] | None = None,
                  tag: str | None = None, estimated: bool = False) -> Path:
    """Store SGLang dumps (one per rank; same mode and shape) in the empty `out_dir`.

    With per-token dumps and the model's `identity`, writes real trace rows (`tokens` kind,
    the identity's fingerprint, so the solver checks them against the checkpoint); otherwise
    the summed logical counts of the MoE layers as `counts.parquet`. MoE layers: the
    identity's, else `moe_layers`, else the rows with selections. Returns the written file."""
    if not paths:
        raise TraceError("no SGLang dump given")
    dumps = [read_sglang_dump(p) for p in paths]
    first = dumps[0]
    for d in dumps[1:]:
        if (d.mode, d.counts.shape) != (first.mode, first.counts.shape):
            raise TraceError(f"{d.path} ({d.mode}, {d.counts.shape}) does not match "
                             f"{first.path} ({first.mode}, {first.counts.shape})")
    check_empty(out_dir)
    total = SGLangDump(first.path, first.mode, sum(d.counts for d in dumps), None)
    if identity is not None:
        if moe_layers is not None and sorted(moe_layers) != sorted(identity.moe_layers):
            raise TraceError(f"MoE layers {list(moe_layers)} differ from the model's "
                             f"{list(identity.moe_layers)}")
        if total.counts.shape != (identity.num_layers, identity.experts_per_layer):
            raise TraceError(f"{first.path} has {total.num_layers} layers x "
                             f"{total.num_experts} experts, the model {identity.num_layers} x "
                             f"{identity.experts_per_layer}")
        moe_layers, top_k = identity.moe_layers, identity.top_k
    if top_k is None:
        raise TraceError("--top-k (or --model or --config) is needed to import SGLang counts "
                         "without the model")
    layers = moe_rows(total, moe_layers)
    if identity is not None and first.mode == PER_TOKEN:
        request = ImportRequest(identity=identity, estimated=estimated, tag=tag)
        return write_rows((_token_rows(d, identity) for d in dumps), out_dir, list(paths),
                          request, mode="sglang-per_token", default_tag=DEFAULT_TAG,
                          weights=False)
    tokens = (sum(int((d.tokens.experts[:, layers] >= 0).any(axis=(1, 2)).sum()) for d in dumps)
              if first.mode == PER_TOKEN else None)
    return write_counts(total.counts[layers], out_dir, top_k=top_k, tag=tag or DEFAULT_TAG,
                        tokens=tokens, sources=list(paths), decoder_layers=layers,
                        extra={"format": "sglang"})


def _token_rows(dump: SGLangDump, identity: ModelIdentity) -> TokenRows:
    """The per-token rows of one dump; tokens without any selection (padding) are skipped,
    a token selecting fewer than k experts in a MoE layer is a TraceError."""
    t, k = dump.tokens, identity.top_k
    experts = t.experts[:, list(identity.moe_layers), :]
    real = (experts >= 0).any(axis=(1, 2))
    if (experts[real, :, :k] < 0).any() or (experts[real, :, k:] >= 0).any():
        raise TraceError(f"{dump.path}: a token does not select exactly {k} experts in "
                         "every MoE layer")
    return TokenRows(source=dump.path, seq=t.seq[real], pos=t.pos[real], token=t.token[real],
                     phase=t.phase[real], experts=experts[real, :, :k], weights=None)
