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
  host sync, no copy; no target).

Every arm's last logits are checked equal to plain's. The exit status is 0 either way.
`--quick`: fewer steps (a smoke run, not figures to quote).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch
from placed_models import OVERHEAD_TARGET, build_model, place, time_arms

from placer.runtime.experts import StagedExperts
from placer.runtime.loader import load_placed
from placer.runtime.patch import load_staged_model

ALL_COLD = 4 * 32  # cache slots per card: room for every expert of the 4 layers


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
        models = arms(build_model(root, layers=4, experts=32, top_k=4, hidden=384), root)
        print("decode step, ms (median), one CPU thread; ratio to plain in the same run")
        for batch in (1, 8):
            ms = time_arms(models, batch, steps, repeats)
            for name, value in ms.items():
                ratio = value / ms["plain"]
                verdict = (f"  [{'PASS' if ratio <= OVERHEAD_TARGET else 'MISS'} <= "
                           f"{OVERHEAD_TARGET}]" if name == "tables" else "")
                print(f"B={batch:<2d} {name:16s} {value:8.2f} ms  {ratio:6.3f} x plain{verdict}",
                      flush=True)

if __name__ == "__main__":
    main()
