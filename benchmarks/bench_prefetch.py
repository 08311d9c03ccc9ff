"""Prefetching from speculative routing, replayed over a trace: what the predictor gets right
and what the copy stream would buy (solvers/cache/prefetch.py).

    .venv/bin/python benchmarks/bench_prefetch.py [TRACE_DIR] [--slots N] [--copy-ms MS]
        [--window-ms MS] [--steps N]

TRACE_DIR: a trace directory collected by `placer collect --model` (it records
`spec_experts`); default: the held-out prose of the MoE trained here
(tests/data/trained-moe-traces/prose, its README says where it comes from; `code` and `chat`
beside it). A random-init router's routing says nothing about what prefetch buys a trained
model, so the bench no longer builds one.

Replays the decode rows (score mode records every token as decode), one token a step in
(sequence, position) order, one card, nothing pinned,
`--slots` cache slots; copies take `--copy-ms` each and a layer's window (the previous
layer's experts and this layer's attention) is `--window-ms`: both parameters, not
measurements. Prints per MoE layer the predictor's recall and precision (95% Wilson interval,
selections taken as independent: optimistic), then four lines: LRU and Belady's MIN, each
without and with prefetch (MIN without prefetch is the bound on any reactive cache's misses).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from solvers.cache.prefetch import Link, Prefetch, quality, replay
from traces.errors import TraceError
from traces.storing.dataset import open_traces
from traces.storing.speculative import speculative_steps

REPO = Path(__file__).resolve().parent.parent
TRAINED = REPO / "tests" / "data" / "trained-moe-traces" / "prose"


def load(trace_dir: Path, steps: int) -> tuple[np.ndarray, np.ndarray, list[int], int]:
    """(actual, predicted) [S, L, k] of the first `steps` decode tokens, the MoE layers, E."""
    actual, predicted = speculative_steps(trace_dir, steps)
    model = open_traces(trace_dir).model
    return actual, predicted, model["moe_layers"], model["experts_per_layer"]


def interval(figure: tuple[float, float, float] | None) -> str:
    return "-" if figure is None else f"{figure[0]:.3f} [{figure[1]:.3f}, {figure[2]:.3f}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace", nargs="?", type=Path, default=TRAINED)
    parser.add_argument("--slots", type=int, default=None,
                        help="cache slots (default: a quarter of all experts)")
    parser.add_argument("--copy-ms", type=float, default=1.0)
    parser.add_argument("--window-ms", type=float, default=2.0)
    parser.add_argument("--steps", type=int, default=5000)
    args = parser.parse_args()
    try:
        actual, predicted, layers, experts = load(args.trace, args.steps)
    except TraceError as exc:
        sys.exit(f"error: {exc}")
    print(f"{args.trace}:")
    slots = args.slots if args.slots is not None else len(layers) * experts // 4
    print(f"{len(actual)} decode tokens x {len(layers)} MoE layers x top-{actual.shape[2]} "
          f"of {experts} experts; {slots} slots; copy {args.copy_ms} ms, window "
          f"{args.window_ms} ms (parameters)")
    q = quality(actual, predicted)
    print("layer  recall (95% Wilson)           precision (95% Wilson)")
    for layer, rec, prec in zip(layers, q.recall(), q.precision(), strict=True):
        print(f"{layer:>5}  {interval(rec):<30} {interval(prec)}")
    link = Link(copy_s=args.copy_ms / 1e3, window_s=args.window_ms / 1e3)
    print("line                    misses  prefetched  useful  late  wasted  stall ms/token")
    for eviction in ("lru", "min"):
        for name, guess in (("without prefetch", None), ("with prefetch", predicted)):
            c = replay(actual, guess, slots, link, Prefetch(), num_experts=experts,
                       eviction=eviction)
            print(f"{eviction + ' ' + name:<22} {c.misses:>7} {c.prefetched:>11} {c.useful:>7} "
                  f"{c.late:>5} {c.wasted:>7}  {c.stall_s * 1e3 / len(actual):>10.3f}")
    print("stall: the replay's model (one copy per miss, prefetches overlapping the window), "
          "exact for these parameters; min with prefetch is MIN's eviction for this "
          "predictor, not a proven bound")


if __name__ == "__main__":
    main()
