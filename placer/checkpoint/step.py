"""The decode step with every expert resident (a spec's `[decode] base_step_ms`), measured
on a stand-in of the model, or estimated from memory bandwidth where it cannot run.

Measured (`measure_steps`): the model is built from its config.json with random weights and
each MoE layer holding only as many experts as a token selects (top-k; for DeepSeek's
grouped routing, enough for its groups), each of the real expert's shape. Every selection
then hits a resident expert, so a decode step computes what the real model computes when
everything is resident (attention, dense layers, the top-k experts of every token), without
the memory of the experts no token of this step selects: a model that does not fit the card
can be timed. At batch B > 1 the stand-in reads at most top-k experts per layer where the
real model reads up to B x top-k distinct ones: at large B on a memory-bound card it
under-states the step (the estimate below counts them). Weights are in the config's
torch_dtype (a quantized config, fp8 or mxfp4, runs in bfloat16: torch's kernels, not the
engine's). Each batch: a prompt of `context` tokens prefilled, then decode steps timed after
`warmup`, device synchronised, until their spread is small: at least `steps`, more while the
interquartile range of the times exceeds STEADY of their median (a neighbour's burst, a clock
ramping up), at most MAX_STEPS or STEP_BUDGET_S; the median counts, its spread is reported, and
a batch whose spread stays above STEADY is marked NOISY (the figure is then worth little: the
machine was busy). The device timed is named in what is printed and written (its model: the
CPU's from /proc/cpuinfo, the GPU's from CUDA), so that a step time from another device than
the spec's card is never taken for the card's.

The stand-in is first built on torch's meta device (no memory) and its bytes compared with
the checkpoint's own tensors: a config.json whose sizes (hidden, vocabulary, heads, layers)
do not describe its weights is refused before anything is allocated from it.

Estimated (`estimate_steps`): a step at batch B reads the dense weights (`dense_read_bytes`:
the token embedding table only at its B rows where the model has an output head of its own),
per MoE layer the expected distinct experts selected (E x (1 - (1 - k/E)^B) under
independent routing) x an expert's bytes, and each sequence's KV cache at its context
(`kv_bytes` a sequence); it takes `step_ms`: those bytes at the card's effective bandwidth
(its published bandwidth x the backend's fitted share), or the compute where that binds (2
FLOP a weight a token, taking a weight for two bytes: a bf16 checkpoint's; a quantized one's
weights are counted short),
plus every decoder layer's fixed cost (kernel launches, syncs). The share, the per-layer cost
and the range the step may lie in come from a fit to published llama.cpp measurements
(`StepFit`, placer/hardware/step_fit.py); without one (share 1, no per-layer cost) it is the
bandwidth floor. Either way it is marked estimated.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from placer.checkpoint.config import EXPERT_COUNT_KEYS, check_heads
from placer.errors import PlacerError
from traces.options import available_memory

if TYPE_CHECKING:
    from placer.checkpoint.inventory import Inventory

DEFAULT_CONTEXT = 64
DEFAULT_STEPS = 8
MAX_STEPS = 64
STEP_BUDGET_S = 20.0  # per batch: no step starts after this once DEFAULT_STEPS are timed
STEADY = 0.05  # interquartile range over median below which the step times have settled
CONFIG_SLACK = 1.25  # the stand-in may hold this much more than the checkpoint's tensors
CONFIG_SLACK_BYTES = 64 * 2**20  # (plus this: buffers, norms a checkpoint stores in bf16)
QUANTIZED_WIDENING = 4  # a quantized checkpoint's stand-in runs in bf16: up to 4 x mxfp4
WARMUP = 2
MEMORY_MARGIN = 0.7  # of the device's free memory the stand-in may take
QUANTIZED_AS = "bfloat16"


@dataclass(frozen=True)
class StepTimes:
    """Decode step ms by batch, and how they were obtained."""

    base_step_ms: tuple[tuple[int, float], ...]  # (batch, ms) ascending
    estimated: bool
    how: str  # one line: what was timed on which device, or the estimate's inputs
    spread: tuple[tuple[int, float], ...] = ()  # (batch, IQR / median of its step times)
    steps: tuple[tuple[int, int], ...] = ()     # (batch, decode steps timed)
    device: str = ""  # the device timed, with its model ("cpu (AMD EPYC 7R13)"); "" estimated

    step_spread: tuple[float, float] = (1.0, 1.0)  # an estimate's range, factors of it

    @property
    def noisy(self) -> bool:
        """Whether some batch's step times never settled (spread above STEADY)."""
        return any(s > STEADY for _, s in self.spread)

    def note(self) -> str:
        """How the figures were obtained, for the comment beside them: ESTIMATED or NOISY
        first where they are."""
        if self.estimated:
            return "ESTIMATED, not measured: " + self.how
        spreads = ", ".join(f"{b}: {100 * s:.1f}%" for b, s in self.spread)
        tail = f"; spread (IQR / median) by batch {spreads}" if spreads else ""
        return ("NOISY (the step times did not settle: a busy machine?): " if self.noisy
                else "") + self.how + tail


