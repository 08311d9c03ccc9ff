"""Measure the serving box: each visible GPU's pinned host-to-device bandwidth and per-copy
latency (`placer probe`), and the host CPU as it runs cold experts (`placer probe --host`):
the time of an expert's kernel over n tokens, cold from RAM, for each asked expert shape in
the experts' dtype (placer/hardware/expert_probe.py: what the cpu model predicts from), its
streaming memory bandwidth and matmul throughput (the roofline, kept as the fallback), and,
where CUDA is visible, the round trip a layer pays to hand its tokens to the CPU and back."""

from __future__ import annotations

import math
import os
import statistics
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from placer.errors import PlacerError
from placer.hardware.devices import cpu_model
from placer.hardware.expert_probe import (
    STEADY,
    check_gguf_expert,
    probe_expert_gguf,
    probe_expert_spread,
)
from placer.hardware.timing import (
    DEFAULT_SHAPE,
    DEFAULT_TOKENS,
    DTYPE_BYTES,
    MAX_DIM,
    ExpertTiming,
    timing_fragment,
)


@dataclass(frozen=True)
class ProbeResult:
    index: int
    name: str
    vram: int
    h2d_bandwidth: float  # bytes/s, pinned, one large copy
    latency_us: float     # per small copy


def probe(size_bytes: int = 256 * 2**20, repeats: int = 10, small_copies: int = 200
          ) -> list[ProbeResult]:
    """Time pinned host-to-device copies on every CUDA device with CUDA events."""
    import torch

    if not torch.cuda.is_available():
        raise PlacerError("no CUDA GPU is visible: placer probe measures real cards "
                          "(use a preset: placer hardware list)")
    host = torch.empty(size_bytes, dtype=torch.uint8).pin_memory()
    small = torch.empty(4096, dtype=torch.uint8).pin_memory()
    results = []
    for index in range(torch.cuda.device_count()):
        with torch.cuda.device(index):
            dev = torch.empty(size_bytes, dtype=torch.uint8, device="cuda")
            dev.copy_(host, non_blocking=True)
            torch.cuda.synchronize()
            big_s = _timed(lambda d=dev: d.copy_(host, non_blocking=True), repeats)
            dev_small = dev[:4096]
            small_s = _timed(lambda d=dev_small: d.copy_(small, non_blocking=True), small_copies)
            props = torch.cuda.get_device_properties(index)
            results.append(ProbeResult(index, props.name, props.total_memory,
                                       size_bytes / big_s, small_s * 1e6))
            del dev
    return results


def _timed(fn, repeats: int) -> float:
    """Seconds per call of `fn` (queued on the current stream), measured with CUDA events."""
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / repeats


def spec_fragment(results: list[ProbeResult]) -> str:
    """A hardware-spec TOML fragment of the measured cards (edit reserved_* and links)."""
    lines = ["# measured by placer probe", f"cards = {len(results)}", "", "[card]",
             f'model = "{results[0].name}"', f"vram = {results[0].vram}",
             f'h2d_bandwidth = "{min(r.h2d_bandwidth for r in results) / 1e9:.2f}GB/s"',
             f"latency_us = {max(r.latency_us for r in results):.2f}"]
    return "\n".join(lines) + "\n"


HOST_DTYPES = tuple(DTYPE_BYTES)  # what the probe measures, the spec must read back
TYPICAL_SYNC_US = 30.0  # a layer's tokens to the host and back on a PCIe card, not measured
MATMUL_SHAPE = DEFAULT_SHAPE  # a Qwen3-30B-A3B expert's gate / up projection
MAX_TOKENS = 1 << 14  # matmul rows: a [16384 x 2048] float32 input is already 128 MiB


@dataclass(frozen=True)
class HostProbe:
    """The `[host]` figures of this machine, and how they were measured.

    memory_bandwidth: bytes/s of a streaming copy over all threads, bytes read + written.
    flops:            FLOP/s of torch matmuls [tokens x hidden] @ [hidden x inter] in `dtype`.
    sync_us:          us of a tiny H2D copy + kernel + D2H round trip (typical where no CUDA).
    """

    memory_bandwidth: float
    flops: float
    sync_us: float
    sync_measured: bool
    dtype: str
    threads: int
    buffer_bytes: int
    matmul: tuple[int, int, int]  # (tokens, hidden, inter)
    copies: int                   # timed copies the bandwidth is the best of
    matmuls: int                  # timed matmuls the FLOP/s is the best of
    experts: tuple[ExpertTiming, ...] = ()  # each asked expert shape's time over n tokens
    cpu: str = ""                 # the CPU timed, as /proc/cpuinfo names it
    copy_spread: float = 0.0      # IQR / median of the timed copies
    matmul_spread: float = 0.0    # IQR / median of the timed matmuls
    expert_spread: tuple[float, ...] = ()  # per expert: its means' 95% half-width / mean
    source: str = ""              # where the expert shapes came from ("model.gguf: ...")

    @property
    def noisy(self) -> bool:
        """Whether some figure's timings never settled (spread above STEADY)."""
        return max(self.copy_spread, self.matmul_spread, *self.expert_spread) > STEADY


