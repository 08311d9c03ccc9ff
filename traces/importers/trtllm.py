"""TensorRT-LLM (PyTorch backend) expert statistics: per-token rows where the raw files are
there, counts otherwise.

Read from NVIDIA/TensorRT-LLM `tensorrt_llm/_torch/expert_statistic.py` at commit
7ce477f3c73bffd52edebf6ffbd10d530dff2e6f (older versions, e.g.
0fccc5b97dd7b23c438e740b3bf4dcde607266c4, write the count files only): with
`EXPERT_STATISTIC_ITER_RANGE=start-stop` and `EXPERT_STATISTIC_PATH=DIR`, for every MoE call of
a recorded iteration each rank adds `torch.bincount(token_selected_experts, minlength=E)` to
the record `"{iter}_{layer}"` and keeps the call's ids themselves, `[tokens, k]` int32
(every routing method returns `topk_indices.to(torch.int32)`), under the same key; at the end
of the range it writes `DIR/rank{r}.safetensors` (int64 [E] counts per key) and
`DIR/rank{r}_raw.safetensors` (the ids), and rank 0 `DIR/meta_info.json`
`{"num_experts": E, "num_experts_per_token": k}`. The layer is the decoder layer index
(`ExpertStatistic.set_layer(self.layer_idx)`); with MTP the next-n layer appears as layer
`num_hidden_layers` and is dropped here. NVIDIA's own reader
(`examples/wide_ep/ep_load_balancer/utils.py`, same commit) takes counts from
`rank*.safetensors` minus `*_raw.safetensors`, as placer does.

Per-token rows: the raw ids are assigned, not appended, per key, so where one layer's MoE runs
more than once in an iteration (`moe_config.max_num_tokens` chunking, MTP) they keep only the
last call while the counts keep every call. With the model given (`--model` / `--config`),
each (iteration, rank) batch of the raw files becomes one sequence (no request ids,
positions or phases are recorded: positions are row indices, every row `decode`, token ids
-1); a batch whose MoE layers hold different numbers of rows is skipped. The import says how
many of the counted selections the rows cover. Without the model, or without raw files, the
counts summed over iterations and rank files are stored.

Slots: the fused-MoE modules call `maybe_add_info(self.num_slots, token_selected_slots)`, so
with the MoE load balancer on the ids are physical slots and `num_experts` in meta_info.json
is `num_slots`. More slots than the model's experts cannot be experts and are refused unless
`--load-balancer FILE.yaml` gives the static balancer the engine ran with (`num_slots`,
`initial_global_assignments: {layer: [expert of each slot]}`, `layer_updates_per_iter: 0`;
`MoeLoadBalancerConfig` in `tensorrt_llm/llmapi/llm_args.py`), which maps every slot to its
expert. With as many slots as experts nothing in the directory tells slots from experts: the
import says the ids may be slots. Without attention data parallelism every rank sees the same
tokens (the sum over ranks scales every count alike, which frequencies do not see).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from traces.errors import TraceError, first_line
from traces.formats.bounded import read_bounded
from traces.formats.jsontext import MAX_DEPTH, decode_utf8, depth, loads_json
from traces.importers.common import UNKNOWN_TOKEN, ImportRequest, TokenRows, write_rows
from traces.importers.counts import check_counts, resolve_top_k, write_counts
from traces.storing.schema import PHASES, ModelIdentity

FORMAT = "trtllm"
META = "meta_info.json"
_KEY = re.compile(r"^(\d{1,12})_(\d{1,5})$")  # iteration, decoder layer
_RAW = re.compile(r"^rank(\d+)_raw\.safetensors$")
MAY_BE_SLOTS = ("if the MoE load balancer was on, these ids are its slots, not experts "
                "(TensorRT-LLM records token_selected_slots, and num_slots == num_experts "
                "looks alike): give --load-balancer FILE.yaml to map them")

Batch = dict[int, np.ndarray]  # decoder layer -> [tokens, k] ids of one (iteration, rank)


def read_meta(directory: Path) -> tuple[int, int]:
    """(num_experts, num_experts_per_token) from `meta_info.json` (num_experts counts slots
    when the load balancer was on)."""
    path = directory / META
    try:
        meta = loads_json(read_bounded(path, "meta"), str(path))
    except FileNotFoundError:
        raise TraceError(f"{directory}: no {META} (rank 0 writes it)") from None
    values = [meta.get(k) if isinstance(meta, dict) else None
              for k in ("num_experts", "num_experts_per_token")]
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in values):
        raise TraceError(f"{path}: expected integers num_experts and num_experts_per_token, "
                         f"got {meta} (null: rank 0 recorded nothing)")
    return values[0], values[1]


def count_files(directory: Path) -> list[Path]:
    """The count files: `rank*.safetensors` without the `*_raw.safetensors` ids."""
    return sorted(p for p in Path(directory).glob("rank*.safetensors")
                  if not p.name.endswith("_raw.safetensors"))


def raw_files(directory: Path) -> dict[int, Path]:
    """{rank: its `rank<r>_raw.safetensors`}."""
    return {int(m[1]): p for p in sorted(Path(directory).glob("rank*_raw.safetensors"))
            if (m := _RAW.match(p.name))}


def _load(path: Path) -> dict[str, np.ndarray]:
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    try:
        return load_file(path)
    except (SafetensorError, OSError, ValueError) as exc:
        raise TraceError(f"{path}: not a readable safetensors file ({first_line(exc)})"
                         ) from None


def _key(path: Path, key: str) -> tuple[int, int]:
    match = _KEY.match(key)
    if not match:
        raise TraceError(f"{path}: tensor {key!r}, expected keys '{{iter}}_{{layer}}'")
    return int(match[1]), int(match[2])


def read_statistics(directory: Path) -> tuple[dict[int, np.ndarray], int, int, int]:
    """({decoder layer: [num_experts] int64 selections}, num_experts, k, count files)."""
    directory = Path(directory)
    num_ids, k = read_meta(directory)
    ranks = count_files(directory)
    if not ranks:
        raise TraceError(f"{directory}: no rank<r>.safetensors count files")
    layers: dict[int, np.ndarray] = {}
    covered: list[tuple[Path, list[int]]] = []
    for path in ranks:
        mine: set[int] = set()
        for key, counts in _load(path).items():
            _, layer = _key(path, key)
            if counts.dtype != np.int64 or counts.shape != (num_ids,):
                raise TraceError(f"{path}: tensor {key!r} ({counts.dtype}, {counts.shape}), "
                                 f"expected int64 [{num_ids}]")
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
    return dict(sorted(layers.items())), num_ids, k, len(ranks)


def read_raw(directory: Path, num_ids: int, k: int) -> dict[tuple[int, int], Batch]:
    """{(iteration, rank): {decoder layer: [tokens, k] int32 ids}} of the raw files."""
    batches: dict[tuple[int, int], Batch] = {}
    for rank, path in raw_files(directory).items():
        for key, ids in _load(path).items():
            iteration, layer = _key(path, key)
            if ids.dtype != np.int32 or ids.ndim != 2 or ids.shape[1] != k:
                raise TraceError(f"{path}: tensor {key!r} ({ids.dtype}, {ids.shape}), "
                                 f"expected int32 [tokens, {k}]")
            if ids.size and (ids.min() < 0 or ids.max() >= num_ids):
                raise TraceError(f"{path}: tensor {key!r} holds ids in [{ids.min()}, "
                                 f"{ids.max()}], expected [0, {num_ids})")
            batches.setdefault((iteration, rank), {})[layer] = ids
    return dict(sorted(batches.items()))


def read_load_balancer(path: Path, num_slots: int) -> dict[int, np.ndarray]:
    """{decoder layer: [num_slots] expert of each slot} of a static `moe_config.load_balancer`
    YAML (or an extra_llm_api_options YAML holding it inline)."""
    import yaml

    try:
        raw = read_bounded(path, "load-balancer")
    except FileNotFoundError:
        raise TraceError(f"--load-balancer file not found: {path}") from None
    try:
        data = yaml.safe_load(decode_utf8(raw, str(path)))
    except TraceError:
        raise
    except (yaml.YAMLError, ValueError) as exc:  # ValueError: 5000-digit integers
        raise TraceError(f"{path}: not valid YAML ({first_line(exc)})") from None
    except RecursionError:
        raise TraceError(f"{path}: nested deeper than {MAX_DEPTH} levels") from None
    if depth(data) > MAX_DEPTH:
        raise TraceError(f"{path}: nested deeper than {MAX_DEPTH} levels")
    if isinstance(data, dict) and isinstance(data.get("moe_config"), dict):
        data = data["moe_config"].get("load_balancer")
    if not isinstance(data, dict) or not isinstance(data.get("initial_global_assignments"),
                                                    dict):
        raise TraceError(f"{path}: expected a load balancer table with num_slots and "
                         "initial_global_assignments (give the file moe_config.load_balancer "
                         "names)")
    if data.get("layer_updates_per_iter", 0) != 0:
        raise TraceError(f"{path}: layer_updates_per_iter {data['layer_updates_per_iter']}: an "
                         "online balancer moves experts between slots, so the recorded slots "
                         "cannot be mapped; only a static one (0) can")
    if data.get("num_slots") != num_slots:
        raise TraceError(f"{path}: num_slots {data.get('num_slots')!r}, but the statistics "
                         f"record {num_slots} ids (meta_info.json num_experts)")
    out = {}
    for layer, slots in data["initial_global_assignments"].items():
        if not (str(layer).isdigit() and len(str(layer)) <= 5) or not isinstance(slots, list) \
                or len(slots) != num_slots or not all(
                    isinstance(e, int) and not isinstance(e, bool) and 0 <= e < 2**15
                    for e in slots):
            raise TraceError(f"{path}: initial_global_assignments[{layer!r}] must list the "
                             f"expert id of each of the {num_slots} slots")
        out[int(layer)] = np.asarray(slots, dtype=np.int64)
    return out


def import_trtllm(paths: list[Path], out_dir: Path, request: ImportRequest) -> Path:
    """`placer traces import --format trtllm`: one statistics directory (module docstring)."""
    if len(paths) != 1 or not Path(paths[0]).is_dir():
        raise TraceError("give one TensorRT-LLM statistics directory (EXPERT_STATISTIC_PATH)")
    directory = Path(paths[0])
    counts, num_ids, k, ranks = read_statistics(directory)
    identity = request.identity
    notes, extra = [], {"format": FORMAT, "rank_files": ranks}
    mapping = None
    if request.load_balancer is not None:
        mapping = read_load_balancer(request.load_balancer, num_ids)
        extra["ids"] = "slots mapped to experts by " + Path(request.load_balancer).name
    num_experts = num_ids if mapping is None else 1 + int(max(m.max() for m in mapping.values()))
    if identity is not None:
        if mapping is None and num_ids != identity.experts_per_layer:
            raise TraceError(f"{directory / META}: num_experts {num_ids}, the model has "
                             f"{identity.experts_per_layer} experts: these are load balancer "
                             "slots; give --load-balancer FILE.yaml (the static "
                             "moe_config.load_balancer it ran with) to map them")
        num_experts = identity.experts_per_layer
        counts = _model_layers(counts, identity, directory, notes)
    if mapping is not None:
        _check_mapping(mapping, num_experts, request.load_balancer)
    if mapping is None and num_ids == num_experts:
        notes.append(MAY_BE_SLOTS)
        extra["ids"] = "experts, or slots of a load balancer"
    if mapping is not None:
        counts = {layer: np.bincount(_slots(mapping, layer, request.load_balancer),
                                     weights=c, minlength=num_experts).astype(np.int64)
                  for layer, c in counts.items()}
    raw = read_raw(directory, num_ids, k)
    top_k = resolve_top_k(request, directory, k)
    if raw and identity is not None:
        return _write_raw(raw, counts, mapping, directory, out_dir, request, notes, extra)
    if raw:
        notes.append("rank<r>_raw files hold per-token rows: give --model or --config to "
                     "import them as rows")
    return write_counts(np.stack(list(counts.values())), out_dir, top_k=top_k,
                        tag=request.tag or FORMAT, tokens=request.tokens, sources=[directory],
                        decoder_layers=list(counts),
                        extra={**extra, "note": "; ".join(notes) or None})


def _model_layers(counts: dict[int, np.ndarray], identity: ModelIdentity, directory: Path,
                  notes: list[str]) -> dict[int, np.ndarray]:
    """The counts of the model's MoE layers; MTP layers (>= num_hidden_layers) dropped."""
    mtp = [layer for layer in counts if layer >= identity.num_layers]
    if mtp:
        notes.append(f"layers {mtp} (>= num_hidden_layers {identity.num_layers}: MTP) dropped")
    kept = {layer: c for layer, c in counts.items() if layer < identity.num_layers}
    if tuple(kept) != tuple(identity.moe_layers):
        raise TraceError(f"{directory}: statistics of layers {list(kept)}, expected the "
                         f"model's MoE layers {list(identity.moe_layers)}")
    return kept