def standin_experts(config: dict, top_k: int) -> int:
    """Experts per MoE layer of the stand-in: top-k, or for grouped routing (n_group groups,
    topk_group chosen, each scored by its best two) enough per group for both."""
    groups = config.get("n_group") or 1
    if groups <= 1:
        return top_k
    per_group = max(2, math.ceil(top_k / (config.get("topk_group") or 1)))
    return groups * per_group


def standin_bytes(inv: Inventory) -> int:
    """Bytes of the stand-in's weights: the dense tensors and its experts."""
    sizes = inv.expert_bytes()
    experts = standin_experts(inv.config, inv.top_k)
    return int(inv.dense_bytes + sizes.max(axis=1).sum() * experts)


@dataclass(frozen=True)
class StepFit:
    """What turns bytes read into a step on a card and backend: the share of the card's
    published bandwidth the weights stream at, a decoder layer's fixed cost, the range
    (factors of the estimate) the fit's own sources lie in, and which fit it is."""

    share: float = 1.0
    layer_us: float = 0.0
    spread: tuple[float, float] = (1.0, 1.0)
    name: str = "the bandwidth floor (no fit)"


def step_ms(read_bytes: float, layers: int, bandwidth: float, fit: StepFit,
            flops: float | None = None, weights: float = 0.0) -> float:
    """A decode step, ms: `read_bytes` at `fit.share` x `bandwidth` (bytes/s), or `weights`
    bytes of weights computed at `flops` (FLOP/s, 1 FLOP a byte: see module docstring)
    where that takes longer, plus `layers` x the fit's per-layer cost."""
    memory = read_bytes / (fit.share * bandwidth)
    compute = weights / flops if flops else 0.0
    return 1e3 * max(memory, compute) + layers * fit.layer_us / 1e3


# The token embedding table (a decode step reads one row of it per token: llama.cpp's
# get_rows, transformers' nn.Embedding) and the output head (a matmul: read whole), by the
# names checkpoints and GGUFs give them (a GGUF's head is `output.weight`, llama.cpp
# src/llama-quant.cpp `tensor_name_match_output_weight`, ggml-org/llama.cpp@007dbbf3).
EMBEDDING_NAMES = ("embed_tokens.weight", "token_embd.weight", "wte.weight",
                   "word_embeddings.weight", "tok_embeddings.weight")
HEAD_NAMES = ("lm_head.weight", "output.weight", "embed_out.weight")


def _named(name: str, names: tuple[str, ...]) -> bool:
    return any(name == n or name.endswith("." + n) for n in names)


def dense_read_bytes(inv: Inventory, tokens: int) -> float:
    """Bytes of dense weights a decode step of `tokens` tokens reads: every dense tensor whole
    but the token embedding table, of which each token reads its one row. A model with no
    output head of its own ties its embeddings: the table is the head, read whole (as
    llama.cpp's quantizer takes a model without `output.weight` to be tied,
    src/llama-quant.cpp `has_tied_embeddings`, ggml-org/llama.cpp@007dbbf3)."""
    if not any(_named(t.name, HEAD_NAMES) for t in inv.dense_tensors):
        return float(inv.dense_bytes)
    hidden = inv.config.get("hidden_size")
    total = 0.0
    for t in inv.dense_tensors:
        numel = math.prod(t.shape)
        if _named(t.name, EMBEDDING_NAMES) and numel:
            width = hidden if isinstance(hidden, int) and hidden > 0 and not numel % hidden \
                else min(t.shape)  # a row: hidden weights (vocab > hidden where unknown)
            total += min(t.length, tokens * t.length * width / numel)
        else:
            total += t.length
    return total