def host_threads() -> int:
    """Cores this process may run on (its affinity mask where the OS has one)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def relative_iqr(times: list[float]) -> float:
    """Interquartile range over median of `times` (0 for fewer than 2)."""
    if len(times) < 2:
        return 0.0
    q1, median, q3 = statistics.quantiles(times, n=4, method="inclusive")
    return (q3 - q1) / median if median > 0 else 0.0


def last_level_cache_bytes() -> int:
    """Bytes of last-level cache over the whole machine: the highest cache level's instances
    (one per socket or core complex) summed, from Linux sysfs. 0 where unknown."""
    instances: dict[tuple[int, str], int] = {}
    for index in Path("/sys/devices/system/cpu").glob("cpu[0-9]*/cache/index[0-9]*"):
        try:
            level = int((index / "level").read_text())
            shared = (index / "shared_cpu_list").read_text().strip()
            size = (index / "size").read_text().strip()
        except (OSError, ValueError):
            continue
        if size[:-1].isdigit() and size[-1] in "KMG":
            instances[level, shared] = int(size[:-1]) * {"K": 2**10, "M": 2**20, "G": 2**30}[
                size[-1]]
    top = max((level for level, _ in instances), default=None)
    return sum(size for (level, _), size in instances.items() if level == top)


def max_buffer_bytes() -> int:
    """The largest copy buffer a probe allocates: the copy holds two, at most half the RAM."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 4
    except (ValueError, OSError):
        return 2 * 2**30


def default_buffer_bytes() -> int:
    """A copy buffer well past the last-level cache: 4 x LLC, at least 256 MiB, at most 2 GiB."""
    return min(max(256 * 2**20, 4 * last_level_cache_bytes()), 2 * 2**30)


def best_seconds(fn: Callable[[], object], repeats: int, min_s: float = 0.25,
                 budget_s: float = 2.0) -> tuple[float, int, float]:
    """(Fastest, number, spread) of timed calls of `fn` after one untimed warm-up: at least
    `repeats`, more until `min_s` is spent (a best of many shrugs off a neighbour's burst on
    a shared host) and while the spread (IQR / median) is above STEADY, none past `budget_s`
    once two are timed (a slow machine stays quick to probe)."""
    fn()
    times: list[float] = []
    first = time.perf_counter()
    while True:
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
        spent = time.perf_counter() - first
        if (len(times) >= repeats and spent >= min_s and relative_iqr(times) <= STEADY) or (
                len(times) >= 2 and spent > budget_s):
            return min(times), len(times), relative_iqr(times)


def host_memory_bandwidth(buffer_bytes: int, repeats: int, threads: int
                          ) -> tuple[float, int, float]:
    """(Bytes/s, copies timed, their spread) of a streaming copy of `buffer_bytes` split over
    `threads` threads (numpy's copy releases the GIL).

    Counts bytes read + bytes written (2 x buffer, STREAM's convention for its copy): the
    write-allocate reads of the destination, where the copy's stores do not bypass the cache,
    are not counted, so on such a host this reads low, by up to a third, against the pure
    reads an expert does. Each thread first writes its own share of both buffers, so on a
    multi-socket host its pages sit on its own node."""
    src = np.empty(buffer_bytes, dtype=np.uint8)
    dst = np.empty_like(src)
    bounds = [buffer_bytes * i // threads // 64 * 64 for i in range(threads)] + [buffer_bytes]
    chunks = [(dst[a:b], src[a:b]) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]

    def touch(chunk: tuple[np.ndarray, np.ndarray]) -> None:
        chunk[1].fill(1)
        chunk[0].fill(0)

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(touch, chunks))

        def copy() -> None:
            list(pool.map(lambda c: np.copyto(*c), chunks))

        seconds, copies, spread = best_seconds(copy, repeats)
    return 2 * buffer_bytes / seconds, copies, spread


