"""Cold experts on this machine's CPU against the `cpu` execution model's prediction.

    .venv/bin/python benchmarks/bench_cpu_experts.py [--quick] [--tokens 1,3,8,24,64] [--calls 40]

First probes this host as `placer probe --host` does: streaming-copy memory bandwidth and
torch bf16 matmul FLOP/s (the roofline the model falls back to), and, for each expert shape
below, the expert's time over n = 1, 2, 4, ..., 64 tokens, cold from RAM (the curve recorded
in the spec's `[[host.expert]]` and the model's prediction; placer/hardware/expert_probe.py).
Then it times real-size experts in bf16 with torch on all cores, as an engine runs a cold
expert for n tokens,

    g = x @ gate^T, u = x @ up^T, y = (silu(g) * u) @ down^T      x [n x hidden]

for two shapes, Qwen3-30B-A3B (hidden 2048, moe_intermediate 768: 9.4 MB an expert) and
gpt-oss-20b (2880 x 2880, 49.8 MB an expert in bf16 here; the real checkpoint is MXFP4, about
a quarter of the bytes), at the `--tokens` counts (3 and 24 lie between the probed points:
they check the curve's interpolation). The timed calls cycle over a pool of other experts
(another seed) than the probe's, more than 4 x the last-level cache, so weights come from RAM,
in `--calls` rounds of one call per count (as the probe times its points). The mean wall
time of each count's calls (the model's expected time; the median and the fastest call
beside it) is compared with

    solvers.cpu.Host.expert_seconds(bytes_e, flops_e, n)   (the probed curve)

as measured / predicted, target within 25% (PASS / MISS), and, for comparison, with the
roofline max(bytes_e / memory_bandwidth, n * flops_e / flops) the model used before. Each
shape says how much of the cores' time other processes took while it ran (/proc/stat):
figures measured beside a busy neighbour are not the machine's. The exit status is 0 either
way. `--quick`: fewer calls and a coarser probe (a smoke run, not figures to quote).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from placer.hardware.expert_probe import (
    DEFAULT_TOKENS,
    make_pool,
    pool_size,
    probe_expert,
    time_rounds,
)
from placer.hardware.probe import host_threads, last_level_cache_bytes, probe_host
from placer.hardware.timing import ExpertTiming
from solvers.cpu import ExpertCurve, Host, roofline_seconds

SHAPES = {  # name -> (hidden, inter)
    "qwen3-30b-a3b": (2048, 768),
    "gpt-oss-20b (bf16)": (2880, 2880),
}
DTYPE = "bfloat16"
TARGET = 0.25  # |measured / predicted - 1| at most this
BENCH_SEED = 7  # the timed pool is not the probe's


@dataclass(frozen=True)
class Row:
    shape: str
    tokens: int
    experts: int           # distinct experts the timed calls cycled over
    expert_bytes: int
    expert_flops: int      # per token: 2 x weight elements
    measured_s: float      # mean wall seconds of one expert call
    median_s: float        # their median
    best_s: float          # fastest of those calls
    predicted_s: float     # Host.expert_seconds from the probed curve
    roofline_s: float      # the roofline's prediction

    @property
    def ratio(self) -> float:
        return self.measured_s / self.predicted_s

    @property
    def roofline_ratio(self) -> float:
        return self.measured_s / self.roofline_s


def busy_seconds() -> tuple[float, float] | None:
    """(CPU seconds all processes have run, CPU seconds this one has run) so far, from
    /proc/stat; None where there is no /proc/stat (not Linux)."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    except OSError:
        return None
    user, nice, system, idle, iowait, irq, softirq, steal = (int(f) for f in fields[:8])
    own = os.times()
    return ((user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK"),
            own.user + own.system)


def others_share(before: tuple[float, float] | None, wall_s: float, cores: int) -> str:
    """How much of the cores' time other processes (or the hypervisor) took since `before`:
    on a shared host a busy neighbour stalls torch's threads at every barrier."""
    after = busy_seconds()
    if before is None or after is None:
        return "unknown"
    others = (after[0] - before[0]) - (after[1] - before[1])
    return f"{max(0.0, others) / (wall_s * cores):.0%}"


def measure(shape: str, timing: ExpertTiming, tokens: list[int], calls: int,
            memory_bandwidth: float, flops: float, cache_bytes: int) -> list[Row]:
    """Measured, predicted (curve) and roofline seconds of one expert shape at each count,
    timed in `calls` rounds of one call per count (as the probe times its points)."""
    hidden, inter = timing.hidden, timing.inter
    elements = 3 * hidden * inter
    expert_bytes = timing.expert_bytes
    host = Host(memory_bandwidth, flops, 0.0, 0.0, 1.0,
                curves=(ExpertCurve(expert_bytes, timing.tokens, timing.seconds),))
    pool = make_pool(hidden, inter, pool_size(expert_bytes, cache_bytes), DTYPE, BENCH_SEED)
    generator = torch.Generator().manual_seed(BENCH_SEED + 1)
    inputs = [torch.randn(n, hidden, generator=generator).to(getattr(torch, DTYPE))
              for n in tokens]
    return [Row(shape, n, len(pool), expert_bytes, 2 * elements, statistics.fmean(times),
                statistics.median(times), min(times),
                float(host.expert_seconds(expert_bytes, 2 * elements, n)),
                float(roofline_seconds(expert_bytes, 2 * elements, n, memory_bandwidth, flops)))
            for n, times in zip(tokens, time_rounds(pool, inputs, calls), strict=True)]


def print_row(row: Row) -> None:
    verdict = "PASS" if abs(row.ratio - 1) <= TARGET else "MISS"
    print(f"{row.shape:20s} n={row.tokens:<3d} measured {row.measured_s * 1e3:8.3f} ms  "
          f"predicted {row.predicted_s * 1e3:8.3f} ms (probed curve)  measured/predicted "
          f"{row.ratio:5.2f} [{verdict} within {TARGET:.0%}] (median "
          f"{row.median_s / row.predicted_s:5.2f}, best call {row.best_s / row.predicted_s:5.2f})"
          f"  roofline {row.roofline_s * 1e3:8.3f} ms, "
          f"measured/roofline {row.roofline_ratio:5.2f}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few calls: a smoke run")
    parser.add_argument("--tokens", default="1,3,8,24,64", help="token counts n per call")
    parser.add_argument("--calls", type=int, default=40, help="timed expert calls per row")
    args = parser.parse_args()
    tokens = [int(t) for t in args.tokens.split(",")]
    calls = 6 if args.quick else args.calls
    probe_tokens = (1, 8, 64) if args.quick else DEFAULT_TOKENS
    threads = host_threads()
    cache = last_level_cache_bytes()
    host = probe_host(DTYPE, experts=())
    print(f"host: {threads} threads, last-level cache {cache / 2**20:.0f} MiB; probed "
          f"memory_bandwidth {host.memory_bandwidth / 1e9:.2f} GB/s (copy of "
          f"{host.buffer_bytes / 2**20:.0f} MiB, bytes read + written), flops "
          f"{host.flops / 1e9:.1f} GFLOP/s (torch bf16 matmul {host.matmul[0]} x "
          f"{host.matmul[1]} @ {host.matmul[1]} x {host.matmul[2]})", flush=True)
    torch.set_num_threads(threads)
    for shape, (hidden, inter) in SHAPES.items():
        before, start = busy_seconds(), time.perf_counter()
        timing = probe_expert(hidden, inter, DTYPE, cache, threads, probe_tokens)
        rows = measure(shape, timing, tokens, calls, host.memory_bandwidth, host.flops, cache)
        busy = others_share(before, time.perf_counter() - start, threads)
        curve = ", ".join(f"{n}: {s * 1e3:.1f}" for n, s in zip(timing.tokens, timing.seconds,
                                                                strict=True))
        print(f"{shape}: hidden {hidden} x inter {inter}, bf16, {timing.expert_bytes / 1e6:.1f} "
              f"MB an expert, probed ms by tokens {{{curve}}}; {rows[0].experts} other experts "
              f"cycled, mean of {calls} calls; other processes took {busy} of the cores "
              "meanwhile (figures from a busy host are not to quote)", flush=True)
        for row in rows:
            print_row(row)


if __name__ == "__main__":
    main()