def estimate_steps(inv: Inventory, memory_bandwidth: float, batches: tuple[int, ...],
                   source: str, fit: StepFit = StepFit(), *, flops: float | None = None,
                   kv_bytes: int = 0) -> StepTimes:
    """The estimated step at each batch (see module docstring): `fit` for the card and
    backend, `flops` the card's (None: compute not counted), `kv_bytes` one sequence's KV
    cache at its context."""
    sizes = inv.expert_bytes().astype(float)
    experts, k = inv.experts_per_layer, inv.top_k
    per_token = dense_read_bytes(inv, 1) + float(sizes.mean(axis=1).sum() * k)
    points = []
    for b in batches:
        distinct = experts * (1.0 - (1.0 - k / experts) ** b)
        weights = dense_read_bytes(inv, b) + float((sizes.mean(axis=1) * distinct).sum())
        ms = step_ms(weights + b * kv_bytes, inv.num_layers, memory_bandwidth, fit, flops,
                     b * per_token)
        points.append((b, significant(ms)))
    kv = f" and {kv_bytes / 1e9:.3g} GB of KV cache" if kv_bytes else " (no KV cache counted)"
    return StepTimes(monotone(points), True,
                     f"estimated ({source}): {per_token / 1e9:.3g} GB of weights{kv} read per "
                     f"token at {fit.share:.3g} x {memory_bandwidth / 1e9:.0f} GB/s, plus "
                     f"{inv.num_layers} layers x {fit.layer_us:.3g} us ({fit.name}; the step "
                     f"may lie in {fit.spread[0]:.2f}-{fit.spread[1]:.2f} x it)",
                     step_spread=fit.spread)


def free_memory(device: str = "cpu") -> int:
    """Bytes free on the torch `device` (traces.options.available_memory: for cpu the host
    RAM available)."""
    return available_memory(device)


def fits(inv: Inventory, device: str) -> bool:
    """Whether the stand-in fits `device`'s free memory with a margin; first, a PlacerError
    where its config cannot describe one (check_config_sizes: before anything is said or
    built)."""
    check_config_sizes(inv.config)
    return standin_bytes(inv) <= MEMORY_MARGIN * free_memory(device)


def measure_steps(inv: Inventory, device: str, batches: tuple[int, ...],
                  context: int = DEFAULT_CONTEXT, steps: int = DEFAULT_STEPS,
                  seed: int = 0, device_label: str = "") -> StepTimes:
    """Time the stand-in's decode step at each batch on `device` (see module docstring);
    `device_label` names it with its model (placer.hardware.devices.device_name)."""
    import torch

    model, dtype = standin_model(inv.config, inv.top_k, device, seed, standin_bytes(inv))
    vocab = int(inv.config.get("vocab_size") or 32000)
    generator = torch.Generator().manual_seed(seed)
    points, spread, counts = [], [], []
    with torch.inference_mode():
        for b in batches:
            prompt = torch.randint(vocab, (b, context), generator=generator).to(device)
            out = prefill(model, prompt, inv.config)
            cache, token = out.cache, out.logits[:, -1:].argmax(-1)
            times: list[float] = []
            first = time.perf_counter()
            for i in range(WARMUP + MAX_STEPS):
                sync(device)
                start = time.perf_counter()
                out = model(input_ids=token, cache=cache, use_cache=True)
                sync(device)
                if i >= WARMUP:
                    times.append(time.perf_counter() - start)
                cache, token = out.cache, out.logits[:, -1:].argmax(-1)
                if len(times) >= steps and (relative_iqr(times) <= STEADY
                                            or time.perf_counter() - first > STEP_BUDGET_S):
                    break
            points.append((b, 1e3 * statistics.median(times)))
            spread.append((b, relative_iqr(times)))
            counts.append((b, len(times)))
    experts = standin_experts(inv.config, inv.top_k)
    ms = tuple((b, significant(max(t, 1e-6))) for b, t in sorted(points))
    name = device_label or device
    return StepTimes(monotone(ms), False,
                     f"measured on {name}: the model with {experts} resident expert"
                     f"{'s' if experts > 1 else ''} of its shape per MoE layer ({dtype}), a "
                     f"{context}-token prompt, median of "
                     f"{'/'.join(str(n) for _, n in counts)} decode steps",
                     spread=tuple(spread), steps=tuple(counts), device=name)


def prefill(model, prompt, config: dict):
    """The stand-in's forward over `prompt` (use_cache), a PlacerError where transformers
    cannot run it: a config whose sizes pass every check may still describe no model its
    code computes (a shape torch refuses), one line instead of torch's traceback."""
    try:
        return model(input_ids=prompt, use_cache=True)
    except (RuntimeError, ValueError, IndexError, TypeError) as exc:
        raise PlacerError(f"config.json: transformers cannot run model_type "
                          f"{config.get('model_type')!r} as configured "
                          f"({' '.join(str(exc).split())[:200]}); give --estimate with "
                          "--memory-bandwidth to estimate the step instead") from None


