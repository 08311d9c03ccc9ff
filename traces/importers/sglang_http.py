"""SGLang /generate responses with routed experts (`sglang-http`) as trace rows, and the one
decoder of their `routed_experts` (also used by `placer collect --server`,
traces/collecting/server.py).

A server started with `--enable-return-routed-experts` answers a `POST /generate` that sends
`"return_routed_experts": true` with `meta_info["routed_experts"]`: the base64 of the
little-endian int32 bytes of an array (rows, num_hidden_layers, width). Read from sglang
0.5.23 (PyPI wheel): `managers/io_struct.py` (`GenerateReqInput.routed_experts_start_len`,
"absolute start position for returned routings; response covers [routed_experts_start_len,
seqlen - 1)", in [0, prompt tokens], default 0; also on /v1/completions and
/v1/chat/completions, not echoed in the reply), `managers/scheduler_components/
batch_result_processor.py` (seqlen = len(origin_input_ids) + len(output_ids_through_stop)),
`layers/moe/routed_experts_capturer.py` / `state_capturer/base.py` (host buffer int32
(tokens, num_hidden_layers, num_experts_per_tok), rows `req_to_token[start_len:seqlen - 1]`,
captured before the logical-to-physical map: logical ids), `managers/detokenizer_manager.py`
(`pybase64.b64encode(tensor.numpy().tobytes())`). So a response holds prompt_tokens +
completion_tokens - 1 - start rows, row i being position start + i; rows of a dense layer are
0 (never captured) and are dropped by the model's MoE layers; a wider array (fused shared
experts, should a version keep them) is cut to its first top-k columns, the routed ones.

sglang-kt 0.7.2 (kvcache-ai's fork, PyPI `sglang-kt`) differs: `Req.seqlen =
len(origin_input_ids) + len(output_ids)` (`managers/schedule_batch.py`) and its capturer
returns `req_to_token[:seqlen - 1]` (no start offset). With speculative decoding the last
verify step can accept tokens past the stop, which stay in `output_ids` but not in
`completion_tokens`: the reply then has rows past prompt + completion - 1. They are the
routing of tokens the reply does not return: placer keeps the rows that belong to the
returned tokens and notes how many it dropped.

The offset: `--prompt-start N` says the requests sent `routed_experts_start_len` N (checked
against every reply's rows); without it placer derives it from each reply, start = prompt +
completion - 1 - rows (in [0, prompt]), and says how many replies started mid-prompt. More
rows than prompt + completion - 1 are the overshoot above (start 0).

The file is a JSONL of the responses as a client saved them (one object per line, or the list
a batched request returns). One response is one sequence: positions from its start, rows
before prompt_tokens are `prefill`, the rest `decode`; token ids of decode rows come from
`output_ids` (prompt ids are not in the response: -1).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from traces.errors import TraceError
from traces.formats.jsontext import jsonl_lines, loads_json
from traces.importers.common import (
    UNKNOWN_TOKEN,
    ImportRequest,
    TokenRows,
    check_distinct,
    need_identity,
    token_ids,
    write_rows,
)
from traces.storing.schema import PHASES, ModelIdentity

HTTP_FORMAT = "sglang-http"
DEFAULT_TAG = "sglang"


@dataclass(frozen=True)
class RoutedRows:
    """The routing of one reply: `experts` [rows, MoE layers, k] int32 of positions start,
    start + 1, ...; `extra`: rows past prompt + completion - 1 that were dropped."""

    experts: np.ndarray
    start: int
    extra: int


def http_responses(path: Path) -> Iterator[tuple[str, dict]]:
    """(where, response) of every response in a JSONL file: one JSON object per line, or a
    list of them (the answer to a batched /generate)."""
    for number, line in jsonl_lines(path):
        item = loads_json(line, f"{path}:{number}")
        batch = item if isinstance(item, list) else [item]
        for index, response in enumerate(batch):
            where = f"{path}:{number}" + (f"[{index}]" if isinstance(item, list) else "")
            if not isinstance(response, dict):
                raise TraceError(f"{where}: expected a /generate response object")
            yield where, response


def decode_routed_experts(encoded: str, prompt_tokens: int, completion_tokens: int,
                          identity: ModelIdentity, shared_experts: int | None = None,
                          start: int | None = 0) -> RoutedRows:
    """The routing of one /generate response: `meta_info.routed_experts` (`encoded`) of the
    model `identity` describes, as the rows of its returned tokens (module docstring).

    `start`: the routed_experts_start_len the request sent (None: derived from the rows).
    Columns: top_k, or top_k + `shared_experts` (None: not known, any width >= top_k when
    the rows are known), cut to the first top_k. Raises TraceError with a message the caller
    prefixes with where the response came from (a file's line, a server's URL)."""
    ran = _routed_rows(prompt_tokens, completion_tokens)
    if start is not None and not 0 <= start <= prompt_tokens:
        raise TraceError(f"prompt start {start} is not within the prompt's {prompt_tokens} "
                         "tokens")
    try:
        raw = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise TraceError(f"meta_info.routed_experts is not base64 ({exc})") from None
    layers, k = identity.num_layers, identity.top_k
    # Each width that divides the bytes gives a row count; the first that fits with ids of the
    # model (and zeros at its dense layers, which SGLang never writes) wins: all the rows that
    # ran, else a start within the prompt, else rows past the stop. A width misread as more
    # rows reads the fused shared experts' ids (>= E) or puts ids into dense layers.
    dense = [layer for layer in range(layers) if layer not in identity.moe_layers]
    fits = sorted((rows != ran - (start or 0), rows > ran, width, rows)
                  for width in _widths(raw, ran - (start or 0), layers, k, shared_experts)
                  if not len(raw) % (4 * layers * width)
                  and _start_of(rows := len(raw) // (4 * layers * width), ran, prompt_tokens,
                                start) is not None)
    for inexact, _, width, rows in fits:
        first = _start_of(rows, ran, prompt_tokens, start)
        keep = min(rows, ran - first)
        routed = np.frombuffer(raw, dtype="<i4").reshape(rows, layers, width)
        experts = routed[:keep, list(identity.moe_layers), :k]
        stray = [layer for layer in dense if routed[:, layer, :k].any()]
        in_range = not experts.size or (experts.min() >= 0
                                        and experts.max() < identity.experts_per_layer)
        if in_range and not stray:
            check_distinct("meta_info.routed_experts", experts)
            return RoutedRows(experts, first, rows - keep)
        if not inexact and not in_range:
            raise TraceError(f"meta_info.routed_experts holds expert ids in [{experts.min()}, "
                             f"{experts.max()}], the model has {identity.experts_per_layer} "
                             "experts per layer: is it another model's routing?")
        if not inexact:
            raise TraceError(f"meta_info.routed_experts routes in decoder layers {stray}, "
                             f"dense in this model (MoE layers {list(identity.moe_layers)}): "
                             "is it another model's routing?")
    expected = f"{ran} tokens (prompt + completion - 1)" if start == 0 else (
        f"{ran - start} tokens (prompt + completion - 1 - start {start})" if start
        else f"prompt + completion - 1 = {ran} tokens less a start within the prompt")
    wide = "more" if shared_experts is None else f"top-k + {shared_experts}"
    raise TraceError(f"meta_info.routed_experts holds {len(raw)} bytes; expected {expected}, "
                     f"each [{layers} layers, top-k {k}] int32 (or {wide} columns with fused "
                     "shared experts): is it another model's routing?")


def _widths(raw: bytes, rows: int, layers: int, k: int, shared: int | None) -> list[int]:
    """Column counts to try: top_k, top_k + shared; with shared experts not known, also the
    width `rows` rows would have."""
    widths = [k] if not shared else [k, k + shared]
    if shared is None and rows > 0 and not len(raw) % (4 * layers * rows):
        widths.append(len(raw) // (4 * layers * rows))
    return sorted({w for w in widths if w >= k})


def _start_of(rows: int, ran: int, prompt: int, start: int | None) -> int | None:
    """The first row's position for `rows` rows of a reply where `ran` tokens ran, or None
    where that count does not fit: exactly ran - start rows (more: sglang-kt's overshoot, only
    from position 0); a derived start must lie within the prompt."""
    if start is not None:
        return start if rows == ran - start or (rows > ran and start == 0) else None
    if rows > ran:
        return 0
    return ran - rows if ran - rows <= prompt and rows > 0 else None


def _routed_rows(prompt_tokens: int, completion_tokens: int) -> int:
    """prompt + completion - 1, the tokens that ran; a TraceError for counts that are not
    integers >= 0 with a sum of at least 2."""
    counts = [prompt_tokens, completion_tokens]
    if not all(isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in counts) \
            or sum(counts) < 2:
        raise TraceError("meta_info.prompt_tokens and completion_tokens must be integers with "
                         f"a sum of at least 2, got {counts}")
    return sum(counts) - 1


def http_rows(path: Path, where: str, response: dict, identity: ModelIdentity,
              shared_experts: int | None = None, start: int | None = None
              ) -> tuple[TokenRows, RoutedRows]:
    """One response as the rows of its sequence (module docstring), and how they were cut."""
    meta = response.get("meta_info")
    if not isinstance(meta, dict) or not isinstance(meta.get("routed_experts"), str):
        raise TraceError(f"{where}: no meta_info.routed_experts (send \"return_routed_experts\""
                         ": true to a server started with --enable-return-routed-experts)")
    prompt, completion = meta.get("prompt_tokens"), meta.get("completion_tokens")
    try:
        routed = decode_routed_experts(meta["routed_experts"], prompt, completion, identity,
                                       shared_experts, start)
    except TraceError as exc:
        raise TraceError(f"{where}: {exc}") from None
    n = len(routed.experts)
    pos = routed.start + np.arange(n)
    token = np.full(n, UNKNOWN_TOKEN, dtype=np.int32)
    output_ids = None  # optional: a client may have saved meta_info alone
    if "output_ids" in response:
        output_ids = token_ids(response["output_ids"], f"{where}: output_ids")
    if output_ids is not None and len(output_ids) >= completion:
        decode = pos >= prompt
        token[decode] = np.asarray(output_ids[:completion], dtype=np.int64)[pos[decode] - prompt]
    phase = np.where(pos < prompt, PHASES.index("prefill"), PHASES.index("decode"))
    return TokenRows(source=Path(path), seq=np.zeros(n, dtype=np.int64),
                     pos=pos, token=token, phase=phase.astype(np.int8),
                     experts=routed.experts, weights=None), routed


def import_http(paths: list[Path], out_dir: Path, request: ImportRequest) -> Path:
    """`placer traces import --format sglang-http`: saved /generate responses as trace rows,
    one sequence per response; the note says how many started mid-prompt or had rows past
    the returned tokens."""
    identity = need_identity(request, "the sglang-http format")
    seen = {"replies": 0, "mid_prompt": 0, "overshoot": 0, "extra_rows": 0}

    def parts() -> Iterator[TokenRows]:
        for path in paths:
            for where, response in http_responses(path):
                rows, routed = http_rows(path, where, response, identity,
                                         request.shared_experts, request.prompt_start)
                seen["replies"] += 1
                seen["mid_prompt"] += routed.start > 0
                seen["overshoot"] += routed.extra > 0
                seen["extra_rows"] += routed.extra
                yield rows

    return write_rows(parts(), out_dir, paths, request, mode=HTTP_FORMAT,
                      default_tag=DEFAULT_TAG, weights=False,
                      extra={"prompt_start": request.prompt_start},
                      late=lambda: {**seen, "note": cut_note(seen)})


def cut_note(seen: dict[str, int]) -> str | None:
    """What the import says about replies that started mid-prompt or ran past their tokens."""
    notes = []
    if seen["mid_prompt"]:
        notes.append(f"{seen['mid_prompt']} of {seen['replies']} replies start mid-prompt "
                     "(routed_experts_start_len): their positions start there")
    if seen["overshoot"]:
        notes.append(f"{seen['overshoot']} of {seen['replies']} replies had "
                     f"{seen['extra_rows']} rows past prompt + completion - 1 (speculative "
                     "decoding past the stop, sglang-kt): dropped")
    return "; ".join(notes) or None
