"""The plain per-token form anyone can write from an engine hook: `.npz` or `.npy`.

- `.npz` (`np.savez`): `expert_ids` [tokens, moe_layers, k] (any integer dtype: the logical
  expert ids each token selected at each MoE layer of the model, in the model's MoE-layer
  order), optional `seq_lens` [sequences] (integers summing to `tokens`: the tokens are in
  sequence order, sequence s is the next `seq_lens[s]` of them; without it all tokens are one
  sequence) and optional `weights` [tokens, moe_layers, k] (float gate weights;
  `expert_weights` is read the same, as ../shared/data/routing/esft-deepseek-v2-lite has it).
- `.npy`: the `expert_ids` array alone (one sequence).

Every token becomes one trace row per MoE layer with phase `decode` (a teacher-forced pass
routes as decoding would) and position = its index in its sequence; token ids are not in the
form (`token` = -1). It needs the model (`--model` or `--config`): its MoE layers name the
decoder layers of the `moe_layers` axis, and its experts and k are checked.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np

from traces.errors import TraceError
from traces.importers.common import (
    UNKNOWN_TOKEN,
    ImportRequest,
    TokenRows,
    need_identity,
    write_rows,
)
from traces.importers.npfiles import Check, NpyHeader, load_arrays, npz_keys
from traces.storing.schema import PHASES, ModelIdentity

FORMAT = "tokens"
WEIGHT_KEYS = ("weights", "expert_weights")
KEYS = ("expert_ids", "seq_lens", *WEIGHT_KEYS)  # the arrays read; others are not inflated


def shapes_check(path: Path, identity: ModelIdentity) -> Check:
    """What the headers of a file's arrays must say before any is read: expert_ids [tokens,
    the model's MoE layers, its top-k], gate weights floats of the same shape."""
    want = (len(identity.moe_layers), identity.top_k)

    def check(headers: dict[str, NpyHeader]) -> None:
        if "expert_ids" not in headers:
            raise TraceError(f"{path}: no expert_ids array (found {sorted(npz_keys(path))}); "
                             "expected expert_ids [tokens, moe_layers, k]")
        experts = headers["expert_ids"]
        if len(experts.shape) != 3 or experts.shape[1:] != want:
            raise TraceError(f"{path}: expert_ids has shape {experts.shape}, expected [tokens, "
                             f"{want[0]} MoE layers, top-k {want[1]}]")
        weights = next((headers[k] for k in WEIGHT_KEYS if k in headers), None)
        if weights is not None and (weights.shape != experts.shape
                                    or weights.dtype.kind != "f"):
            raise TraceError(f"{path}: weights have shape {weights.shape} ({weights.dtype}), "
                             f"expected floats of the shape of expert_ids {experts.shape}")

    return check


def read_tokens(path: Path, request: ImportRequest) -> TokenRows:
    """One file of the plain form as trace rows (format: module docstring)."""
    identity = need_identity(request, "the tokens format")
    arrays = load_arrays(path, shapes_check(path, identity), names=KEYS.__contains__)
    experts = arrays["expert_ids"]
    n = experts.shape[0]
    seq_lens = arrays.get("seq_lens", np.array([n]))
    total = exact_sum(seq_lens)
    if total != n:
        raise TraceError(f"{path}: seq_lens must be non-negative integers [sequences] summing "
                         f"to the {n} tokens of expert_ids (got shape {seq_lens.shape}"
                         + (f", sum {total})" if total is not None else ")"))
    weights = next((arrays[k] for k in WEIGHT_KEYS if k in arrays), None)
    lens = seq_lens.astype(np.int64)
    starts = np.repeat(np.cumsum(lens) - lens, lens)
    return TokenRows(source=Path(path), seq=np.repeat(np.arange(len(lens)), lens),
                     pos=(np.arange(n) - starts).astype(np.int32),
                     token=np.full(n, UNKNOWN_TOKEN, dtype=np.int32),
                     phase=np.full(n, PHASES.index("decode"), dtype=np.int8),
                     experts=experts,
                     weights=None if weights is None else weights.astype(np.float32))


def exact_sum(lens: np.ndarray) -> int | None:
    """The sum of `lens` in exact integers (numpy's int64 sum wraps around: lengths near 2**63
    can "sum" to any token count), or None unless it is a 1-D array of non-negative
    integers."""
    if lens.ndim != 1 or not np.issubdtype(lens.dtype, np.integer) or (lens < 0).any():
        return None
    return sum(int(x) for x in lens.tolist())


def import_tokens(paths: list[Path], out_dir: Path, request: ImportRequest) -> Path:
    """Store plain per-token files as one trace file in the empty `out_dir`."""
    need_identity(request, "the tokens format")
    first = read_tokens(paths[0], request)

    def parts() -> Iterator[TokenRows]:
        yield first
        for path in paths[1:]:
            yield read_tokens(path, request)

    return write_rows(parts(), out_dir, paths, request, mode=FORMAT,
                      default_tag=Path(paths[0]).stem, weights=first.weights is not None)
