'''A plan's resident experts as sglang-kt's GPU expert set (`placer export ktransformers`).

sglang-kt (kvcache-ai/sglang, the KTransformers fork of SGLang) keeps some experts of every
MoE layer on the GPU and runs the rest on the CPU. Read from kvcache-ai/sglang commit
04653fa88f5ce4ea83632c4ad436343db6bc8324 and kvcache-ai/ktransformers commit
95009ea6856c0799e517e93cb12be5e8494bc7ce:

- `python/sglang/srt/layers/moe/kt_ep_wrapper.py::_init_kt_gpu_experts_masks`: the engine's
  MoE layers are `i >= first_k_dense_replace and i % moe_layer_freq == 0` over
  `num_hidden_layers`, read from the HF config (text_config where present) with defaults 0
  and 1; `num_hash_layers` is subtracted from first_k_dense_replace, and a list-form
  moe_layer_freq becomes (first truthy index, 1). With `--kt-gpu-experts-ratio R` the GPU
  expert count is `int(num_moe_layers * num_experts * R)` (truncation, one global count;
  num_experts = num_local_experts, else num_experts, else n_routed_experts). With
  `--kt-expert-placement-strategy frequency` and an `--init-expert-location` path ending in
  `.pt`, it `torch.load`s it (weights_only) and takes `["logical_count"]` of a dict (or the
  tensor itself), which must be 3-D [buffer, num_hidden_layers, num_experts] (any numeric
  dtype: it is summed over dim 0 and cast to float), then calls
  `generate_gpu_experts_masks(freq, count)` and sets every non-MoE layer's row all True.
- kt-kernel `python/experts_base.py::generate_gpu_experts_masks`: count clamped to
  [0, layers * experts], then `torch.topk` over the flattened [layers * experts] frequencies,
  the top `count` are GPU experts. One global top-k: with 1 for the plan's resident experts
  and 0 elsewhere, and count = the number of ones, the top-k is exactly the ones (every 1
  beats every 0, so topk's unspecified tie order never decides).
- `python/sglang/srt/eplb/expert_location.py::compute_initial_expert_location_metadata`: a
  `.pt` dict with `logical_count` and no `physical_to_logical_map` gives the trivial expert
  mapping when `--kt-weight-path` is set (KT mode), so the file moves no expert.

So the file is `{"logical_count": t}`, t int32 [1, num_hidden_layers, num_experts], and R is
the shortest decimal at or above resident / total with `int(total * R) == resident` in
floating point (total = the engine's MoE layers x experts; the plain quotient often
truncates to one expert fewer). The mask is one set for the
whole tensor-parallel group (rank 0 builds it and broadcasts it), every rank holding a shard
of every GPU expert: a plan whose cards keep different resident sets is refused unless the
caller accepts their union; an expert resident only in part (`--page-size`) cannot be
expressed and is refused.
'''

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from placer.errors import PlacerError
from placer.files import Inputs, write_bytes_atomic
from placer.plan.placement import Plan


@dataclass(frozen=True)
class KTExport:
    """What `placer export ktransformers` writes and the flags that load it."""

    logical_count: np.ndarray  # [1, num_hidden_layers, num_experts] int32, 1 = GPU expert
    gpu_experts: int
    ratio: str                 # the --kt-gpu-experts-ratio value
    engine_moe_layers: tuple[int, ...]

    def flags(self, out: Path) -> list[str]:
        return ["--kt-expert-placement-strategy", "frequency", "--init-expert-location",
                str(out), "--kt-gpu-experts-ratio", self.ratio]


