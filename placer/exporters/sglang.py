"""A plan as SGLang expert locations (`placer export sglang`).

SGLang (`--init-expert-location FILE`): read from sglang 0.5.23 (PyPI wheel),
`python/sglang/srt/eplb/expert_location.py`, `compute_initial_expert_location_metadata`: a
`.json` file (by suffix; `.pt` is torch.load-ed, any other string is parsed as inline JSON)
holding a dict with `physical_to_logical_map` is passed as keyword arguments to
`ExpertLocationMetadata.init_by_mapping`, so it must hold that key only: an int matrix
[num_layers, num_physical_experts], num_layers = every decoder layer
(`get_model_config_for_expert_location` returns `config.num_hidden_layers`), num_physical =
num_logical + `--ep-num-redundant-experts`, and physical slot p lives on EP rank
p // (num_physical / ep_size) (`_compute_gpu_id_of_physical_expert`). Every rank has the same
number of slots, so where the plan homes more experts of a layer on one card than on another
the spare slots of the smaller cards hold replicas of experts already homed there: every copy
of an expert stays on its home card, at the price of that slot's weights in VRAM. Card c is
EP rank c; dense layers get SGLang's trivial row (p % num_logical).

The other form (`--logical-count`): a dict with `logical_count` goes to
`ExpertLocationMetadata.init_by_eplb`: a [num_layers, num_logical] (or [passes, layers,
experts]) load matrix from which SGLang's own EPLB packs the experts onto the EP ranks
(`eplb_algorithms/deepseek.py`: num_physical % ep_size == 0; the hierarchical variant, for
models with expert groups whose group count divides by the nodes, also needs num_logical %
num_groups == 0), so the placement is SGLang's, from the plan's calibration profile.

Either way: `--enable-eplb` rebalances every `--eplb-rebalance-num-iterations` forward passes
and replaces the exported placement; and placer's card c is EP rank c only when each EP rank
is one GPU, `--tp-size N --ep-size N` (`arg_groups/parallel_hook.py`: with moe_dp_size 1 and
ep < tp each EP rank is a group of tp / ep GPUs).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from placer.errors import PlacerError
from placer.exporters.slots import home_slots
from placer.files import Inputs, write_json_atomic
from placer.plan.placement import Plan
from traces.errors import first_line
from traces.formats.bounded import read_bounded
from traces.formats.jsontext import loads_json


@dataclass(frozen=True)
class SGLangLocation:
    """The expert placement of a plan as SGLang's physical-to-logical map."""

    physical_to_logical_map: np.ndarray  # [num_layers, num_cards * slots_per_card] int
    slots_per_card: int
    redundant: int  # --ep-num-redundant-experts SGLang must be started with

    @property
    def ep_size(self) -> int:
        return self.physical_to_logical_map.shape[1] // self.slots_per_card


def sglang_location(plan: Plan) -> SGLangLocation:
    """Each card's physical slots list the experts homed on it (ascending), then replicas of
    them cyclically up to the largest per-card count of any layer (placer.exporters.slots);
    dense layers keep SGLang's identity map."""
    num_layers = plan.model.get("num_layers")
    if num_layers is None:
        raise PlacerError("the plan has no model.num_layers (every decoder layer, as SGLang "
                          "counts them)")
    slots, rows = home_slots(plan, "SGLang")
    num_experts = plan.experts_per_layer
    physical = rows.shape[1]
    p2l = np.tile(np.arange(physical) % num_experts, (num_layers, 1))
    p2l[plan.moe_layers] = rows
    return SGLangLocation(p2l, slots, physical - num_experts)


def write_sglang_location(plan: Plan, out: Path, inputs: Inputs = ()) -> SGLangLocation:
    """Write `--init-expert-location` JSON for `plan` to `out` (atomically, kept apart from
    `inputs`), read it back and check every expert's home; returns what was written."""
    out = Path(out)
    if out.suffix != ".json":
        raise PlacerError(f"{out}: SGLang reads --init-expert-location by suffix; use .json")
    location = sglang_location(plan)
    write_json_atomic({"physical_to_logical_map": location.physical_to_logical_map.tolist()},
                      out, inputs)
    homes = sglang_homes(read_sglang_location(out), plan.moe_layers, location.ep_size,
                         plan.experts_per_layer)
    if not np.array_equal(homes, plan.matrix("card")):
        raise PlacerError(f"{out}: the written expert locations do not give the plan's homes")
    return location


