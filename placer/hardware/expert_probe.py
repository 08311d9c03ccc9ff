"""Timing one cold expert on this host's CPU over n tokens (`placer probe --host`), as an
engine runs a cold expert for n tokens with torch on every core:

    g = x @ gate^T, u = x @ up^T, y = (silu(g) * u) @ down^T      x [n x hidden]
    gate, up [inter x hidden], down [hidden x inter]

Each timed call runs the next expert of a pool that holds more than 4 x the last-level
cache, so its weights come from RAM, not cache (cold, as a cold expert's are). The token
counts are timed in rounds, one call of each count per round, so that a neighbour's burst
on a shared host falls on every count alike instead of bending the curve at one; the time at
n is the mean over the rounds (the model prices the expected stall; on a loaded host a call
either runs or waits out a neighbour's time slice, and a median jumps between the two where
a mean moves with their mix), and the points are then made non-falling by pooling adjacent
violators (the least-squares non-decreasing fit: a point below an earlier one is noise).
The rounds go on until the times have settled (each count's mean known to within STEADY, its
95% interval's half-width over the mean) or MAX_ROUNDS / PROBE_BUDGET_S are spent; that
spread is reported beside the curve, and a curve whose spread stays above STEADY is marked
NOISY by `placer probe --host` (a busy machine: the figure is then worth little).
`benchmarks/bench_cpu_experts.py` times experts the same way, on another pool, and compares
the recorded curve's prediction with what it measures.

`probe_expert_gguf` times the same expert with llama.cpp's own CPU kernels instead, in a
GGUF expert type (Q4_K, MXFP4, F16...), as llama.cpp computes a layer whose experts live in
host memory (`ggml_mul_mat_id`; traces/llamacpp/kernels.py, in the side environment that
`make llama-env` builds), with the same pool, rounds, means and non-decreasing fit.
"""

from __future__ import annotations

import math
import statistics
import time

from placer.errors import PlacerError
from placer.hardware.timing import (
    DEFAULT_TOKENS,
    ExpertTiming,
    expert_bytes,
    ggml_blocks,
)
from traces.errors import TraceError
from traces.llamacpp.runner import time_expert

MIN_CALLS = 5         # rounds at least
MAX_ROUNDS = 40       # rounds at most, once MIN_PROBE_S is spent
MIN_PROBE_S = 2.0
PROBE_BUDGET_S = 10.0  # no round starts after this, once MIN_CALLS are timed
STEADY = 0.05  # a mean known to within 5% (95% interval half-width over the mean) has settled


def pool_size(expert_bytes: int, cache_bytes: int) -> int:
    """Experts to cycle over so that the pool holds more than 4 x `cache_bytes` (at least 4):
    an expert is evicted from the last-level cache before its turn comes again."""
    return max(4, math.floor(4 * cache_bytes / expert_bytes) + 1)


def make_pool(hidden: int, inter: int, count: int, dtype: str, seed: int = 0) -> list:
    """`count` distinct random experts (gate, up, down) in `dtype`, every page written (so
    resident in RAM)."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    torch_dtype = getattr(torch, dtype)

    def weight(rows: int, cols: int):
        return (torch.randn(rows, cols, generator=generator) / math.sqrt(cols)).to(torch_dtype)

    return [(weight(inter, hidden), weight(inter, hidden), weight(hidden, inter))
            for _ in range(count)]


def run_expert(x, expert):
    """One expert's output for x [n x hidden]: (silu(x @ gate^T) * (x @ up^T)) @ down^T."""
    import torch.nn.functional as F

    gate, up, down = expert
    return F.linear(F.silu(F.linear(x, gate)) * F.linear(x, up), down)


def time_rounds(pool: list, inputs: list, rounds: int, min_s: float = 0.0,
                budget_s: float | None = None, settle: bool = False) -> list[list[float]]:
    """Wall seconds of expert calls, per input: each round times one call per input (x [n x
    hidden]), each call on the next expert of `pool`; after one untimed pass over the pool
    and the inputs (page faults and kernel set-up are not timed). `rounds` rounds, more
    until `min_s` is spent, none past `budget_s` once MIN_CALLS rounds are timed; with
    `settle`, fewer where every input's mean has settled (mean_spread <= STEADY) once
    MIN_CALLS rounds and `min_s` are spent."""
    for i, expert in enumerate(pool):
        run_expert(inputs[i % len(inputs)], expert)
    times: list[list[float]] = [[] for _ in inputs]
    call, first = 0, time.perf_counter()
    while True:
        for i, x in enumerate(inputs):
            expert = pool[call % len(pool)]
            call += 1
            start = time.perf_counter()
            run_expert(x, expert)
            times[i].append(time.perf_counter() - start)
        done, spent = len(times[0]), time.perf_counter() - first
        settled = settle and done >= MIN_CALLS and spent >= min_s and max(
            mean_spread(t) for t in times) <= STEADY
        if settled or (done >= rounds and spent >= min_s) or (
                budget_s is not None and done >= MIN_CALLS and spent > budget_s):
            return times


