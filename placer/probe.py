"""Measure each visible GPU's pinned host-to-device bandwidth and per-copy latency."""

from __future__ import annotations

from dataclasses import dataclass

from placer.errors import PlacerError


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
