"""llama.cpp `llama-imatrix` output (GGUF) as expert counts.

Read from ggml-org/llama.cpp commit 006e7ef9913f4ed2dc7ebc00890f4e287b6cfcea,
`tools/imatrix/imatrix.cpp`: `IMatrixCollector::save_imatrix` writes a GGUF with
`general.type = "imatrix"` (string), `imatrix.datasets` (array of strings),
`imatrix.chunk_count` and `imatrix.chunk_size` (uint32), and per weight NAME the F32 tensors
`NAME.in_sum2` (ne [cols, n_mat]), `NAME.counts` (ne [1, n_mat]) and `NAME.in_sum`.
`collect_imatrix` takes every GGML_OP_MUL_MAT_ID (the expert matmuls) and adds 1 to
`counts[e]` for every (token, slot) whose router picked expert e: for an expert tensor
`blk.L.ffn_{gate,up,down,gate_up}_exps.weight` (n_mat = n_expert) the counts are the
selections of each expert at block L, which is decoder layer L. The four tensors of a layer
see the same ids; the first present of gate, gate_up, up, down is read.

Limits: llama-imatrix only runs prompt processing (perplexity-style chunks of
`imatrix.chunk_size` tokens), so these counts are prefill routing, never decode; counts are
stored as F32 (exact up to 2**24 selections per expert). An imatrix merged from an old file
whose expert tensor has a single count carries no per-expert counts and is refused.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from traces.errors import TraceError
from traces.importers.common import ImportRequest
from traces.importers.counts import resolve_top_k, write_counts

FORMAT = "imatrix"
EXPERT_TENSORS = ("ffn_gate_exps", "ffn_gate_up_exps", "ffn_up_exps", "ffn_down_exps")
_COUNTS = re.compile(r"^blk\.(\d+)\.(" + "|".join(EXPERT_TENSORS) + r")\.weight\.counts$")
NOTE = "llama-imatrix counts come from prompt processing only (prefill), never decode"


def read_imatrix(path: Path) -> tuple[dict[int, np.ndarray], dict]:
    """({decoder layer: [n_expert] int64 selections}, {chunk_count, chunk_size, datasets})."""
    from gguf import GGUFReader  # here: only an imatrix import pays for it

    path = Path(path)
    try:
        reader = GGUFReader(path)
    except (ValueError, OSError, IndexError) as exc:
        raise TraceError(f"{path}: not a readable GGUF file ({exc})") from None
    fields = {name: field.contents() for name, field in reader.fields.items()}
    if fields.get("general.type") != "imatrix":
        raise TraceError(f"{path}: general.type is {fields.get('general.type')!r}, expected "
                         "'imatrix' (a llama-imatrix GGUF output)")
    found: dict[int, dict[str, np.ndarray]] = {}
    for tensor in reader.tensors:
        match = _COUNTS.match(tensor.name)
        if match:
            if int(tensor.shape[0]) != 1:
                raise TraceError(f"{path}: {tensor.name} has ggml ne {list(tensor.shape)}, "
                                 "expected [1, n_expert]")
            found.setdefault(int(match[1]), {})[match[2]] = np.asarray(tensor.data)
    if not found:
        raise TraceError(f"{path}: no blk.L.ffn_*_exps.weight.counts tensor (expected the "
                         "expert tensors of a MoE model)")
    layers = {}
    for layer, tensors in sorted(found.items()):
        name = next(t for t in EXPERT_TENSORS if t in tensors)
        counts = tensors[name].ravel()
        if counts.size < 2 or not np.all(np.isfinite(counts)) or np.any(counts < 0) \
                or np.any(counts != np.round(counts)):
            raise TraceError(f"{path}: blk.{layer}.{name}.weight.counts holds "
                             f"{counts.size} values, expected non-negative whole counts, one "
                             "per expert")
        layers[layer] = counts.astype(np.int64)
    info = {key.split(".")[1]: fields.get(key) for key in
            ("imatrix.chunk_count", "imatrix.chunk_size", "imatrix.datasets")}
    return layers, info


def import_imatrix(paths: list[Path], out_dir: Path, request: ImportRequest) -> Path:
    """`placer traces import --format imatrix`: one imatrix GGUF as a count profile."""
    if len(paths) != 1:
        raise TraceError(f"give one imatrix GGUF ({len(paths)} files given)")
    path = Path(paths[0])
    layers, info = read_imatrix(path)
    widths = {len(c) for c in layers.values()}
    if len(widths) > 1:
        raise TraceError(f"{path}: expert counts of different lengths {sorted(widths)}")
    identity = request.identity
    if identity is not None:
        if tuple(layers) != tuple(identity.moe_layers):
            raise TraceError(f"{path}: expert counts at blocks {list(layers)}, expected the "
                             f"model's MoE layers {list(identity.moe_layers)}")
        if widths != {identity.experts_per_layer}:
            raise TraceError(f"{path}: {widths.pop()} experts per layer, expected the "
                             f"model's {identity.experts_per_layer}")
    return write_counts(np.stack(list(layers.values())), out_dir,
                        top_k=resolve_top_k(request, path), tag=request.tag or path.stem,
                        tokens=request.tokens, sources=[path],
                        extra={"format": FORMAT, "phases": "prefill", "note": NOTE,
                               "decoder_layers": list(layers), **info})
