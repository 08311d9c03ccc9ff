'''A plan's expert-parallel homes as TensorRT-LLM's static expert placement
(`placer export trtllm`).

TensorRT-LLM's MoE load balancer (`MoeLoadBalancerConfig`, `tensorrt_llm/llmapi/llm_args.py`
at NVIDIA/TensorRT-LLM 7ce477f3c73bffd52edebf6ffbd10d530dff2e6f; a dataclass in
`_torch/model_config.py` in older versions) reads `num_slots`, `initial_global_assignments`
(`{decoder layer: [expert id of each slot]}`) and `layer_updates_per_iter` (0: static, the
experts never move). `moe_config.load_balancer` names the YAML file holding it
(`TorchLlmArgs.validate_load_balancer`: a str is opened and `yaml.safe_load`-ed, so layer
keys are YAML ints). Its checks, which this export meets by construction and re-checks on
the file it wrote:
- `setup(ep_rank, ep_size)`: `num_slots % ep_size == 0`; EP rank r owns slots
  [r * num_slots / ep_size, (r + 1) * num_slots / ep_size).
- `get_layer_initial_global_assignments(layer)`: every MoE layer is a key (else KeyError),
  each list has `num_slots` entries.
- the MoE modules (`fused_moe_wide_ep.py`, `configurable_moe.py`): `num_slots >=
  num_experts` and `set(assignments) == set(range(num_experts))`.
Card c is EP rank c. Every rank has the same number of slots, so where the plan homes fewer
experts of a layer on one card the spare slots hold replicas of experts homed there, as in
the SGLang export: every copy of an expert stays on its home card.

Where it is silently ignored (`maybe_create_moe_load_balancer`, `_torch/modules/
fused_moe/moe_load_balancer.py` at 56851033051a6f9bd50e22219db64d68722a6f01): unless
`architectures[0]` is one of SUPPORTED, `moe_ep_size > 1` and `moe_cluster_size <= 1`;
newer MoE modules also assert attention data parallelism (`enable_attention_dp: true`) and a
backend that supports the balancer (WIDEEP, CUTLASS). TensorRT-LLM keeps every expert on
a GPU: the plan's cold experts (host-resident) are not expressed, only its homes.
'''

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from placer.errors import PlacerError
from placer.exporters.slots import home_slots
from placer.files import write_text_atomic
from placer.plan.placement import Plan
from traces.formats.bounded import read_bounded

SUPPORTED = ("DeepseekV3ForCausalLM", "MixtralForCausalLM", "Llama4ForConditionalGeneration",
             "Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM")


@dataclass(frozen=True)
class TrtllmPlacement:
    """The static placement of a plan: each MoE layer's expert per slot."""

    assignments: dict[int, list[int]]  # decoder layer -> [num_slots] expert of each slot
    slots_per_card: int
    ep_size: int
    warnings: list[str] = field(default_factory=list)

    @property
    def num_slots(self) -> int:
        return self.slots_per_card * self.ep_size

    def yaml(self, source: str) -> str:
        """The `moe_config.load_balancer` file."""
        lines = [f"# placer export trtllm of {source}: card c = EP rank c, static",
                 f"num_slots: {self.num_slots}", "layer_updates_per_iter: 0",
                 "initial_global_assignments:"]
        lines += [f"  {layer}: [{', '.join(map(str, slots))}]"
                  for layer, slots in self.assignments.items()]
        return "\n".join(lines) + "\n"

    def extra_options(self, balancer: Path) -> str:
        """The extra_llm_api_options YAML that loads it."""
        return ("enable_attention_dp: true\nmoe_config:\n  backend: WIDEEP\n"
                f"  load_balancer: {balancer}\n")

    def launch(self, options: Path) -> str:
        return (f"trtllm-serve MODEL --backend pytorch --tp_size {self.ep_size} --ep_size "
                f"{self.ep_size} --extra_llm_api_options {options}")


def trtllm_placement(plan: Plan) -> TrtllmPlacement:
    """Each card's slots list the experts homed on it (ascending), then replicas of them
    cyclically up to the largest per-card count of any layer (placer.exporters.slots)."""
    slots, rows = home_slots(plan, "TensorRT-LLM")
    assignments = {layer: row.tolist() for layer, row in zip(plan.moe_layers, rows, strict=True)}
    return TrtllmPlacement(assignments, slots, len(plan.cards),
                           placement_warnings(plan, len(plan.cards)))


def placement_warnings(plan: Plan, ep_size: int) -> list[str]:
    """Where TensorRT-LLM would ignore the file, or not run the plan as solved."""
    out = []
    if ep_size < 2:
        out.append("a one-card plan: TensorRT-LLM ignores the load balancer unless "
                   "moe_ep_size > 1 (it needs expert parallelism over several GPUs)")
    architecture = plan.model.get("architecture")
    if architecture not in SUPPORTED:
        out.append(f"architecture {architecture!r} is not one TensorRT-LLM's load balancer "
                   f"is created for ({', '.join(SUPPORTED)}): it would ignore the file silently")
    if any(e.resident_pages < len(e.pages) for e in plan.experts):
        out.append("the plan keeps some experts on the host; TensorRT-LLM keeps every expert "
                   "on its GPU, so only the plan's homes are exported (every card needs VRAM "
                   "for all the experts it homes)")
    return out


def check_placement(placement: TrtllmPlacement, plan: Plan, path: Path) -> None:
    """The engine's own checks (module docstring) and the plan's homes, on the written file."""
    import yaml

    data = yaml.safe_load(read_bounded(path, "load-balancer", error=PlacerError))
    num_slots, experts = data["num_slots"], plan.experts_per_layer
    table = data["initial_global_assignments"]
    if data["layer_updates_per_iter"] != 0 or num_slots % placement.ep_size \
            or num_slots < experts or set(table) != set(plan.moe_layers):
        raise PlacerError(f"{path}: the written load balancer breaks TensorRT-LLM's checks")
    per_rank, home = num_slots // placement.ep_size, plan.matrix("card")
    for ordinal, layer in enumerate(plan.moe_layers):
        slots = np.asarray(table[layer])
        if len(slots) != num_slots or set(slots.tolist()) != set(range(experts)):
            raise PlacerError(f"{path}: layer {layer} does not hold every expert once or more")
        for expert in range(experts):
            ranks = set((np.flatnonzero(slots == expert) // per_rank).tolist())
            if ranks != {int(home[ordinal, expert])}:
                raise PlacerError(f"{path}: layer {layer} expert {expert} is on ranks "
                                  f"{sorted(ranks)}, not its home")


def write_trtllm_placement(plan: Plan, out: Path, source: str) -> TrtllmPlacement:
    """Write the load balancer YAML for `plan` to `out` (atomically), read it back and check
    it; returns what was written."""
    out = Path(out)
    if out.suffix not in (".yaml", ".yml"):
        raise PlacerError(f"{out}: TensorRT-LLM reads moe_config.load_balancer as YAML; name "
                          "it .yaml")
    placement = trtllm_placement(plan)
    write_text_atomic(placement.yaml(source), out)
    check_placement(placement, plan, out)
    return placement