def relative_iqr(times: list[float]) -> float:
    """Interquartile range over median of `times` (0 for fewer than 2)."""
    if len(times) < 2:
        return 0.0
    q1, median, q3 = statistics.quantiles(times, n=4, method="inclusive")
    return (q3 - q1) / median if median > 0 else 0.0


def significant(ms: float) -> float:
    """`ms` to 4 significant digits: what a spec is worth writing (timings vary more)."""
    return float(f"{ms:.4g}")


def monotone(points: Iterable[tuple[int, float]]) -> tuple[tuple[int, float], ...]:
    """Step times never falling with the batch (a spec requires it; a fall is noise)."""
    out, top = [], 0.0
    for b, ms in points:
        top = max(top, ms)
        out.append((b, top))
    return tuple(out)


def standin_model(config: dict, top_k: int, device: str, seed: int, weights_bytes: int):
    """The stand-in (random weights, eval mode) on `device`, and its dtype's name; refused
    (PlacerError) where config.json describes a model of other sizes than its weights
    (`weights_bytes`: the stand-in's bytes from the checkpoint's own tensors)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    check_config_sizes(config)

    data = {k: v for k, v in config.items() if k not in ("quantization_config", "model_type")}
    dtype = data.get("torch_dtype") or data.get("dtype") or QUANTIZED_AS
    if "quantization_config" in config or dtype not in ("bfloat16", "float16", "float32"):
        dtype = QUANTIZED_AS
    experts = standin_experts(config, top_k)
    for key in EXPERT_COUNT_KEYS:
        if data.get(key):
            data[key] = experts
    try:
        hf = AutoConfig.for_model(config.get("model_type"), **data)
        with torch.device("meta"):  # sizes only: nothing allocated
            meta = AutoModelForCausalLM.from_config(hf, dtype=getattr(torch, dtype))
        described = sum(p.numel() * p.element_size() for p in meta.parameters())
        del meta
        widened = QUANTIZED_WIDENING if dtype != data.get("torch_dtype", dtype) or (
            "quantization_config" in config) else 1  # fp8 / mxfp4 weights run in bf16
        if described > CONFIG_SLACK * widened * weights_bytes + CONFIG_SLACK_BYTES:
            raise PlacerError(
                f"config.json: its sizes describe a stand-in of {described / 2**20:.0f} MiB "
                f"where the checkpoint's own tensors make {weights_bytes / 2**20:.0f} MiB: "
                "hidden_size, vocab_size, heads or layers disagree with the weights")
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(hf, dtype=getattr(torch, dtype))
    except (ValueError, KeyError, TypeError, ArithmeticError, AttributeError,
            IndexError, RuntimeError) as exc:
        raise PlacerError(f"config.json: transformers cannot build model_type "
                          f"{config.get('model_type')!r} to time it "
                          f"({' '.join(str(exc).split())[:200]}); give --estimate with "
                          "--memory-bandwidth to estimate the step instead") from None
    return model.to(device).eval(), dtype


CONFIG_SIZES = {  # config.json sizes the stand-in is built from: each a count in 1..bound
    "hidden_size": 1 << 17, "vocab_size": 1 << 22, "num_attention_heads": 1 << 12,
    "num_key_value_heads": 1 << 12, "num_hidden_layers": 1 << 12, "head_dim": 1 << 14,
    "intermediate_size": 1 << 20, "moe_intermediate_size": 1 << 20,
    # MLA (DeepSeek): each a width of the attention's projections when given
    "kv_lora_rank": 1 << 14, "q_lora_rank": 1 << 14, "qk_rope_head_dim": 1 << 14,
    "qk_nope_head_dim": 1 << 14, "v_head_dim": 1 << 14,
}


def check_config_sizes(config: dict) -> None:
    """PlacerError naming the field where a size the stand-in is built from is not a count
    in 1..its bound (0 heads divide by zero in transformers; 2**40 allocates before failing),
    or where the head counts cannot shape attention (config.check_heads: a forward would
    fail in torch, after the stand-in was built)."""
    for key, bound in CONFIG_SIZES.items():
        value = config.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= bound:
            raise PlacerError(f"config.json: {key}: expected an integer in 1..{bound}, got "
                              f"{value!r}")
    check_heads(config)


def sync(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize(torch.device(device))
