"""vLLM per-request routed experts (`--enable-return-routed-experts`) as trace rows.

Read from vLLM 0.33.0 (PyPI wheel): `CompletionOutput.routed_experts` / the OpenAI replies'
`choices[i].routed_experts` (`entrypoints/openai/completion/protocol.py`,
`chat_completion/protocol.py`, base64 of `np.save`) hold an array (rows, num_hidden_layers,
num_experts_per_tok), uint8 when the experts fit (<= 256), else uint16
(`model_executor/layers/fused_moe/routed_experts_capturer.py`); dense layers' rows stay 0;
logical expert ids. The request parameter `routed_experts_prompt_start` S (default 0, in
[0, prompt], not echoed in the reply) skips the first S prompt tokens: the scheduler's
connector (`distributed/aux_output_connector/connector.py`) returns positions [S, prompt +
completion - 1), so prompt + completion - 1 - S rows, row i being position S + i.

Files: a directory of `.npy` files, one per request (the request is the file stem), or
`.npz` files holding one array per request (the request is the key), as
`np.save(f"{out.request_id}.npy", out.outputs[0].routed_experts)` writes them. Each request is
one sequence. `--prompt-lens FILE.json` gives per request its prompt token count
(`len(out.prompt_token_ids)`), or an object `{"prompt": P, "completion": C, "start": S}`
(completion and start optional); prompt rows are `prefill`, the rest `decode` (without it
every row is `decode`). The start: the object's `start`, else `--prompt-start S`, else, where
prompt and completion are both known, derived as P + C - 1 - rows (which must lie in [0, P]),
else 0. Token ids are not in the array (-1).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from traces.errors import TraceError
from traces.formats.bounded import read_bounded
from traces.formats.jsontext import loads_json
from traces.importers.common import (
    UNKNOWN_TOKEN,
    ImportRequest,
    TokenRows,
    check_experts,
    need_identity,
    write_rows,
)
from traces.importers.npfiles import NpyHeader, load_arrays
from traces.storing.schema import PHASES, ModelIdentity

FORMAT = "vllm"
PREFILL, DECODE = PHASES.index("prefill"), PHASES.index("decode")


@dataclass(frozen=True)
class Lens:
    """What --prompt-lens says of one request (None: not given)."""

    prompt: int | None = None
    completion: int | None = None
    start: int | None = None


def read_prompt_lens(path: Path) -> dict[str, Lens]:
    """`{request name: Lens}` from a JSON file (module docstring)."""
    try:
        lens = loads_json(read_bounded(path, "prompt-lens"), str(path))
    except FileNotFoundError:
        raise TraceError(f"--prompt-lens file not found: {path}") from None
    if not isinstance(lens, dict):
        raise TraceError(f"{path}: expected an object {{request name: prompt tokens >= 1}}")
    return {name: _lens(path, name, value) for name, value in lens.items()}


def _lens(path: Path, name: str, value: object) -> Lens:
    def count(v: object, low: int) -> bool:
        return v is None or (isinstance(v, int) and not isinstance(v, bool) and v >= low)

    if isinstance(value, dict) and not set(value) - {"prompt", "completion", "start"} \
            and value.get("prompt") is not None and count(value["prompt"], 1) \
            and count(value.get("completion"), 0) and count(value.get("start"), 0):
        return Lens(value["prompt"], value.get("completion"), value.get("start"))
    if count(value, 1) and value is not None:
        return Lens(value)
    raise TraceError(f"{path}: request {name!r}: expected prompt tokens >= 1 or an object "
                     '{"prompt": P, "completion": C, "start": S} (completion, start optional)')


def prompt_start(where: str, rows: int, lens: Lens, given: int | None) -> int:
    """The position of a request's first row (module docstring); a TraceError where the rows
    do not fit what is known."""
    start = lens.start if lens.start is not None else given
    prompt, completion = lens.prompt, lens.completion
    if start is not None and prompt is not None and start > prompt:
        raise TraceError(f"{where}: prompt start {start} is past the prompt's {prompt} tokens")
    if prompt is not None and completion is not None:
        ran = prompt + completion - 1
        if start is None:
            start = ran - rows
            if not 0 <= start <= prompt:
                raise TraceError(f"{where}: {rows} routed rows do not fit prompt {prompt} + "
                                 f"completion {completion} - 1 less a start within the prompt")
        elif rows != ran - start:
            raise TraceError(f"{where}: {rows} routed rows, expected prompt {prompt} + "
                             f"completion {completion} - 1 - start {start} = {ran - start}")
    start = start or 0
    if prompt is not None and prompt - start > rows:
        raise TraceError(f"{where}: prompt of {prompt} tokens but only {rows} routed rows "
                         f"from position {start} (expected prompt + generated - 1 - start "
                         "rows)")
    return start


def requests(path: Path, identity: ModelIdentity) -> Iterator[tuple[str, np.ndarray]]:
    """(request name, routed experts array) of one `.npy` or `.npz` file, every array's
    shape checked from its header before any is read."""
    def check(headers: dict[str, NpyHeader]) -> None:
        for name, header in headers.items():
            where = f"{path}[{name}]" if Path(path).suffix.lower() == ".npz" else str(path)
            shape_check(header.shape, identity, where)

    arrays = load_arrays(path, check)
    if Path(path).suffix.lower() == ".npy":
        yield Path(path).stem, arrays["expert_ids"]
        return
    yield from arrays.items()


def shape_check(shape: tuple[int, ...], identity: ModelIdentity, where: str,
                widths: tuple[int, ...] | None = None) -> None:
    """A TraceError, prefixed `where`, unless `shape` is [tokens, num_hidden_layers, width],
    width in `widths` (default: top_k)."""
    want = (identity.num_layers, identity.top_k)
    if len(shape) != 3 or shape[1] != want[0] or shape[2] not in (widths or (want[1],)):
        raise TraceError(f"{where}: routed experts of shape {list(shape)}, expected "
                         f"[tokens, {want[0]} decoder layers, top-k {want[1]}]")


def moe_routing(routed: np.ndarray, identity: ModelIdentity, where: str,
                widths: tuple[int, ...] | None = None) -> np.ndarray:
    """[tokens, MoE layers, top_k] of a vLLM routed-experts array [tokens, num_hidden_layers,
    width] (width in `widths`, default top_k; the first top_k columns are the routed ones).
    A TraceError, prefixed `where`, for another shape, a dense layer holding a routed expert
    (vLLM never writes one: its rows stay 0) or ids check_experts refuses. One check for a
    file (request_rows) and for a server's reply (traces.collecting.server.VLLMClient)."""
    shape_check(routed.shape, identity, where, widths)
    if not np.issubdtype(routed.dtype, np.integer):
        raise TraceError(f"{where}: routed experts of dtype {routed.dtype}, expected integers")
    dense = [layer for layer in range(identity.num_layers) if layer not in identity.moe_layers]
    if routed[:, dense].any():
        stray = [layer for layer in dense if routed[:, layer].any()]
        raise TraceError(f"{where}: decoder layers {stray} hold routed experts, expected "
                         f"none there (the model's MoE layers are {list(identity.moe_layers)})")
    experts = routed[:, list(identity.moe_layers), :identity.top_k]
    check_experts(where, "routed experts", experts, identity)
    return experts