def host_matmul_flops(dtype: str, tokens: int, hidden: int, inter: int, repeats: int,
                      threads: int) -> tuple[float, int, float]:
    """(FLOP/s, calls timed, their spread) (2 x tokens x hidden x inter per call) of torch's
    CPU matmul x @ w^T, x [tokens x hidden], w [inter x hidden] (an expert's gate projection
    as an engine runs it), in `dtype`, on `threads` threads. Torch's thread count is
    restored afterwards."""
    import torch

    torch_dtype = getattr(torch, dtype)
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(tokens, hidden, generator=generator).to(torch_dtype)
    w = torch.randn(inter, hidden, generator=generator).to(torch_dtype)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        seconds, calls, spread = best_seconds(lambda: torch.nn.functional.linear(x, w), repeats)
    finally:
        torch.set_num_threads(before)
    return 2.0 * tokens * hidden * inter / seconds, calls, spread


def host_sync_us(round_trips: int = 200) -> float | None:
    """Median wall-clock us of a one-token round trip on CUDA device 0: pinned H2D copy of 4
    KiB, one kernel, D2H copy back, synchronize (what a layer pays to hand its tokens to the
    CPU and take the result back). None where no CUDA device is visible."""
    import torch

    if not torch.cuda.is_available():
        return None
    host = torch.ones(2048, dtype=torch.bfloat16).pin_memory()
    back = torch.empty_like(host).pin_memory()
    dev = torch.empty(2048, dtype=torch.bfloat16, device="cuda:0")

    def round_trip() -> float:
        start = time.perf_counter()
        dev.copy_(host, non_blocking=True)
        dev.mul_(2)
        back.copy_(dev, non_blocking=True)
        torch.cuda.synchronize(0)
        return time.perf_counter() - start

    for _ in range(10):
        round_trip()
    return statistics.median(round_trip() for _ in range(round_trips)) * 1e6


def probe_host(dtype: str = "bfloat16", buffer_bytes: int | None = None, tokens: int = 1024,
               repeats: int = 5, experts: tuple[tuple[int, int], ...] = (DEFAULT_SHAPE,),
               expert_tokens: tuple[int, ...] = DEFAULT_TOKENS,
               gguf_type: str | None = None, source: str = "") -> HostProbe:
    """Measure this host's `[host]` figures on all its cores (no GPU needed); `experts`:
    the (hidden, inter) shapes to time over `expert_tokens` tokens, with torch in `dtype`, or
    with llama.cpp's CPU kernels in the GGUF type `gguf_type` (Q4_K, MXFP4, F16...)."""
    if dtype not in HOST_DTYPES:
        raise PlacerError(f"probe --host --dtype: expected one of {', '.join(HOST_DTYPES)}, "
                          f"got {dtype!r}")
    if not 1 <= tokens <= MAX_TOKENS:
        raise PlacerError(f"probe --host --tokens: expected a positive count up to "
                          f"{MAX_TOKENS}, got {tokens}")
    if not expert_tokens or any(not 1 <= n <= MAX_TOKENS for n in expert_tokens) or any(
            b <= a for a, b in zip(expert_tokens, expert_tokens[1:], strict=False)):
        raise PlacerError(f"probe --host --expert-tokens: expected ascending counts in "
                          f"1..{MAX_TOKENS}, got "
                          f"{list(expert_tokens)}")
    for hidden, inter in experts if gguf_type is not None else ():
        check_gguf_expert(hidden, inter, gguf_type)
    threads = host_threads()
    buffer_bytes = default_buffer_bytes() if buffer_bytes is None else buffer_bytes
    if buffer_bytes < threads * 4096:
        raise PlacerError(f"probe --host --mb: a copy buffer of {buffer_bytes} bytes is too "
                          f"small for {threads} threads")
    if buffer_bytes > max_buffer_bytes():
        raise PlacerError(f"probe --host --mb: a copy buffer of {buffer_bytes // 2**20} MiB "
                          f"is more than this host can hold twice (at most "
                          f"{max_buffer_bytes() // 2**20} MiB)")
    hidden, inter = MATMUL_SHAPE
    bandwidth, copies, copy_spread = host_memory_bandwidth(buffer_bytes, repeats, threads)
    flops, matmuls, matmul_spread = host_matmul_flops(dtype, tokens, hidden, inter, repeats,
                                                      threads)
    sync = host_sync_us()
    cache = last_level_cache_bytes()
    timed = [probe_expert_spread(h, i, dtype, cache, threads, expert_tokens)
             if gguf_type is None else
             probe_expert_gguf(h, i, gguf_type, cache, threads, expert_tokens)
             for h, i in experts]
    return HostProbe(memory_bandwidth=bandwidth, flops=flops,
                     sync_us=TYPICAL_SYNC_US if sync is None else sync,
                     sync_measured=sync is not None, dtype=dtype, threads=threads,
                     buffer_bytes=buffer_bytes, matmul=(tokens, hidden, inter), copies=copies,
                     matmuls=matmuls, experts=tuple(t for t, _ in timed), cpu=cpu_model(),
                     copy_spread=copy_spread, matmul_spread=matmul_spread,
                     expert_spread=tuple(s for _, s in timed), source=source)


