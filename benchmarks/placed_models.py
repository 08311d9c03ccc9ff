"""What the runtime benchmarks share (not a benchmark itself): a tiny real checkpoint, a
placement of it with a chosen share of experts cold, and timed decode steps.

bench_runtime.py and bench_gpu.py import it as a sibling module (`python benchmarks/X.py`
puts benchmarks/ on sys.path).
"""

from __future__ import annotations

import statistics
import time
import warnings
from pathlib import Path

import numpy as np
import torch

from placer.checkpoint.inventory import read_inventory
from placer.checkpoint.tiny import build_tiny_model
from placer.hardware.spec import HardwareSpec, parse_spec
from placer.placed.emit import emit_placement
from placer.plan.placement import build_plan

PROSE = Path(__file__).resolve().parent.parent / "examples" / "data" / "shakespeare_head.txt"


def texts() -> list[str]:
    """Real prose blocks (the tokenizer's training text and the benchmarks' prompts)."""
    return [b for b in PROSE.read_text().split("\n\n") if b.strip()]


def build_model(root: Path, *, layers: int, experts: int, top_k: int, hidden: int,
                vocab: int = 2048, dtype: str = "float32", router_scale: float = 4.0) -> Path:
    """A qwen3_moe checkpoint under `root` (skewed routers, as trained ones are)."""
    return build_tiny_model("qwen3_moe", root / "model", texts=texts()[:400], layers=layers,
                            experts=experts, top_k=top_k, hidden=hidden, vocab=vocab,
                            dtype=dtype, router_scale=router_scale)


def one_card(bandwidth: str = "50GB/s", base_step_ms: dict[str, float] | None = None
             ) -> HardwareSpec:
    """A one-card box with VRAM to spare (the budget is the plan's, not the card's)."""
    return parse_spec({"name": "bench", "host_ram": "1TiB", "cards": 1,
                       "card": {"model": "bench", "vram": "1TiB", "h2d_bandwidth": bandwidth,
                                "latency_us": 5.0},
                       "decode": {"base_step_ms": base_step_ms or {"1": 10.0}}})


def place(model: Path, out: Path, every: int = 0, seed: int = 0, layer_slots: int = 0,
          cache_policy: str | None = None, cache_params: dict | None = None) -> Path:
    """Emit a placement of `model` into `out`: every expert resident (`every` = 0), or one
    expert in `every` cold, drawn at random per layer; whole experts on one card; with
    `layer_slots` cache slots per layer under `cache_policy` (and its `cache_params`)."""
    inv = read_inventory(model)
    sizes = inv.expert_bytes()
    layers, experts = sizes.shape
    resident = np.ones((layers, experts), dtype=int)
    if every:
        rng = np.random.default_rng(seed)
        for row in resident:
            row[rng.choice(experts, experts // every, replace=False)] = 0
    staging = int(sizes.max()) * min(experts, 8 * inv.top_k) if every else 0
    quotas = np.full((1, layers), layer_slots) if layer_slots else None
    plan = build_plan(inv, one_card(), home=np.zeros((layers, experts), dtype=int),
                      resident_pages=resident, page_size=None,
                      budget_bytes=np.array([int(sizes.sum()) + staging
                                             + layers * layer_slots * int(sizes.max())]),
                      staging_bytes=np.array([staging]),
                      budget={"mode": "budget", "value": None, "concurrency": [1, 8]},
                      ep="contiguous", solver={"name": "bench"}, quotas=quotas,
                      cache_policy=cache_policy, cache_params=cache_params)
    emit_placement(plan, model, out)
    return out


@torch.no_grad()
def decode_steps(model: torch.nn.Module, batch: int, steps: int, prompt_len: int = 16,
                 warmup: int = 4, seed: int = 0) -> tuple[list[float], torch.Tensor]:
    """Seconds of each of `steps` greedy decode steps of `batch` random prompts (the first
    `warmup` dropped), and the logits of the last step (to check arms agree)."""
    from transformers import DynamicCache

    warnings.filterwarnings("ignore", category=FutureWarning)  # past_key_values: 5.x renames it
    device = next(model.parameters()).device
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, model.config.vocab_size, (batch, prompt_len), generator=gen)
    out = model(input_ids=ids.to(device), past_key_values=DynamicCache(config=model.config),
                use_cache=True)
    times = []
    for _ in range(warmup + steps):
        token = out.logits[:, -1:].argmax(-1)
        sync(device)
        start = time.perf_counter()
        out = model(input_ids=token, past_key_values=out.past_key_values, use_cache=True)
        sync(device)
        times.append(time.perf_counter() - start)
    return times[warmup:], out.logits


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_ms(times: list[float]) -> float:
    return statistics.median(times) * 1e3


OVERHEAD_TARGET = 1.10  # the all-resident runtime's decode step over plain transformers'


def time_arms(models: dict[str, torch.nn.Module], batch: int, steps: int, repeats: int
              ) -> dict[str, float]:
    """Median decode step (ms) of each arm at `batch`, the arms interleaved `repeats` times;
    every arm's last logits must equal the "plain" arm's."""
    times: dict[str, list[float]] = {name: [] for name in models}
    for _ in range(repeats):
        logits = {}
        for name, model in models.items():
            measured, logits[name] = decode_steps(model.eval(), batch, steps)
            times[name] += measured
        for name in models:
            assert torch.equal(logits[name], logits["plain"]), f"{name}'s logits differ"
    return {name: median_ms(t) for name, t in times.items()}