def read_sglang_location(path: Path) -> np.ndarray:
    """The [num_layers, num_physical] map of an `--init-expert-location` JSON file."""
    try:
        data = loads_json(read_bounded(path, "expert-location", error=PlacerError), str(path),
                          PlacerError)
        p2l = np.asarray(data["physical_to_logical_map"], dtype=np.int64)
    except PlacerError:
        raise
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise PlacerError(f"{path}: not an SGLang expert location file ({first_line(exc)})"
                          ) from None
    if p2l.ndim != 2:
        raise PlacerError(f"{path}: physical_to_logical_map must be [layers, physical experts]")
    return p2l


def sglang_homes(p2l: np.ndarray, moe_layers: list[int], ep_size: int,
                 num_experts: int) -> np.ndarray:
    """[L, E] EP rank of each expert of each MoE layer under `p2l`; a PlacerError if an
    expert has no slot or slots on two ranks."""
    if p2l.shape[1] % ep_size:
        raise PlacerError(f"{p2l.shape[1]} physical experts do not split over {ep_size} ranks")
    rank_of_slot = np.arange(p2l.shape[1]) // (p2l.shape[1] // ep_size)
    homes = np.full((len(moe_layers), num_experts), -1, dtype=np.int64)
    for ordinal, layer in enumerate(moe_layers):
        for expert in range(num_experts):
            ranks = np.unique(rank_of_slot[p2l[layer] == expert])
            if len(ranks) != 1:
                raise PlacerError(f"layer {layer} expert {expert} is on ranks {ranks.tolist()}")
            homes[ordinal, expert] = ranks[0]
    return homes


EPLB_WARNING = ("--enable-eplb replaces this placement every --eplb-rebalance-num-iterations "
                "forward passes: leave it off to keep it")


def sglang_flags(location_file: Path, ep_size: int, redundant: int) -> list[str]:
    """The server flags an exported location needs (card c = EP rank c: one GPU per rank)."""
    flags = [f"--init-expert-location {location_file}", f"--tp-size {ep_size}",
             f"--ep-size {ep_size}"]
    return flags + ([f"--ep-num-redundant-experts {redundant}"] if redundant else [])


def logical_count(plan: Plan) -> np.ndarray:
    """[num_layers, E] int64 load of every decoder layer from the plan's calibration profiles
    (each weighed as if it had the largest profile's tokens, as the solver weighs profiles
    alike); dense layers 0."""
    num_layers = plan.model.get("num_layers")
    if num_layers is None:
        raise PlacerError("the plan has no model.num_layers (every decoder layer, as SGLang "
                          "counts them)")
    profiles = [c for c in plan.calibration if c.get("counts") is not None]
    if not profiles:
        raise PlacerError("the plan has no calibration counts (solved without --traces): "
                          "nothing to give SGLang's EPLB")
    most = max(max(int(c["tokens"]), 1) for c in profiles)
    load = sum(np.asarray(c["counts"], np.float64) * most / max(int(c["tokens"]), 1)
               for c in profiles)
    out = np.zeros((num_layers, plan.experts_per_layer), dtype=np.int64)
    out[plan.moe_layers] = np.rint(load).astype(np.int64)
    return out


def write_sglang_logical_count(plan: Plan, out: Path) -> int:
    """Write `{"logical_count": [...]}` for `plan` to `out` (.json, atomically); returns the
    redundant experts SGLang needs so that the physical experts split over the cards."""
    out = Path(out)
    if out.suffix != ".json":
        raise PlacerError(f"{out}: SGLang reads --init-expert-location by suffix; use .json")
    write_json_atomic({"logical_count": logical_count(plan).tolist()}, out)
    return -plan.experts_per_layer % len(plan.cards)