def format_flops(flops: float) -> str:
    """A FLOP/s figure as the spec writes it: "393.5GFLOPS", "1.52TFLOPS"."""
    for prefix, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if flops >= scale:
            return f"{flops / scale:.4g}{prefix}FLOPS"
    return f"{flops:.4g}FLOPS"


def host_fragment(result: HostProbe) -> str:
    """The `[host]` TOML fragment of a host probe, each figure saying how it was obtained
    (the CPU timed, each figure's spread, NOISY where it did not settle)."""
    tokens, hidden, inter = result.matmul
    if result.sync_measured:
        sync = (f"sync_us = {result.sync_us:.1f}  # measured: median 4 KiB H2D + kernel + D2H "
                "round trip on cuda:0")
    else:
        sync = f"sync_us = {result.sync_us:.1f}  # typical, not measured (needs a GPU)"
    lines = [f"# {host_comment(result)}", "[host]",
             f'memory_bandwidth = "{result.memory_bandwidth / 1e9:.2f}GB/s"  # '
             f"{noisy(result.copy_spread)}measured by "
             f"placer probe --host: copy of {result.buffer_bytes / 2**20:.0f} MiB, "
             f"bytes read + written, {result.threads} threads, best of {result.copies}"
             f"{spread_text(result.copy_spread, 'IQR / median')}",
             f'flops = "{format_flops(result.flops)}"  # {noisy(result.matmul_spread)}measured: '
             f"torch {result.dtype} matmul "
             f"[{tokens} x {hidden}] @ [{hidden} x {inter}], {result.threads} threads, "
             f"best of {result.matmuls}{spread_text(result.matmul_spread, 'IQR / median')}",
             sync]
    kernels = ("torch" if result.experts and result.experts[0].dtype in HOST_DTYPES
               else "llama.cpp b11669 CPU kernels (ggml_mul_mat_id)")
    spreads = result.expert_spread or (0.0,) * len(result.experts)
    tables = [timing_fragment(t, f"{noisy(s)}measured: {kernels}, mean wall time, cold from "
                                 f"RAM, {result.threads} threads"
                                 f"{spread_text(s, '95% interval of the means')}")
              for t, s in zip(result.experts, spreads, strict=True)]
    return "\n".join(lines) + "\n" + "".join("\n" + t for t in tables)


def host_comment(result: HostProbe) -> str:
    """The line above the `[host]` table: the CPU timed, and where the expert shapes came
    from; NOISY first where some figure did not settle."""
    text = (f"placer probe --host timed {result.cpu or 'this host CPU'} on {result.threads} "
            f"threads" + (f"; experts of {result.source}" if result.source else ""))
    return ("NOISY (some timings did not settle: a busy machine?): " if result.noisy
            else "") + text


def noisy(spread: float) -> str:
    """"NOISY, " where `spread` is above STEADY."""
    return "NOISY, " if spread > STEADY else ""


def spread_text(spread: float, what: str) -> str:
    """", spread ±x% (what)" of a figure."""
    return f", spread ±{100 * spread:.1f}% ({what})" if math.isfinite(spread) else ""


def parse_shape(text: str) -> tuple[int, int]:
    """(hidden, inter) from "HIDDENxINTER" (`probe --host --expert 2048x768`)."""
    parts = text.lower().split("x")
    if len(parts) != 2 or not all(p.strip().isdigit() for p in parts) \
            or not all(1 <= int(p) <= MAX_DIM for p in parts):
        raise PlacerError(f"probe --host --expert: expected HIDDENxINTER (e.g. 2048x768, each "
                          f"1..{MAX_DIM}), got {text!r}")
    return int(parts[0]), int(parts[1])