def _check_mapping(mapping: dict[int, np.ndarray], num_experts: int, path: Path) -> None:
    """Every layer's slots hold every expert, and only experts (the engine asserts it)."""
    for layer, slots in mapping.items():
        if set(slots.tolist()) != set(range(num_experts)):
            raise TraceError(f"{path}: initial_global_assignments[{layer}] does not hold each "
                             f"of the {num_experts} experts (TensorRT-LLM requires every "
                             "expert in a slot, and no other id)")


def _slots(mapping: dict[int, np.ndarray], layer: int, path: Path | None) -> np.ndarray:
    if layer not in mapping:
        raise TraceError(f"{path}: initial_global_assignments has no layer {layer}")
    return mapping[layer]


def _write_raw(raw: dict[tuple[int, int], Batch], counts: dict[int, np.ndarray],
               mapping: dict[int, np.ndarray] | None, directory: Path, out_dir: Path,
               request: ImportRequest, notes: list[str], extra: dict) -> Path:
    """Each (iteration, rank) batch with rows at every MoE layer as one sequence."""
    layers = list(counts)
    usable = {key: b for key, b in raw.items()
              if all(layer in b for layer in layers)
              and len({len(b[layer]) for layer in layers}) == 1}
    skipped = len(raw) - len(usable)
    covered = sum(len(b[layers[0]]) for b in usable.values()) * request.identity.top_k
    counted = int(max(c.sum() for c in counts.values()))
    notes.append(f"per-token rows of {len(usable)} (iteration, rank) batches cover {covered} "
                 f"of the {counted} selections counted per layer (TensorRT-LLM keeps only a "
                 "layer's last MoE call of an iteration)"
                 + (f"; {skipped} batches without equal rows at every MoE layer skipped"
                    if skipped else ""))

    def parts() -> Iterator[TokenRows]:
        for batch in usable.values():
            ids = np.stack([batch[layer] if mapping is None
                            else _slots(mapping, layer, request.load_balancer)[batch[layer]]
                            for layer in layers], axis=1)
            n = len(ids)
            yield TokenRows(source=directory, seq=np.zeros(n, dtype=np.int64),
                            pos=np.arange(n, dtype=np.int32),
                            token=np.full(n, UNKNOWN_TOKEN, dtype=np.int32),
                            phase=np.full(n, PHASES.index("decode"), dtype=np.int8),
                            experts=ids, weights=None)

    extra = {**extra, "raw_batches": len(usable), "skipped_batches": skipped,
             "raw_selections": covered, "counted_selections": counted,
             "note": "; ".join(notes)}
    return write_rows(parts(), out_dir, [directory], request, mode=FORMAT,
                      default_tag=FORMAT, weights=False, extra=extra)
