"""Cold experts on this machine's CPU against the `cpu` execution model's roofline.

    .venv/bin/python benchmarks/bench_cpu_experts.py [--quick] [--tokens 1,8,64] [--calls 40]

First probes this host as `placer probe --host` does (streaming-copy memory bandwidth, torch
bf16 matmul FLOP/s, all cores), then runs real-size experts in bf16 with torch on all cores,
as an engine runs a cold expert for n tokens:

    g = x @ gate^T, u = x @ up^T, y = (silu(g) * u) @ down^T      x [n x hidden]
    gate, up [inter x hidden], down [hidden x inter]

for two shapes: Qwen3-30B-A3B (hidden 2048, moe_intermediate 768: 9.4 MB an expert) and
gpt-oss-20b (2880 x 2880, 49.8 MB an expert in bf16 here; the real checkpoint is MXFP4,
about a quarter of the bytes), at n = 1, 8 and 64. Each timed call runs the next expert of a
pool that holds more than 4 x the last-level cache, so its weights come from RAM, not cache.
The median wall time of `--calls` calls (the fastest call's beside it: on a shared host the
median carries the neighbours' load) is compared with the prediction

    solvers.cpu.expert_seconds(bytes_e, flops_e, n, memory_bandwidth, flops)
        = max(bytes_e / memory_bandwidth, n * flops_e / flops),  flops_e = 2 x weights

with the figures probed in the same run: measured / predicted, target within 25%
(PASS / MISS). For diagnosis each row also gives the bound the roofline picks, the expert's
effective bandwidth (bytes_e / measured) and FLOP/s, and measured over the additive model
bytes_e / memory_bandwidth + the expert's three matmuls timed with their weights in cache
("hot kernels": the kernels' own cost at this n, streaming and compute not overlapped).
Each shape says how much of the cores' time other processes took while it ran (/proc/stat):
figures measured beside a busy neighbour are not the machine's. The exit status is 0 either
way. `--quick`: fewer calls (a smoke run, not figures to quote).
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from placer.hardware.probe import host_threads, last_level_cache_bytes, probe_host
from solvers.cpu import expert_seconds

SHAPES = {  # name -> (hidden, inter)
    "qwen3-30b-a3b": (2048, 768),
    "gpt-oss-20b (bf16)": (2880, 2880),
}
DTYPE = torch.bfloat16
TARGET = 0.25  # |measured / predicted - 1| at most this

Expert = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # gate, up [inter x hidden]; down


@dataclass(frozen=True)
class Row:
    shape: str
    tokens: int
    experts: int           # distinct experts the timed calls cycled over
    expert_bytes: int
    expert_flops: int      # per token: 2 x weight elements
    measured_s: float      # median wall seconds of one expert call
    best_s: float          # fastest of those calls
    memory_s: float        # expert_bytes / memory_bandwidth
    compute_s: float       # tokens * expert_flops / flops
    predicted_s: float     # solvers.cpu.expert_seconds: max of the two
    hot_s: float           # the expert's three matmuls with their weights in cache

    @property
    def ratio(self) -> float:
        return self.measured_s / self.predicted_s

    @property
    def streaming_plus_kernels_ratio(self) -> float:
        """Measured over memory_s + hot_s: streaming the weights and the kernels' own cost
        added, as if neither overlaps the other."""
        return self.measured_s / (self.memory_s + self.hot_s)


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


def pool_size(expert_bytes: int, cache_bytes: int) -> int:
    """Experts to cycle over so that the pool holds more than 4 x `cache_bytes` (at least 4):
    an expert is evicted from the last-level cache before its turn comes again."""
    return max(4, math.floor(4 * cache_bytes / expert_bytes) + 1)


def make_pool(hidden: int, inter: int, count: int, seed: int = 0) -> list[Expert]:
    """`count` distinct random bf16 experts, each page written (so resident in RAM)."""
    generator = torch.Generator().manual_seed(seed)

    def weight(rows: int, cols: int) -> torch.Tensor:
        return (torch.randn(rows, cols, generator=generator) / math.sqrt(cols)).to(DTYPE)

    return [(weight(inter, hidden), weight(inter, hidden), weight(hidden, inter))
            for _ in range(count)]


def run_expert(x: torch.Tensor, expert: Expert) -> torch.Tensor:
    """One expert's output for x [n x hidden]: (silu(x @ gate^T) * (x @ up^T)) @ down^T."""
    gate, up, down = expert
    return F.linear(F.silu(F.linear(x, gate)) * F.linear(x, up), down)