def mean_spread(times: list[float]) -> float:
    """Half-width of the normal 95% interval of the mean of `times`, over the mean (inf for
    fewer than 2)."""
    if len(times) < 2:
        return math.inf
    mean = statistics.fmean(times)
    return 1.96 * statistics.stdev(times) / math.sqrt(len(times)) / mean if mean > 0 else 0.0


def non_decreasing(values: list[float]) -> list[float]:
    """The least-squares non-decreasing fit of `values` (pool adjacent violators)."""
    blocks: list[list[float]] = []  # [mean, count]
    for value in values:
        blocks.append([value, 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (m1, c1), (m2, c2) = blocks[-2], blocks.pop()
            blocks[-1] = [(m1 * c1 + m2 * c2) / (c1 + c2), c1 + c2]
    return [mean for mean, count in blocks for _ in range(int(count))]


def probe_expert(hidden: int, inter: int, dtype: str, cache_bytes: int, threads: int,
                 tokens: tuple[int, ...] = DEFAULT_TOKENS, seed: int = 0) -> ExpertTiming:
    """The measured curve of one expert shape in `dtype` on `threads` threads (module
    docstring); torch's thread count is restored afterwards."""
    return probe_expert_spread(hidden, inter, dtype, cache_bytes, threads, tokens, seed)[0]


def probe_expert_spread(hidden: int, inter: int, dtype: str, cache_bytes: int, threads: int,
                        tokens: tuple[int, ...] = DEFAULT_TOKENS, seed: int = 0
                        ) -> tuple[ExpertTiming, float]:
    """probe_expert's curve and its spread: the largest mean_spread over the token counts."""
    import torch

    torch_dtype = getattr(torch, dtype)
    expert_bytes = 3 * hidden * inter * torch.tensor([], dtype=torch_dtype).itemsize
    pool = make_pool(hidden, inter, pool_size(expert_bytes, cache_bytes), dtype, seed)
    generator = torch.Generator().manual_seed(seed + 1)
    inputs = [torch.randn(n, hidden, generator=generator).to(torch_dtype) for n in tokens]
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        times = time_rounds(pool, inputs, MAX_ROUNDS, MIN_PROBE_S, PROBE_BUDGET_S, settle=True)
    finally:
        torch.set_num_threads(before)
    means = non_decreasing([statistics.fmean(t) for t in times])
    return (ExpertTiming(hidden, inter, dtype, tuple(tokens), tuple(means)),
            max(mean_spread(t) for t in times))


def probe_expert_gguf(hidden: int, inter: int, ggml_type: str, cache_bytes: int, threads: int,
                      tokens: tuple[int, ...] = DEFAULT_TOKENS) -> tuple[ExpertTiming, float]:
    """The measured curve of one expert shape in GGUF type `ggml_type` on `threads` threads,
    computed by llama.cpp's CPU kernels (module docstring), and its spread (the largest
    mean_spread over the token counts; llama.cpp's side runs its MAX_ROUNDS or budget)."""
    check_gguf_expert(hidden, inter, ggml_type)
    pool = pool_size(expert_bytes(hidden, inter, ggml_type), cache_bytes)
    try:
        times = time_expert(hidden, inter, ggml_type, tokens, pool, threads, MAX_ROUNDS,
                            MIN_CALLS, MIN_PROBE_S, PROBE_BUDGET_S)
    except TraceError as exc:
        raise PlacerError(str(exc)) from None
    means = non_decreasing([statistics.fmean(t) for t in times])
    return (ExpertTiming(hidden, inter, ggml_type, tuple(tokens), tuple(means)),
            max(mean_spread(t) for t in times))


def check_gguf_expert(hidden: int, inter: int, ggml_type: str) -> None:
    """PlacerError unless `ggml_type` is a GGUF type whose blocks tile the expert's rows."""
    blocks = ggml_blocks()
    if ggml_type not in blocks:
        raise PlacerError(f"probe --host --gguf-type: expected a GGUF type "
                          f"({', '.join(blocks)}), got {ggml_type!r}")
    block = blocks[ggml_type][0]
    if hidden % block or inter % block:
        raise PlacerError(f"probe --host --expert {hidden}x{inter}: {ggml_type} packs {block} "
                          f"weights a block; hidden and inter must be multiples of {block}")