def engine_moe_layers(config: dict) -> tuple[int, ...]:
    """The decoder layers sglang-kt counts as MoE layers (its rule, module docstring); a
    PlacerError for a config the engine itself would fail on (moe_layer_freq 0 or null, a
    num_hash_layers that is not a count)."""
    num_layers = int(config["num_hidden_layers"])
    first_dense = int(config.get("first_k_dense_replace") or 0)
    freq = config.get("moe_layer_freq", 1)
    hash_layers = config.get("num_hash_layers") or 0
    if not _count(hash_layers):
        raise PlacerError(f"config.json: num_hash_layers is {hash_layers!r}, expected a "
                          "non-negative integer")
    if hash_layers > 0:
        first_dense = max(0, first_dense - hash_layers)
    if isinstance(freq, list):
        first_dense = max(first_dense, next((i for i, v in enumerate(freq) if v), 0))
        freq = 1
    if not _count(freq) or freq < 1:
        raise PlacerError(f"config.json: moe_layer_freq is {freq!r}; sglang-kt takes every "
                          "moe_layer_freq-th layer, so it must be an integer >= 1 (or a list)")
    return tuple(i for i in range(num_layers) if i >= first_dense and i % freq == 0)


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def resident_experts(plan: Plan, *, union: bool = False) -> np.ndarray:
    """[L, E] bool: the plan's wholly resident experts; a PlacerError for a partly resident
    expert, or (without `union`) for resident experts on more than one card."""
    pages = np.array([len(e.pages) for e in plan.experts]).reshape(plan.matrix("card").shape)
    resident = plan.matrix("resident_pages")
    partial = np.argwhere((resident > 0) & (resident < pages))
    if len(partial):
        ordinal, expert = partial[0]
        raise PlacerError(f"layer {plan.moe_layers[ordinal]} expert {expert} is resident in "
                          f"part ({resident[ordinal, expert]} of {pages[ordinal, expert]} "
                          "pages): sglang-kt keeps whole experts on the GPU; solve without "
                          "--page-size")
    whole = resident == pages
    cards = np.unique(plan.matrix("card")[whole])
    if len(cards) > 1 and not union:
        raise PlacerError(f"cards {cards.tolist()} keep different resident experts, but "
                          "sglang-kt keeps one GPU expert set for all its tensor-parallel "
                          "ranks; pass --union to export their union, or solve for one card")
    return whole


def gpu_experts_ratio(count: int, total: int) -> str:
    """The shortest decimal R >= count / total with int(total * float(R)) == count (the
    engine truncates, so count / total itself may give count - 1)."""
    if count == 0:
        return "0"
    if count == total:
        return "1"
    for digits in range(1, 18):
        scaled = -(-count * 10**digits // total)  # ceil(count / total) at `digits` places
        text = f"{scaled // 10**digits}.{scaled % 10**digits:0{digits}d}"
        if int(total * float(text)) == count:
            return text
    raise PlacerError(f"no --kt-gpu-experts-ratio gives int({total} * R) = {count}")


def kt_export(plan: Plan, config: dict | None, *, union: bool = False) -> KTExport:
    """The plan's resident set as sglang-kt's frequency file and ratio. `config` (the model's
    config.json) decides the engine's MoE layers; without it the plan's MoE layers must be
    every decoder layer (then no config rule can count them differently)."""
    num_layers = int(plan.model.get("num_layers") or 0)
    num_experts = plan.experts_per_layer
    if config is None:
        if plan.moe_layers != list(range(num_layers)):
            raise PlacerError("the plan's model has dense layers; sglang-kt counts its MoE "
                              "layers from config.json (first_k_dense_replace, "
                              "moe_layer_freq): pass --config config.json")
        moe = tuple(plan.moe_layers)
    else:
        _check_config(config, num_layers, num_experts)
        moe = engine_moe_layers(config)
    outside = sorted(set(plan.moe_layers) - set(moe))
    if outside:
        raise PlacerError(f"sglang-kt treats decoder layers {outside} as dense (all experts "
                          "on GPU) but the plan routes experts there; the engine cannot "
                          "hold the plan's set")
    resident = resident_experts(plan, union=union)
    counts = np.zeros((1, num_layers, num_experts), dtype=np.int32)
    counts[0, plan.moe_layers] = resident
    gpu = int(resident.sum())
    return KTExport(counts, gpu, gpu_experts_ratio(gpu, len(moe) * num_experts), moe)


def _check_config(config: dict, num_layers: int, num_experts: int) -> None:
    experts = next((config[k] for k in ("num_local_experts", "num_experts", "n_routed_experts")
                    if config.get(k) is not None), None)
    if config.get("num_hidden_layers") != num_layers or experts != num_experts:
        raise PlacerError(f"config.json has num_hidden_layers {config.get('num_hidden_layers')}"
                          f" and {experts} experts; the plan's model has {num_layers} layers "
                          f"and {num_experts} experts")


def write_kt_export(plan: Plan, out: Path, config: dict | None, inputs: Inputs = (), *,
                    union: bool = False) -> KTExport:
    """Write `{"logical_count": t}` as torch.save writes it to `out` (.pt) through the atomic
    writer (a named pipe is written to, not replaced), kept apart from `inputs`."""
    import torch

    out = Path(out)
    if out.suffix != ".pt":
        raise PlacerError(f"{out}: sglang-kt reads frequency files only from paths ending in "
                          ".pt")
    export = kt_export(plan, config, union=union)
    buffer = io.BytesIO()
    torch.save({"logical_count": torch.from_numpy(export.logical_count)}, buffer)
    write_bytes_atomic(buffer.getvalue(), out, inputs)
    return export
