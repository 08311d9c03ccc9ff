'''A plan's layer-offload baseline as llama.cpp arguments (`placer export llamacpp`).

Read from llama.cpp 0c1e57098bba43ac29e6e3b677cdceebdd22334f (vendored in llama-cpp-python
0.3.36), `common/arg.cpp`: `-cmoe/--cpu-moe` binds every `\\.ffn_(up|down|gate|gate_up)_(ch|)exps`
tensor to the CPU; `-ncmoe/--n-cpu-moe N` binds those of `blk\\.{i}` for i in [0, N) (decoder
layers, dense ones counted); `-ot/--override-tensor "<regex>=<buffer type>,..."` (repeatable;
split on ',' then on the first '=') binds the GGUF tensors the regex finds (std::regex_search,
`src/llama-model-loader.cpp`: overrides tried in order, the first match wins) to a buffer
type named as the backends name them: `CPU`, `CUDA0`, `CUDA1`, ... (`ROCm0` on HIP builds,
listed by `--list-devices`); `-ts/--tensor-split a,b,...` splits the layers (dense weights
and KV cache) over the devices in proportion; `-ngl all` puts every layer on the GPUs; an
explicit `-ngl`, `-ts` or `-ot` turns `--fit`'s own allocation off, so these flags stand.

llama.cpp offloads whole expert tensors, one per layer and kind (a layer's experts are one
3-D tensor), so its equivalent at the plan's budget is a layer-offload baseline: the first N
MoE layers cold (on the CPU), each other layer's experts on one device. On one card, N is
minimal so that the experts of the other layers fit the card's expert capacity (budget less
the staging reserve: placer/plan/capacity.py, the very N `placer evaluate` replays as layer
offload); on several, N is minimal so that the other layers, in order, fill the devices one
after another within each card's expert capacity (a device takes a contiguous run of
layers, as llama.cpp's layer split does). The plan's expert-parallel homes spread a layer
over cards, which llama.cpp cannot express, so that N can exceed the plan's own layer
baseline: the export says so. Every MoE layer cold is `--cpu-moe`.

GGUF tensor names (GGUF block N = decoder layer N): llama.cpp's own `gguf-py` 0.19.0 (PyPI
`gguf`), `gguf/constants.py`: `MODEL_TENSORS[arch]` lists FFN_GATE_EXP, FFN_UP_EXP,
FFN_DOWN_EXP = `blk.{bid}.ffn_gate_exps`, `blk.{bid}.ffn_up_exps`, `blk.{bid}.ffn_down_exps`
for qwen2moe, qwen3moe, llama (Mixtral converts to arch llama), olmoe, deepseek2 (DeepSeek V2/V3)
and gpt-oss, each with suffix `.weight`; `src/llama-model.cpp` (LLM_ARCH_OPENAI_MOE, gpt-oss)
also loads `tn(LLM_TENSOR_FFN_{GATE,DOWN,UP}_EXPS, "bias", i)`, i.e. `blk.N.ffn_*_exps.bias`.
The HF model_type -> GGUF arch map is `convert_hf_to_gguf.py`'s (MixtralForCausalLM is
registered on the llama model class).

The context: where the plan's spec names one (`[context]`, `solve --ctx`), both commands end
with `-c N` and, for a KV type other than f16, `-ctk T -ctv T` (common/arg.cpp at 0c1e5709:
`-c/--ctx-size N`, `-ctk/--cache-type-k TYPE`, `-ctv/--cache-type-v TYPE`, TYPE one of
kv_cache_types by ggml_type_name); a plan of an older spec keeps its old command.
'''

from __future__ import annotations

import math
import shlex
from dataclasses import dataclass, field
from functools import reduce
from pathlib import Path

import numpy as np

from placer.checkpoint.kv import DEFAULT_KV_TYPE, Context
from placer.errors import PlacerError
from placer.plan.capacity import expert_capacity, layer_offload_cold
from placer.plan.placement import Plan
from placer.units import format_bytes
from solvers.llamacpp.builds import CACHE_FLAG, SHARE_FLAG, Build

LLAMACPP_EXPS_REGEX = r"\.ffn_(up|down|gate|gate_up)_(ch|)exps"

# HF config model_type -> GGUF general.architecture
GGUF_ARCH = {"qwen2_moe": "qwen2moe", "qwen3_moe": "qwen3moe", "mixtral": "llama",
             "olmoe": "olmoe", "deepseek_v2": "deepseek2", "deepseek_v3": "deepseek2",
             "gpt_oss": "gpt-oss"}
