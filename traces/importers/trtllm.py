"""TensorRT-LLM (PyTorch backend) expert statistics as expert counts.

Read from NVIDIA/TensorRT-LLM commit 0fccc5b97dd7b23c438e740b3bf4dcde607266c4,
`tensorrt_llm/_torch/expert_statistic.py`: with `EXPERT_STATISTIC_ITER_RANGE=start-stop` and
`EXPERT_STATISTIC_PATH=DIR` set, each rank adds `torch.bincount(token_selected_experts,
minlength=expert_count)` per (iteration, layer) for iterations in [start, stop) and at
iteration `stop` writes `DIR/rank{r}.safetensors` (`safetensors.torch.save_file`, keys
`"{iter}_{layer}"`, int64 [expert_count]); rank 0 also writes `DIR/meta_info.json`
`{"num_experts": expert_count, "num_experts_per_token": k}`. The fused-MoE modules (e.g.
`tensorrt_llm/_torch/modules/fused_moe/fused_moe_cutlass.py`) call
`ExpertStatistic.set_layer(self.layer_idx)` (the decoder layer index) and
`maybe_add_info(self.num_slots, token_selected_slots)`.

So one directory gives, per decoder layer, the selections summed over the recorded
iterations and over every rank file in it. Limits: with the MoE load balancer on, the ids are
physical slots (`num_slots`, more than the experts), which do not fit the model's experts and
are refused when a model is given; without attention data parallelism every rank sees the
same tokens (the sum over ranks scales every count alike, which frequencies do not see).
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from traces.errors import TraceError
from traces.importers.common import ImportRequest
from traces.importers.counts import check_counts, resolve_top_k, write_counts
from traces.jsontext import loads_json

FORMAT = "trtllm"
META = "meta_info.json"
_KEY = re.compile(r"^(\d{1,12})_(\d{1,5})$")  # iteration, decoder layer


def read_meta(directory: Path) -> tuple[int, int]:
    """(num_experts, num_experts_per_token) from `meta_info.json`."""
    path = directory / META
    try:
        meta = loads_json(path.read_bytes(), str(path))
    except FileNotFoundError:
        raise TraceError(f"{directory}: no {META} (rank 0 writes it)") from None
    values = [meta.get(k) if isinstance(meta, dict) else None
              for k in ("num_experts", "num_experts_per_token")]
    if not all(isinstance(v, int) and v >= 1 for v in values):
        raise TraceError(f"{path}: expected integers num_experts and num_experts_per_token, "
                         f"got {meta}")
    return values[0], values[1]


def read_statistics(directory: Path) -> tuple[dict[int, np.ndarray], int, int, int]:
    """({decoder layer: [num_experts] int64 selections}, num_experts, k, rank files)."""
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    directory = Path(directory)
    num_experts, k = read_meta(directory)
    ranks = sorted(directory.glob("rank*.safetensors"))
    if not ranks:
        raise TraceError(f"{directory}: no rank*.safetensors files")
    layers: dict[int, np.ndarray] = {}
    covered: list[tuple[Path, list[int]]] = []
    for path in ranks:
        try:
            records = load_file(path)
        except (SafetensorError, OSError, ValueError) as exc:
            raise TraceError(f"{path}: not a readable safetensors file ({exc})") from None
        mine: set[int] = set()
        for key, counts in records.items():
            match = _KEY.match(key)
            if not match or counts.dtype != np.int64 or counts.shape != (num_experts,):
                raise TraceError(f"{path}: tensor {key!r} ({counts.dtype}, {counts.shape}), "
                                 f"expected keys '{{iter}}_{{layer}}' of int64 [{num_experts}]")
            layer = int(match[2])
            check_counts(counts[None], f"{path}: tensor {key!r}")
            layers[layer] = layers.get(layer, 0) + counts
            mine.add(layer)
        covered.append((path, sorted(mine)))
    for path, mine in covered[1:]:
        if mine != covered[0][1]:
            raise TraceError(f"{path} counts layers {mine}, {covered[0][0]} layers "
                             f"{covered[0][1]}: rank files of one run cover the same layers "
                             "(are they from different runs?)")
    if not layers:
        raise TraceError(f"{directory}: the rank files hold no statistics (was "
                         "EXPERT_STATISTIC_ITER_RANGE reached?)")
    return dict(sorted(layers.items())), num_experts, k, len(ranks)


def import_trtllm(paths: list[Path], out_dir: Path, request: ImportRequest) -> Path:
    """`placer traces import --format trtllm`: one statistics directory as a count profile."""
    if len(paths) != 1 or not Path(paths[0]).is_dir():
        raise TraceError("give one TensorRT-LLM statistics directory (EXPERT_STATISTIC_PATH)")
    directory = Path(paths[0])
    layers, num_experts, k, ranks = read_statistics(directory)
    identity = request.identity
    if identity is not None:
        if num_experts != identity.experts_per_layer:
            raise TraceError(f"{directory / META}: num_experts {num_experts}, expected the "
                             f"model's {identity.experts_per_layer} (statistics of load "
                             "balancer slots cannot be mapped to experts)")
        if tuple(layers) != tuple(identity.moe_layers):
            raise TraceError(f"{directory}: statistics of layers {list(layers)}, expected the "
                             f"model's MoE layers {list(identity.moe_layers)}")
    return write_counts(np.stack(list(layers.values())), out_dir,
                        top_k=resolve_top_k(request, directory, k),
                        tag=request.tag or FORMAT, tokens=request.tokens,
                        sources=[directory],
                        extra={"format": FORMAT, "decoder_layers": list(layers),
                               "rank_files": ranks})
