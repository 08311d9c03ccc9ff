"""Staging bandwidth of the reference runtime on a CUDA host.

    .venv/bin/python benchmarks/bench_gpu.py [--mb 8,22,44] [--experts 8] [--repeats 20]

For cold parts of each size (MB), a fetch of `--experts` of them through one card's
`CardStager` (side stream, events, pinned host memory) is timed against a plain pinned
host-to-device `copy_(non_blocking=True)` (cudaMemcpyAsync) of the same bytes on one stream,
in the same run, medians of `--repeats`: the ratio of bandwidths (target >= 0.9). The
per-fetch overhead is the wall time of a fetch whose experts are all cached (no copies).
Without CUDA it says so and exits 0.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from placer.runtime.counters import StagingCounters
from placer.runtime.staging import CardStager


def median_seconds(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", default="8,22,44", help="cold part sizes in MB")
    parser.add_argument("--experts", type=int, default=8, help="experts per fetch")
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("skipped: no CUDA device (torch.cuda.is_available() is False)")
        return
    device = torch.device("cuda:0")
    print(f"GPU: {torch.cuda.get_device_name(device)}")
    for mb in (int(x) for x in args.mb.split(",")):
        n = mb * 1_000_000
        host = [torch.randint(0, 255, (n,), dtype=torch.uint8).pin_memory()
                for _ in range(args.experts)]
        dst = torch.empty((args.experts, n), dtype=torch.uint8, device=device)
        stream = torch.cuda.Stream(device)

        def plain() -> None:
            with torch.cuda.stream(stream):
                for i, h in enumerate(host):
                    dst[i].copy_(h, non_blocking=True)

        counters = StagingCounters((0,), 1)
        stager = CardStager(0, device, staging_bytes=args.experts * (n + 256), slot_bytes=n,
                            cache_slots=0, counters=counters)
        keys = list(range(args.experts))
        views = stager.stage(0, keys, host)  # warm-up
        plain()
        assert all(torch.equal(v.cpu(), h) for v, h in zip(views, host, strict=True))
        t_plain = median_seconds(plain, args.repeats)
        t_stage = median_seconds(lambda: stager.stage(0, keys, host), args.repeats)
        total = args.experts * n
        ratio = t_plain / t_stage
        print(f"{args.experts} x {mb} MB: plain cudaMemcpyAsync {total / t_plain / 1e9:.2f} GB/s, "
              f"runtime staging {total / t_stage / 1e9:.2f} GB/s = {ratio:.3f} x plain "
              f"[{'PASS' if ratio >= 0.9 else 'MISS'} >= 0.9]")
    cached = CardStager(0, device, staging_bytes=1 << 20, slot_bytes=1 << 20,
                        cache_slots=args.experts, counters=StagingCounters((0,), 1))
    small = [torch.zeros(1 << 20, dtype=torch.uint8).pin_memory() for _ in range(args.experts)]
    keys = list(range(args.experts))
    cached.stage(0, keys, small)  # fills the cache; later fetches are all hits
    t_hit = median_seconds(lambda: cached.stage(0, keys, small), args.repeats)
    print(f"per-fetch overhead (all {args.experts} experts cached, no copies): "
          f"{t_hit * 1e6:.1f} us")


if __name__ == "__main__":
    main()
