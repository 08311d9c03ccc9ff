"""Trace collection and aggregation speed.

    .venv/bin/python benchmarks/bench_traces.py [--rows 10000000] [--repeats 15]

Prints:
1. the forward-pass time of a tiny qwen3_moe model (hidden 256, 8 layers, 32 experts, top-4,
   batch 8 x 256 tokens) with the router-capture hooks (including converting the captured
   selections to numpy after each pass) over the time without them, both measured in the
   same run, interleaved, medians of `--repeats` (target < 1.05x);
2. trace write and read throughput in selections per second (TraceWriter; pyarrow.dataset);
3. the time (and the peak memory of the process doing it) to aggregate a `--rows`-row
   synthetic trace (60 MoE layers x 256 experts, top-8, DeepSeek-V3-shaped) into a Profile,
   and to sample 1000 steps of batch 8 from it.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
TEXT = REPO / "examples" / "data" / "shakespeare_head.txt"


def bench_hooks(root: Path, repeats: int) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from placer.checkpoint.tiny import build_tiny_model
    from traces.collecting.capture import RouterCapture

    texts = [b for b in TEXT.read_text().split("\n\n") if b.strip()]
    model_dir = build_tiny_model("qwen3_moe", root / "model", texts=texts, layers=8,
                                 experts=32, top_k=4, hidden=256, vocab=512)
    model = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True).eval()
    ids = torch.randint(4, 512, (8, 256), generator=torch.Generator().manual_seed(0))
    capture = RouterCapture(model)

    def plain() -> None:
        model(input_ids=ids, use_cache=False)

    def hooked() -> None:
        with capture:
            model(input_ids=ids, use_cache=False)
        capture.take()

    times: dict[str, list[float]] = {"plain": [], "hooked": []}
    with torch.inference_mode():
        for fn in (plain, hooked, plain, hooked):  # warm-up
            fn()
        for _ in range(repeats):
            for name, fn in (("plain", plain), ("hooked", hooked)):
                start = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - start)
    plain_s, hooked_s = statistics.median(times["plain"]), statistics.median(times["hooked"])
    print(f"forward, qwen3_moe hidden 256 x 8 layers x 32 experts top-4, batch 8 x 256 tokens, "
          f"median of {repeats}:")
    print(f"  without hooks {plain_s * 1e3:8.1f} ms   with hooks {hooked_s * 1e3:8.1f} ms   "
          f"ratio {hooked_s / plain_s:.3f}x (target < 1.05x)")


def write_synthetic(path: Path, rows: int, *, layers: int = 60, experts: int = 256,
                    top_k: int = 8, seq_len: int = 512, seed: int = 0) -> float:
    """Write `rows` (token, layer) rows with skewed (Zipf-like) routing; returns the seconds
    spent in TraceWriter (generating the synthetic selections is not counted)."""
    from traces.storing.writer import TraceWriter

    rng = np.random.default_rng(seed)
    moe_layers = np.arange(3, 3 + layers, dtype=np.int16)
    meta = {"kind": "tokens", "fingerprint": "bench", "num_layers": 3 + layers,
            "moe_layers": moe_layers.tolist(), "experts_per_layer": experts, "top_k": top_k,
            "tag": "synthetic", "run_id": 1}
    popularity = np.log(1.0 / np.arange(1, experts + 1) ** 0.8)
    keys = popularity + rng.gumbel(size=(1 << 14, experts))
    pool = np.argpartition(-keys, top_k - 1, axis=1)[:, :top_k].astype(np.int16)
    tokens_total = rows // layers
    chunk_tokens = max(1, (1 << 20) // layers)
    seconds = 0.0
    writer = TraceWriter(path, tag="synthetic", top_k=top_k, meta=meta)
    for first in range(0, tokens_total, chunk_tokens):
        n = min(chunk_tokens, tokens_total - first)
        token_index = np.arange(first, first + n)
        picks = pool[rng.integers(0, len(pool), n * layers)]
        seq = np.repeat((1 << 32) + token_index // seq_len, layers)
        pos = np.repeat(token_index % seq_len, layers)
        weights = rng.random((n * layers, top_k), dtype=np.float32)
        start = time.perf_counter()
        writer.write(seq, pos, np.zeros(n * layers, np.int32), np.ones(n * layers, np.int32),
                     np.tile(moe_layers, n), picks, weights)
        seconds += time.perf_counter() - start
    start = time.perf_counter()
    writer.close()
    return seconds + time.perf_counter() - start


def bench_io(root: Path) -> None:
    import pyarrow.dataset as ds

    rows, top_k = 2_000_000, 8
    path = root / "io" / "synthetic-00000001.parquet"
    path.parent.mkdir()
    seconds = write_synthetic(path, rows, top_k=top_k)
    selections = rows // 60 * 60 * top_k
    start = time.perf_counter()
    read = 0
    for batch in ds.dataset(path).to_batches(columns=["seq_id", "pos", "layer", "experts"]):
        read += len(batch.column("experts").flatten().to_numpy())
    read_s = time.perf_counter() - start
    print(f"trace I/O, {rows:,} rows x top-{top_k} ({path.stat().st_size / 2**20:.0f} MiB):")
    print(f"  write {selections / seconds / 1e6:6.1f} M selections/s   "
          f"read {read / read_s / 1e6:6.1f} M selections/s")


def _peak_rss_mib() -> float:
    """This process's peak resident memory. VmHWM, not ru_maxrss: ru_maxrss survives exec,
    so a child started from a large parent would report the parent's peak."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def aggregate_child(trace_dir: Path) -> None:
    """Run in a child process: time load_profile and sample_steps, report peak RSS."""
    from traces.storing.profile import load_profile, sample_steps

    start = time.perf_counter()
    profile = load_profile(trace_dir)
    load_s = time.perf_counter() - start
    start = time.perf_counter()
    steps = sample_steps(trace_dir, batch=8, num_steps=1000, seed=0)
    sample_s = time.perf_counter() - start
    peak_mib = _peak_rss_mib()
    print(json.dumps({"load_s": load_s, "sample_s": sample_s, "peak_mib": peak_mib,
                      "tokens": profile.tokens, "steps": list(steps.shape)}))


def bench_aggregate(root: Path, rows: int) -> None:
    trace_dir = root / "big"
    trace_dir.mkdir()
    path = trace_dir / "synthetic-00000001.parquet"
    write_s = write_synthetic(path, rows)
    result = subprocess.run([sys.executable, __file__, "--aggregate-child", str(trace_dir)],
                            check=True, capture_output=True, text=True)
    child = json.loads(result.stdout.strip().splitlines()[-1])
    print(f"aggregate a {rows:,}-row trace (60 MoE layers x 256 experts, top-8, "
          f"{path.stat().st_size / 2**20:.0f} MiB, written in {write_s:.1f} s):")
    print(f"  load_profile {child['load_s']:6.2f} s ({rows / child['load_s'] / 1e6:.1f} M rows/s,"
          f" {child['tokens']:,} tokens)   sample_steps(batch 8, 1000 steps) "
          f"{child['sample_s']:6.2f} s   peak RSS of that process {child['peak_mib']:.0f} MiB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--aggregate-child", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.aggregate_child:
        aggregate_child(args.aggregate_child)
        return
    with tempfile.TemporaryDirectory(prefix="bench-traces-") as tmp:
        root = Path(tmp)
        bench_hooks(root, args.repeats)
        bench_io(root)
        bench_aggregate(root, args.rows)


if __name__ == "__main__":
    main()
