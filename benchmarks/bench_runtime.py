"""The staging runtime's decode step against plain transformers', in the same run.

    .venv/bin/python benchmarks/bench_runtime.py [--quick] [--steps 24] [--repeats 3]

Builds a qwen3_moe checkpoint (4 layers x 32 experts, top-4, hidden 384, fp32, skewed
routers), places it twice (every expert resident; one expert in four cold) and times greedy
decode steps at B = 1 and 8 (16-token random prompts, `--steps` steps after 4 dropped, the
arms interleaved `--repeats` times, medians), on one CPU thread:

- plain: transformers' own model;
- tables: the runtime with every expert resident (each layer runs the original forward on
  its table: target <= 1.10 x plain);
- compact: the same placement through the path every forward took before the tables (the
  selected experts' rows rebuilt at each forward), for comparison;
- 25% cold: the runtime with one expert in four cold (staging copies included; no target);
- 25% cold, cached: the same placement with cache slots for every cold expert, warm after the
  prompt: every cold expert a hit, computed on its slot's table row (what a hit costs: the
  host sync, no copy; no target);
- 25% cold, 2 slots, POLICY: the same placement with 2 slots per layer (of 8 cold experts),
  so that misses evict, under each cache policy (`solvers.cache.POLICIES`; learned with
  some fixed weights, classlru and learned on the token clock; pooled lru: one pool of the 8
  slots): each policy's per-step overhead is its step against lru's.

Beside the decode steps, each policy's `CachePolicy.lookup` alone (the per-fetch call the
runtime makes per layer and card): microseconds per call, median over a replayed decode of
the same 2-slot caches (no target).

Every arm's last logits are checked equal to plain's. The exit status is 0 either way.
`--quick`: fewer steps (a smoke run, not figures to quote).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from placed_models import OVERHEAD_TARGET, build_model, place, time_arms

from placer.runtime.experts import StagedExperts
from placer.runtime.loader import load_placed
from placer.runtime.patch import load_staged_model

ALL_COLD = 4 * 32  # cache slots per card: room for every expert of the 4 layers
LAYERS, EXPERTS = 4, 32
FEW = 2  # cache slots per layer of the policy arms (8 experts of each layer are cold)
LEARNED = {"weights": [-0.05, 2.0, 1.0, -0.5, 3.0, 1.5, 0.0],  # fixed, not fitted: its cost
           "calibration": (np.arange(LAYERS * EXPERTS).reshape(LAYERS, EXPERTS) % 7 / 7),
           "transition": (np.arange(LAYERS * EXPERTS * EXPERTS).reshape(
               LAYERS, EXPERTS, EXPERTS) % 11 / 11)}


def policy_arms(model: Path, root: Path) -> dict[str, torch.nn.Module]:
    """The 25%-cold placement with FEW slots per layer under each policy (and pooled lru)."""
    from solvers.cache import POLICIES

    out = {}
    for name, pooled in [(p, False) for p in sorted(POLICIES)] + [("lru", True)]:
        params = {"pooled": pooled, "weights": None, "calibration": None}
        if name == "learned":
            params |= {"weights": LEARNED["weights"],
                       "calibration": LEARNED["calibration"].tolist(),
                       "transition": LEARNED["transition"].tolist()}
        label = f"25% cold, {FEW} slots, {name}{' pooled' if pooled else ''}"
        out[label] = load_staged_model(model, load_placed(place(
            model, root / label.replace(" ", "_").replace(",", "").replace("%", ""), every=4,
            layer_slots=FEW, cache_policy=name, cache_params=params)))
    return out


def lookup_us(steps: int = 2000, seed: int = 0) -> dict[str, float]:
    """Median microseconds of one `lookup` (a layer's fetch of 1-4 cold experts) per policy,
    FEW slots per layer, over `steps` decode steps of skewed random routing."""
    from solvers.cache import POLICIES, even_quotas, make_policy

    rng = np.random.default_rng(seed)
    cold = np.sort(rng.choice(EXPERTS, 8, replace=False))
    fetches = [np.unique(rng.choice(cold, 4, p=np.arange(8, 0, -1) / 36)).tolist()
               for _ in range(steps * LAYERS)]
    out = {}
    for name in sorted(POLICIES):
        options = LEARNED if name == "learned" else {}
        cache = make_policy(name, even_quotas([FEW * LAYERS], LAYERS), LAYERS * EXPERTS,
                            **options)
        times = []
        for i, keys in enumerate(fetches):
            layer = i % LAYERS
            start = time.perf_counter()
            cache.lookup(0, [layer * EXPERTS + k for k in keys], i // LAYERS + 1)
            times.append(time.perf_counter() - start)
        out[name] = statistics.median(times) * 1e6
    return out


def arms(model: Path, root: Path) -> dict[str, torch.nn.Module]:
    from transformers import AutoModelForCausalLM

    resident, mixed = place(model, root / "resident"), place(model, root / "mixed", every=4)
    out = {"plain": AutoModelForCausalLM.from_pretrained(model).eval(),
           "tables": load_staged_model(model, load_placed(resident)),
           "compact": load_staged_model(model, load_placed(resident)),
           "25% cold": load_staged_model(model, load_placed(mixed)),
           "25% cold, cached": load_staged_model(model, load_placed(mixed, cache_slots=ALL_COLD))}
    for module in out["compact"].modules():
        if isinstance(module, StagedExperts):
            module.table = None  # the path every forward took before the tables
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer steps: a smoke run")
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    steps, repeats = (6, 1) if args.quick else (args.steps, args.repeats)
    torch.set_num_threads(1)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        checkpoint = build_model(root, layers=LAYERS, experts=EXPERTS, top_k=4, hidden=384)
        models = arms(checkpoint, root) | policy_arms(checkpoint, root)
        print("decode step, ms (median), one CPU thread; ratio to plain in the same run")
        for batch in (1, 8):
            ms = time_arms(models, batch, steps, repeats)
            for name, value in ms.items():
                ratio = value / ms["plain"]
                verdict = (f"  [{'PASS' if ratio <= OVERHEAD_TARGET else 'MISS'} <= "
                           f"{OVERHEAD_TARGET}]" if name == "tables" else "")
                policy = (f"  {value / ms[f'25% cold, {FEW} slots, lru']:6.3f} x lru's"
                          if f"{FEW} slots" in name else "")
                print(f"B={batch:<2d} {name:31s} {value:8.2f} ms  {ratio:6.3f} x plain"
                      f"{verdict}{policy}", flush=True)
    print(f"lookup of one layer's fetch, {FEW} slots per layer, median of "
          f"{2000 * LAYERS} calls:")
    for name, us in lookup_us().items():
        print(f"  {name:9s} {us:6.1f} us", flush=True)

if __name__ == "__main__":
    main()