EXPERT_TENSORS = ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")
BIASED = {"gpt-oss"}  # archs whose expert tensors also have a .bias tensor each


def gguf_arch(model_type: str) -> str | None:
    """The GGUF architecture of a plan's model_type: a Hugging Face name through GGUF_ARCH, a
    GGUF name (a plan solved from a .gguf) as itself; None for one placer does not know."""
    return GGUF_ARCH.get(model_type) or (model_type if model_type in GGUF_ARCH.values() else None)


def context_args(tokens: int | None, context: Context | None) -> list[str]:
    """`-c tokens` (none where `tokens` is None), and `-ctk T -ctv T` where the spec's
    `context` names a KV type other than f16 (module docstring)."""
    args = [] if tokens is None else ["-c", str(tokens)]
    if context is not None and context.kv_type != DEFAULT_KV_TYPE:
        args += ["-ctk", context.kv_type, "-ctv", context.kv_type]
    return args


def override(layers: list[int], buffer: str) -> str:
    """The `-ot` value binding the expert tensors of `layers` to `buffer`."""
    return rf"blk\.({'|'.join(map(str, layers))}){LLAMACPP_EXPS_REGEX}={buffer}"


@dataclass(frozen=True)
class LlamaCppOffload:
    """The layer-offload baseline of a plan as llama.cpp arguments."""

    cold_layers: list[int]  # decoder layer indices (= GGUF blk.N), ascending
    n_cpu_moe: int          # equivalent --n-cpu-moe (the cold layers are the first MoE ones)
    gguf_arch: str | None   # GGUF architecture of the plan's model (None: not known here)
    all_cold: bool = False  # every MoE layer cold: --cpu-moe
    devices: list[tuple[str, list[int]]] = field(default_factory=list)  # several cards only
    tensor_split: list[int] | None = None
    warnings: list[str] = field(default_factory=list)
    context: Context | None = None  # the plan's spec's [context]: -c, -ctk/-ctv

    @property
    def override(self) -> str | None:
        """The `-ot` value of the cold layers, or None when no layer is cold."""
        return override(self.cold_layers, "CPU") if self.cold_layers else None

    def arg_list(self) -> list[str]:
        """The arguments, one flag and its value at a time ([] when there is nothing to
        override: one card holding every expert)."""
        args = ["--cpu-moe"] if self.all_cold else (
            ["-ot", self.override] if self.override else [])
        for name, layers in self.devices:
            if layers:
                args += ["-ot", override(layers, name)]
        if self.tensor_split is not None:
            args += ["-ngl", "all", "-ts", ",".join(map(str, self.tensor_split))]
        if self.context is not None:
            args += context_args(self.context.tokens, self.context)
        return args

    def args(self) -> str:
        """The arguments as one shell-quoted line."""
        return " ".join(shlex.quote(a) for a in self.arg_list())

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

    def to_json(self) -> dict:
        """`placer export llamacpp --json` of a plan's layer-offload baseline."""
        return {"cold_layers": self.cold_layers, "override_tensor": self.override,
                "n_cpu_moe": self.n_cpu_moe, "cpu_moe": self.all_cold,
                "devices": [{"name": n, "layers": ls} for n, ls in self.devices],
                "tensor_split": self.tensor_split, "args": self.args(),
                "gguf_arch": self.gguf_arch, "tensors": self.tensor_names(),
                "warnings": self.warnings,
                "context": None if self.context is None else {
                    "tokens": self.context.tokens, "kv_type": self.context.kv_type}}


def pack_layers(layer_bytes: np.ndarray, capacity: np.ndarray) -> tuple[int, list[int]]:
    """(N, [device of each MoE layer from the N-th on]) with N minimal such that those layers,
    in order, fill the devices one after another within `capacity` (every layer cold, N = L,
    when none fits)."""
    for cold in range(len(layer_bytes)):
        device, used, owner = 0, 0.0, []
        for size in layer_bytes[cold:]:
            while device < len(capacity) and used + size > capacity[device]:
                device, used = device + 1, 0.0
            if device == len(capacity):
                break
            used += size
            owner.append(device)
        else:
            return cold, owner
    return len(layer_bytes), []