def request_rows(path: Path, name: str, routed: np.ndarray, identity: ModelIdentity,
                 lens: Lens | None, given_start: int | None) -> TokenRows:
    """One request's array [rows, num_hidden_layers, k] as rows of its MoE layers."""
    where = f"{path}[{name}]" if Path(path).suffix.lower() == ".npz" else str(path)
    experts = moe_routing(routed, identity, where)
    n = len(routed)
    start = prompt_start(where, n, lens or Lens(), given_start)
    pos = start + np.arange(n)
    phase = np.where(pos < ((lens.prompt if lens else None) or 0), PREFILL, DECODE)
    return TokenRows(source=Path(path), seq=np.zeros(n, dtype=np.int64),
                     pos=pos, token=np.full(n, UNKNOWN_TOKEN, dtype=np.int32),
                     phase=phase.astype(np.int8), experts=experts, weights=None)


def import_vllm(paths: list[Path], out_dir: Path, request: ImportRequest) -> Path:
    """`placer traces import --format vllm`: per-request routed experts as trace rows."""
    identity = need_identity(request, "the vllm format")
    prompt_lens = None if request.prompt_lens is None else read_prompt_lens(request.prompt_lens)
    seen: set[str] = set()
    mid_prompt = [0]

    def parts() -> Iterator[TokenRows]:
        for path in paths:
            for name, routed in requests(path, identity):
                if name in seen:
                    raise TraceError(f"{path}: request {name!r} appears twice")
                seen.add(name)
                if prompt_lens is not None and name not in prompt_lens:
                    raise TraceError(f"{request.prompt_lens}: no prompt length for request "
                                     f"{name!r} ({path})")
                rows = request_rows(path, name, routed, identity,
                                    None if prompt_lens is None else prompt_lens[name],
                                    request.prompt_start)
                mid_prompt[0] += int(rows.pos[0]) > 0 if len(rows.pos) else 0
                yield rows

    def late() -> dict:
        return {"mid_prompt": mid_prompt[0], "note": None if not mid_prompt[0] else (
            f"{mid_prompt[0]} of {len(seen)} requests start mid-prompt "
            "(routed_experts_prompt_start): their positions start there")}

    return write_rows(parts(), out_dir, paths, request, mode=FORMAT, default_tag=FORMAT,
                      weights=False, extra={"phases": "prompt_lens" if prompt_lens else "decode",
                                            "prompt_start": request.prompt_start}, late=late)
