"""Prefetching from speculative routing, replayed over a trace: what the predictor gets right
and what the copy stream would buy (solvers/cache/prefetch.py).

    .venv/bin/python benchmarks/bench_prefetch.py [TRACE_DIR] [--slots N] [--copy-ms MS]
        [--window-ms MS] [--steps N]

TRACE_DIR: a trace directory collected by `placer collect --model` (it records
`spec_experts`). Without one, a tiny random-init qwen3_moe checkpoint is built and collected
over ../shared/data's Shakespeare (the bundled slice where ../shared is absent): that
exercises the code and measures nothing - a random router's routing says nothing about what
prefetch buys a trained model (issue #54 item 5 trains one).

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
import tempfile
from pathlib import Path

import numpy as np

from solvers.cache.prefetch import Link, Prefetch, quality, replay
from traces.errors import TraceError
from traces.storing.dataset import open_traces
from traces.storing.speculative import speculative_steps

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared" / "data" / "shakespeare.txt"
PROSE = SHARED if SHARED.exists() else REPO / "examples" / "data" / "shakespeare_head.txt"


def load(trace_dir: Path, steps: int) -> tuple[np.ndarray, np.ndarray, list[int], int]:
    """(actual, predicted) [S, L, k] of the first `steps` decode tokens, the MoE layers, E."""
    actual, predicted = speculative_steps(trace_dir, steps)
    model = open_traces(trace_dir).model
    return actual, predicted, model["moe_layers"], model["experts_per_layer"]


def tiny_trace(root: Path) -> Path:
    """A trace of a tiny random-init qwen3_moe (4 layers, 16 experts, top-2) over prose."""
    from typer.testing import CliRunner

    from placer.checkpoint.tiny import build_tiny_model
    from placer.cli import app

    texts = [b for b in PROSE.read_text().split("\n\n") if b.strip()]
    model = build_tiny_model("qwen3_moe", root / "model", texts=texts[:600], layers=4,
                             experts=16, router_scale=3.0)
    corpus = root / "prose.txt"
    corpus.write_text("\n\n".join(texts[600:700]))
    result = CliRunner().invoke(app, ["collect", "--model", str(model), "--corpus", str(corpus),
                                      "--max-length", "64", "--out", str(root / "trace"),
                                      "--no-progress"])
    if result.exit_code:
        sys.exit(result.output)
    return root / "trace"


def interval(figure: tuple[float, float, float] | None) -> str:
    return "-" if figure is None else f"{figure[0]:.3f} [{figure[1]:.3f}, {figure[2]:.3f}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace", nargs="?", type=Path)
    parser.add_argument("--slots", type=int, default=None,
                        help="cache slots (default: a quarter of all experts)")
    parser.add_argument("--copy-ms", type=float, default=1.0)
    parser.add_argument("--window-ms", type=float, default=2.0)
    parser.add_argument("--steps", type=int, default=5000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        trace = args.trace or tiny_trace(Path(tmp))
        try:
            actual, predicted, layers, experts = load(trace, args.steps)
        except TraceError as exc:
            sys.exit(f"error: {exc}")
    if args.trace is None:
        print("tiny random-init model: these figures test the code, they measure nothing")
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