def tensor_split(plan: Plan) -> list[int]:
    """-ts proportions: each card's reserved dense + KV bytes (what follows the layer split),
    reduced to small integers; equal where the spec reserves nothing."""
    reserved = [c.reserved_dense + c.reserved_kv for c in plan.hardware.cards]
    if not any(reserved):
        return [1] * len(reserved)
    mib = [max(1, round(r / 2**20)) for r in reserved]
    common = reduce(math.gcd, mib)
    return [m // common for m in mib]


def llamacpp_offload(plan: Plan, devices: list[str] | None = None) -> LlamaCppOffload:
    """The layer-offload baseline of `plan` in llama.cpp's terms (module docstring);
    `devices`: the buffer type of each card (default CUDA0, CUDA1, ...)."""
    num_cards = len(plan.cards)
    names = device_names(plan, devices)
    arch = gguf_arch(plan.model.get("model_type") or "")
    warnings = stage_warning(plan)
    layer_bytes = plan.matrix("bytes").sum(axis=1).astype(np.float64)
    capacity = expert_capacity(plan).astype(np.float64)
    baseline = layer_offload_cold(plan)
    count, owner = (baseline, []) if num_cards == 1 else pack_layers(layer_bytes, capacity)
    if count > baseline:
        warnings.append(f"llama.cpp keeps each layer's experts on one device: {count} cold MoE "
                        f"layers where the plan's layer baseline, its experts on their "
                        f"expert-parallel homes, needs {baseline}")
    cold = plan.moe_layers[:count]
    warm = plan.moe_layers[count:]
    per_device = [(name, [layer for layer, d in zip(warm, owner, strict=True) if d == c])
                  for c, name in enumerate(names)] if num_cards > 1 else []
    return LlamaCppOffload(cold, cold[-1] + 1 if cold else 0,
                           arch, all_cold=bool(cold) and not warm, devices=per_device,
                           tensor_split=tensor_split(plan) if num_cards > 1 else None,
                           warnings=warnings, context=plan.hardware.context)


def device_names(plan: Plan, devices: list[str] | None) -> list[str]:
    """The buffer / device name of each card (`--devices`; default CUDA0, CUDA1, ...):
    one per card of the plan, distinct, none of them the CPU."""
    num_cards = len(plan.cards)
    default = [f"CUDA{c}" for c in range(num_cards)]
    names = devices or default
    if (len(names) != num_cards or len(set(names)) != num_cards or "CPU" in names
            or not all(names)):
        raise PlacerError(f"--devices: give {num_cards} distinct GPU buffer names, one per "
                          f"card of the plan (e.g. {','.join(default)}), got {','.join(names)}")
    return names


def check_model(plan: Plan, model: Path) -> None:
    """PlacerError unless the GGUF `model` is the model the plan was solved for: the same
    fingerprint (placer/checkpoint/gguf.py), or for a plan solved from a config.json alone
    (no real fingerprint) the same MoE layers and bytes of every expert (a plan solved for
    bf16 experts gives another cache size than a Q8_0 GGUF needs)."""
    from placer.checkpoint.inventory import read_inventory

    if model.suffix.lower() != ".gguf":
        raise PlacerError(f"--model {model}: llama-server takes a GGUF file (.gguf)")
    inv = read_inventory(model)
    if not plan.model.get("estimated"):
        if inv.fingerprint != plan.model["fingerprint"]:
            raise PlacerError(f"--model {model}: fingerprint {inv.fingerprint[:16]} is not the "
                              f"plan's ({plan.model['fingerprint'][:16]}): solve for this GGUF")
        return
    ours, theirs = plan.matrix("bytes"), inv.expert_bytes()
    if list(inv.moe_layers) != plan.moe_layers or not np.array_equal(theirs, ours):
        raise PlacerError(f"--model {model}: its experts ({format_bytes(int(theirs.max()))} "
                          f"each at most, {len(inv.moe_layers)} MoE layers) are not the ones "
                          f"the plan was solved for ({format_bytes(int(ours.max()))}, "
                          f"{len(plan.moe_layers)} layers; another quantization?): solve with "
                          f"--model {model}")


@dataclass(frozen=True)
class Placeholder:
    """What stands for the GGUF in the command of a plan solved without one (a checkpoint or
    a config.json): its name on the command line, and what the GGUF must match (check_model
    checks it when --model is given)."""

    name: str
    must_match: str


def model_placeholder(plan: Plan) -> Placeholder:
    """The placeholder of a plan solved from a checkpoint or config.json (module Placeholder):
    the fingerprint a GGUF converted from that checkpoint must have; for a config's estimate,
    which has none, the MoE layers and expert bytes."""
    if plan.model.get("estimated"):
        sizes = plan.matrix("bytes")
        must = (f"with {len(plan.moe_layers)} MoE layers of {plan.experts_per_layer} experts "
                f"of {format_bytes(int(sizes.max()))} each at most (the config's estimate: "
                "quantize to the expert dtype solved for)")
    else:
        must = f"fingerprint {plan.model['fingerprint'][:16]}"
    return Placeholder("MODEL.gguf", must)


def stage_warning(plan: Plan) -> list[str]:
    """A plan solved for staging reserved VRAM llama.cpp does not use."""
    staging = max(c.staging_bytes for c in plan.cards)
    if plan.execution != "stage" or staging == 0:
        return []
    return [f"the plan was solved with --execution stage: its budget holds a staging buffer "
            f"({format_bytes(staging)} per card at most) that llama.cpp does not use; solve "
            "with --execution cpu for llama.cpp"]


def engine_args(plan: Plan, build: Build, option: dict | None = None,
                devices: list[str] | None = None) -> list[str]:
    """The llama-server flags of a plan solved with `--engine llamacpp` (placer.plan.llamacpp),
    or of one of its options: `-dev` where the cards' device names are given (`--devices`;
    common/arg.cpp `-dev/--device <dev1,dev2,..>`), every layer on the GPU (`-ngl all`:
    llama.cpp caches only the host experts of layers assigned to a GPU), over several GPUs by
    the plan's `-ts` (each layer then goes to the card solvers.llamacpp.layer_devices says,
    its experts with it unless overridden), the host layers' expert tensors on the CPU
    (`-ncmoe N` where they are decoder layers 0 .. N - 1, `-cmoe` where they are every MoE
    layer, else one `-ot` override), `--moe-cache-mib N` and `--moe-cache-cpu-share F` where
    the option has them (PlacerError naming the build where `build` lacks the flag), `-lm
    none` where its host experts are pinned, and `-c` the context the spec reserved KV for
    (with -ctk/-ctv where its [context] names a KV type other than f16: context_args).
    (-c, -ngl, -ts, -ot, -ncmoe, -cmoe, -lm, -dev: common/arg.cpp at 0c1e5709;
    --moe-cache-mib: @4b060f27; --moe-cache-cpu-share: docs/moe-cache.md at b12191.)"""
    engine = plan.engine or {}
    if engine.get("name") != "llamacpp":
        raise PlacerError("this plan was not solved with --engine llamacpp")
    opt = option or engine
    host = list(opt["host_layers"])
    args = ["-dev", ",".join(devices)] if devices else []
    args += ["-ngl", "all"]
    if engine.get("tensor_split"):
        args += ["-ts", ",".join(f"{x:.10g}" for x in engine["tensor_split"])]
    if opt.get("n_cpu_moe") is not None:
        args += ["-ncmoe", str(opt["n_cpu_moe"])]
    elif host and host == list(plan.moe_layers):
        args += ["-cmoe"]
    elif host:
        args += ["-ot", override(host, "CPU")]
    for flag, value, given in ((CACHE_FLAG, str(opt.get("moe_cache_mib", 0)),
                                opt.get("moe_cache_mib", 0) > 0),
                               (SHARE_FLAG, f"{opt.get('cpu_share', 0.0):g}",
                                opt.get("cpu_share", 0.0) > 0)):
        if given and flag not in build.flags:
            raise PlacerError(f"option {opt.get('name', 'chosen')!r} needs {flag}, which "
                              f"{build.label} does not have: solve for this build "
                              f"(--llamacpp-version) or name a build that has it")
        if given:
            args += [flag, value]
    if host and opt.get("pinned", True):
        args += ["-lm", "none"]
    return args + context_args(engine.get("context") or None, plan.hardware.context)


def server_command(plan: Plan, build: Build, model: str = "model.gguf",
                   option: dict | None = None, devices: list[str] | None = None) -> str:
    """The llama-server command line of an `--engine llamacpp` plan (or of one option)."""
    return " ".join(shlex.quote(a) for a in ["llama-server", "-m", model,
                                              *engine_args(plan, build, option, devices)])


def plan_option(plan: Plan, name: str | None) -> dict:
    """The option `name` of a llama.cpp plan's table (None: the choice itself)."""
    options = {o["name"]: o for o in (plan.engine or {}).get("options", [])}
    if name is None:
        return options.get("chosen", plan.engine)
    if name not in options:
        raise PlacerError(f"--option: the plan has no option {name!r}; its options: "
                          f"{', '.join(map(repr, options))}")  # quoted: names hold commas
    return options[name]
