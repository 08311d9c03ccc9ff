'''A plan's layer-offload baseline as llama.cpp arguments (`placer export llamacpp`).

llama.cpp (`-ot/--override-tensor PATTERN=BUFT`, `--n-cpu-moe N`): read from ggml-org/llama.cpp
commit 001d906a6d86e2490e394361e7cc6f478b100088, `common/common.h`: `--n-cpu-moe N` adds, for
i in [0, N), `blk\\.{i}` + `LLM_FFN_EXPS_REGEX` = `\\.ffn_(up|down|gate|gate_up)_(ch|)exps`
bound to the CPU buffer type; `common/arg.cpp` `parse_tensor_buffer_overrides` splits `-ot`
on ',' then on '='; the loader matches patterns with std::regex_search on GGUF tensor names.
llama.cpp can offload only whole expert tensors, one per layer, so its equivalent at the
plan's budget is the layer-offload baseline: the first N MoE layers cold, N minimal so that
on every card the experts it homes in the remaining layers fit its capacity (budget - staging).

GGUF tensor names (GGUF block N = decoder layer N): llama.cpp's own `gguf-py` 0.19.0 (PyPI
`gguf`), `gguf/constants.py`: `MODEL_TENSORS[arch]` lists FFN_GATE_EXP, FFN_UP_EXP,
FFN_DOWN_EXP = `blk.{bid}.ffn_gate_exps`, `blk.{bid}.ffn_up_exps`, `blk.{bid}.ffn_down_exps`
for qwen2moe, qwen3moe, llama (Mixtral converts to arch llama), olmoe, deepseek2 (DeepSeek V2/V3)
and gpt-oss, each with suffix `.weight`; `src/llama-model.cpp` (LLM_ARCH_OPENAI_MOE, gpt-oss)
also loads `tn(LLM_TENSOR_FFN_{GATE,DOWN,UP}_EXPS, "bias", i)`, i.e. `blk.N.ffn_*_exps.bias`.
The HF model_type -> GGUF arch map is `convert_hf_to_gguf.py`'s (MixtralForCausalLM is
registered on the llama model class).
'''

from __future__ import annotations

import shlex
from dataclasses import dataclass

import numpy as np

from placer.plan.placement import Plan

LLAMACPP_EXPS_REGEX = r"\.ffn_(up|down|gate|gate_up)_(ch|)exps"

# HF config model_type -> GGUF general.architecture
GGUF_ARCH = {"qwen2_moe": "qwen2moe", "qwen3_moe": "qwen3moe", "mixtral": "llama",
             "olmoe": "olmoe", "deepseek_v2": "deepseek2", "deepseek_v3": "deepseek2",
             "gpt_oss": "gpt-oss"}
EXPERT_TENSORS = ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")
BIASED = {"gpt-oss"}  # archs whose expert tensors also have a .bias tensor each


@dataclass(frozen=True)
class LlamaCppOffload:
    """The layer-offload baseline of a plan as llama.cpp arguments."""

    cold_layers: list[int]  # decoder layer indices (= GGUF blk.N), ascending
    n_cpu_moe: int | None   # equivalent --n-cpu-moe, where the cold layers are a prefix
    gguf_arch: str | None   # GGUF architecture of the plan's model (None: not known here)

    @property
    def override(self) -> str | None:
        """The `-ot` value, or None when no layer is cold."""
        if not self.cold_layers:
            return None
        layers = "|".join(str(layer) for layer in self.cold_layers)
        return rf"blk\.({layers}){LLAMACPP_EXPS_REGEX}=CPU"

    def args(self) -> str:
        """The arguments as one shell-quoted line ('' when nothing is offloaded)."""
        return "" if self.override is None else f"-ot {shlex.quote(self.override)}"

    def expert_tensors(self) -> list[str]:
        """The GGUF expert tensors of one layer, with `{layer}` for its block number ([] for
        an architecture placer does not know)."""
        if self.gguf_arch is None:
            return []
        suffixes = ("weight", "bias") if self.gguf_arch in BIASED else ("weight",)
        return [f"blk.{{layer}}.{name}.{suffix}" for name in EXPERT_TENSORS
                for suffix in suffixes]

    def tensor_names(self) -> list[str]:
        """The GGUF tensors the override moves to CPU, layer by layer."""
        return [t.format(layer=layer) for layer in self.cold_layers
                for t in self.expert_tensors()]


def layer_offload_cold(plan: Plan) -> int:
    """N: the fewest leading MoE layers to make cold so that on every card the experts it
    homes in the other MoE layers fit its capacity_bytes."""
    home, nbytes = plan.matrix("card"), plan.matrix("bytes")
    num_cards = len(plan.cards)
    per_layer = np.stack([np.bincount(h, weights=b, minlength=num_cards)
                          for h, b in zip(home, nbytes, strict=True)])
    resident = np.vstack([np.cumsum(per_layer[::-1], axis=0)[::-1], np.zeros(num_cards)])
    capacity = np.array([c.capacity_bytes for c in plan.cards])
    return int(np.flatnonzero((resident <= capacity).all(axis=1))[0])


def llamacpp_offload(plan: Plan) -> LlamaCppOffload:
    """The layer-offload baseline of `plan` in llama.cpp's terms (module docstring)."""
    arch = GGUF_ARCH.get(plan.model.get("model_type") or "")
    cold = plan.moe_layers[:layer_offload_cold(plan)]
    if not cold:
        return LlamaCppOffload([], 0, arch)
    prefix = [layer for layer in plan.moe_layers if layer <= cold[-1]]
    return LlamaCppOffload(cold, cold[-1] + 1 if prefix == cold else None, arch)