def time_expert(pool: list[Expert], x: torch.Tensor, calls: int) -> list[float]:
    """Wall seconds of each of `calls` expert calls, each on the next expert of `pool` (one
    untimed pass over the pool first: page faults and kernel set-up are not timed)."""
    for expert in pool:
        run_expert(x, expert)
    times = []
    for call in range(calls):
        expert = pool[call % len(pool)]
        start = time.perf_counter()
        run_expert(x, expert)
        times.append(time.perf_counter() - start)
    return times


def hot_seconds(expert: Expert, x: torch.Tensor, calls: int) -> float:
    """Seconds of the expert's three matmuls with their weights in cache: each matmul repeated
    `calls` times on its own weight matrix (the first, untimed, loads it), medians summed. The
    kernels' own cost with no DRAM traffic, where one weight matrix fits the last-level
    cache."""
    gate, up, down = expert
    total = 0.0
    for weight, inputs in ((gate, x), (up, x), (down, F.linear(x, gate))):
        F.linear(inputs, weight)
        times = []
        for _ in range(calls):
            start = time.perf_counter()
            F.linear(inputs, weight)
            times.append(time.perf_counter() - start)
        total += statistics.median(times)
    return total


def measure(shape: str, hidden: int, inter: int, tokens: list[int], calls: int,
            memory_bandwidth: float, flops: float, cache_bytes: int) -> list[Row]:
    """Measured and predicted seconds of one expert shape at each token count."""
    elements = 3 * hidden * inter
    expert_bytes = elements * DTYPE.itemsize
    pool = make_pool(hidden, inter, pool_size(expert_bytes, cache_bytes))
    generator = torch.Generator().manual_seed(1)
    rows = []
    for n in tokens:
        x = torch.randn(n, hidden, generator=generator).to(DTYPE)
        times = time_expert(pool, x, calls)
        predicted = float(expert_seconds(expert_bytes, 2 * elements, n, memory_bandwidth, flops))
        rows.append(Row(shape, n, len(pool), expert_bytes, 2 * elements,
                        statistics.median(times), min(times),
                        expert_bytes / memory_bandwidth, n * 2 * elements / flops, predicted,
                        hot_seconds(pool[0], x, calls)))
    return rows


def print_row(row: Row) -> None:
    bound = "memory" if row.memory_s >= row.compute_s else "compute"
    verdict = "PASS" if abs(row.ratio - 1) <= TARGET else "MISS"
    print(f"{row.shape:20s} n={row.tokens:<3d} measured {row.measured_s * 1e3:8.3f} ms  "
          f"predicted {row.predicted_s * 1e3:8.3f} ms ({bound:7s})  "
          f"measured/predicted {row.ratio:5.2f} [{verdict} within {TARGET:.0%}] "
          f"(best call {row.best_s / row.predicted_s:5.2f})  "
          f"eff {row.expert_bytes / row.measured_s / 1e9:5.1f} GB/s "
          f"{row.tokens * row.expert_flops / row.measured_s / 1e9:6.1f} GFLOP/s  "
          f"hot kernels {row.hot_s * 1e3:7.3f} ms, measured/(memory + hot) "
          f"{row.streaming_plus_kernels_ratio:4.2f}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few calls: a smoke run")
    parser.add_argument("--tokens", default="1,8,64", help="token counts n per expert call")
    parser.add_argument("--calls", type=int, default=40, help="timed expert calls per row")
    args = parser.parse_args()
    tokens = [int(t) for t in args.tokens.split(",")]
    calls = 6 if args.quick else args.calls
    threads = host_threads()
    cache = last_level_cache_bytes()
    host = probe_host("bfloat16")
    print(f"host: {threads} threads, last-level cache {cache / 2**20:.0f} MiB; probed "
          f"memory_bandwidth {host.memory_bandwidth / 1e9:.2f} GB/s (copy of "
          f"{host.buffer_bytes / 2**20:.0f} MiB, bytes read + written), flops "
          f"{host.flops / 1e9:.1f} GFLOP/s (torch bf16 matmul {host.matmul[0]} x "
          f"{host.matmul[1]} @ {host.matmul[1]} x {host.matmul[2]})", flush=True)
    torch.set_num_threads(threads)
    for shape, (hidden, inter) in SHAPES.items():
        before, start = busy_seconds(), time.perf_counter()
        rows = measure(shape, hidden, inter, tokens, calls, host.memory_bandwidth, host.flops,
                       cache)
        busy = others_share(before, time.perf_counter() - start, threads)
        print(f"{shape}: hidden {hidden} x inter {inter}, bf16, {rows[0].expert_bytes / 1e6:.1f} "
              f"MB an expert, {rows[0].experts} experts cycled, median of {calls} calls; other "
              f"processes took {busy} of the cores meanwhile (figures from a busy host are "
              "not to quote)")
        for row in rows:
            print_row(row)


if __name__ == "__main__":
    main()
