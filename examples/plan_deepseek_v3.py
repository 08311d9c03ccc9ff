"""Plan an 8 x RTX 5090 D box for DeepSeek-V3 from its config.json alone (no weights).

    python examples/plan_deepseek_v3.py --out ds3-out

1. placer inspect --config: the inventory a checkpoint of this config would have, with
   MXFP4 routed experts (58 MoE layers x 256 experts, 23.4 MB each);
2. a routing profile: production statistics would come from SGLang's expert distribution
   recorder (`placer traces import DUMP.pt`); this walk-through has no DeepSeek-V3 server, so
   it imports a SYNTHETIC count matrix (tests/synthetic.py: Zipf-like popularity per layer)
   the same way, and says so in its tag;
3. placer solve: greedy and ILP placements with half the expert bytes offloaded (323 GiB of
   MXFP4 experts do not fit in 8 x 32 GB beside the dense weights and KV), batch 1 and 8,
   with the predicted tokens/s beside layer offload and the no-profile baseline;
4. placer export llamacpp: the -ot arguments of the layer-offload baseline at this budget.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from walkthrough import HERE, fresh_dir, placer

CONFIG = HERE / "deepseek-v3" / "config.json"


def synthetic_counts(path: Path, tokens: int) -> Path:
    """[58, 256] selection counts of `tokens` synthetic DeepSeek-like tokens, as .npy."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from synthetic import deepseek_like  # tests/synthetic.py

    selected, _ = deepseek_like(58, 256, 8, num_tokens=tokens, num_seqs=tokens // 16, seed=0)
    counts = np.stack([np.bincount(selected[:, layer].ravel(), minlength=256)
                       for layer in range(selected.shape[1])])
    np.save(path, counts)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("ds3-out"))
    parser.add_argument("--time-limit", type=float, default=30.0, help="ILP seconds")
    args = parser.parse_args()
    out = fresh_dir(args.out)

    box = ["--config", CONFIG, "--expert-dtype", "mxfp4", "--hardware", "8x-rtx5090d-pcie5"]
    placer("inspect", "--config", CONFIG, "--expert-dtype", "mxfp4")
    counts = synthetic_counts(out / "synthetic-counts.npy", tokens=4096)
    placer("traces", "import", counts, "--out", out / "traces", "--top-k", 8,
           "--tag", "synthetic")
    plan = ["--traces", out / "traces", "--offload", 0.5, "--concurrency", "1,8"]
    placer("solve", *box, *plan, "--solver", "greedy", "--out", out / "plan-greedy.json")
    placer("solve", *box, *plan, "--solver", "ilp", "--time-limit", args.time_limit,
           "--out", out / "plan-ilp.json")
    placer("export", "llamacpp", out / "plan-ilp.json")
    print(f"\nplans in {out}/ (config-only: emit needs the real checkpoint)")


if __name__ == "__main__":
    main()
