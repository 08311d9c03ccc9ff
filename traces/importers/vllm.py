"""vLLM per-request routed experts (`--enable-return-routed-experts`) as trace rows.

Read from vllm-project/vllm: `vllm/outputs.py` (commit
003d3ee22261b7937258b7531aee00e10393f1d6): `CompletionOutput.routed_experts: np.ndarray |
None  # [seq_len, layer_num, topk]`; `vllm/model_executor/layers/fused_moe/
routed_experts_capturer.py` (commit 00bd1493b3e82d6c13c68ee8a0e1c5a96707e190): int32
buffers of shape (tokens, `hf_text_config.num_hidden_layers`, `num_experts_per_tok`), one
slot per KV-cache token, written by `capture(layer_id, topk_ids)` for MoE layers only (the
rows of a dense layer stay 0), logical expert ids as the router chose them;
`vllm/v1/core/sched/scheduler.py` (commit 00024d314514900f361ad072af6931e403b7f589)
`_get_routed_experts`: `num_tokens = request.num_tokens - 1`, so the array holds the prompt
tokens and every generated token but the last (which never ran through the model), in
position order.

Files: a directory of `.npy` files, one per request (the request is the file stem), or
`.npz` files holding one array per request (the request is the key), as
`np.save(f"{out.request_id}.npy", out.outputs[0].routed_experts)` writes them. Each request is
one sequence; positions are row indices. `--prompt-lens FILE.json` (`{request: prompt token
count}`, e.g. `len(out.prompt_token_ids)`) makes the first rows of each request `prefill` and
the rest `decode`; without it every row is `decode`. Token ids are not in the array (-1).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np

from traces.collect import ModelIdentity
from traces.errors import TraceError
from traces.importers.common import (
    UNKNOWN_TOKEN,
    ImportRequest,
    TokenRows,
    check_experts,
    need_identity,
    write_rows,
)
from traces.importers.npfiles import load_arrays
from traces.jsontext import loads_json
from traces.schema import PHASES

FORMAT = "vllm"
PREFILL, DECODE = PHASES.index("prefill"), PHASES.index("decode")


def read_prompt_lens(path: Path) -> dict[str, int]:
    """`{request name: prompt token count}` from a JSON file."""
    try:
        lens = loads_json(Path(path).read_bytes(), str(path))
    except FileNotFoundError:
        raise TraceError(f"--prompt-lens file not found: {path}") from None
    if not isinstance(lens, dict) or not all(
            isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in lens.values()):
        raise TraceError(f"{path}: expected an object {{request name: prompt tokens >= 1}}")
    return lens


def requests(path: Path) -> Iterator[tuple[str, np.ndarray]]:
    """(request name, routed experts array) of one `.npy` or `.npz` file."""
    arrays = load_arrays(path)
    if Path(path).suffix.lower() == ".npy":
        yield Path(path).stem, arrays["expert_ids"]
        return
    yield from arrays.items()


def moe_routing(routed: np.ndarray, identity: ModelIdentity, where: str,
                widths: tuple[int, ...] | None = None) -> np.ndarray:
    """[tokens, MoE layers, top_k] of a vLLM routed-experts array [tokens, num_hidden_layers,
    width] (width in `widths`, default top_k; the first top_k columns are the routed ones).
    A TraceError, prefixed `where`, for another shape, a dense layer holding a routed expert
    (vLLM never writes one: its rows stay 0) or ids check_experts refuses. One check for a
    file (request_rows) and for a server's reply (traces.server.VLLMClient)."""
    want = (identity.num_layers, identity.top_k)
    if routed.ndim != 3 or routed.shape[1] != want[0] or routed.shape[2] not in (
            widths or (want[1],)):
        raise TraceError(f"{where}: routed experts of shape {list(routed.shape)}, expected "
                         f"[tokens, {want[0]} decoder layers, top-k {want[1]}]")
    if not np.issubdtype(routed.dtype, np.integer):
        raise TraceError(f"{where}: routed experts of dtype {routed.dtype}, expected integers")
    dense = [layer for layer in range(identity.num_layers) if layer not in identity.moe_layers]
    if routed[:, dense].any():
        stray = [layer for layer in dense if routed[:, layer].any()]
        raise TraceError(f"{where}: decoder layers {stray} hold routed experts, expected "
                         f"none there (the model's MoE layers are {list(identity.moe_layers)})")
    experts = routed[:, list(identity.moe_layers), :want[1]]
    check_experts(where, "routed experts", experts, identity)
    return experts


def request_rows(path: Path, name: str, routed: np.ndarray, identity: ModelIdentity,
                 prompt_len: int | None) -> TokenRows:
    """One request's array [tokens, num_hidden_layers, k] as rows of its MoE layers."""
    where = f"{path}[{name}]" if Path(path).suffix.lower() == ".npz" else str(path)
    experts = moe_routing(routed, identity, where)
    n = len(routed)
    if prompt_len is not None and prompt_len > n:
        raise TraceError(f"{where}: prompt of {prompt_len} tokens but only {n} routed rows "
                         "(expected prompt + generated - 1 rows)")
    phase = np.where(np.arange(n) < (prompt_len or 0), PREFILL, DECODE)
    return TokenRows(source=Path(path), seq=np.zeros(n, dtype=np.int64),
                     pos=np.arange(n, dtype=np.int32),
                     token=np.full(n, UNKNOWN_TOKEN, dtype=np.int32),
                     phase=phase.astype(np.int8), experts=experts, weights=None)


def import_vllm(paths: list[Path], out_dir: Path, request: ImportRequest) -> Path:
    """`placer traces import --format vllm`: per-request routed experts as trace rows."""
    identity = need_identity(request, "the vllm format")
    prompt_lens = None if request.prompt_lens is None else read_prompt_lens(request.prompt_lens)
    seen: set[str] = set()

    def parts() -> Iterator[TokenRows]:
        for path in paths:
            for name, routed in requests(path):
                if name in seen:
                    raise TraceError(f"{path}: request {name!r} appears twice")
                seen.add(name)
                if prompt_lens is not None and name not in prompt_lens:
                    raise TraceError(f"{request.prompt_lens}: no prompt length for request "
                                     f"{name!r} ({path})")
                yield request_rows(path, name, routed, identity,
                                   None if prompt_lens is None else prompt_lens[name])

    return write_rows(parts(), out_dir, paths, request, mode=FORMAT, default_tag=FORMAT,
                      weights=False, extra={"phases": "prompt_lens" if prompt_lens else "decode"})
