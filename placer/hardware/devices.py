"""The torch devices a command may be given: checked before any model is loaded or moved."""

from __future__ import annotations

import re

from placer.errors import PlacerError

_DEVICE = re.compile(r"^(auto|cpu|cuda)(?::(\d+))?$")


def check_device(name: str, option: str = "--device") -> None:
    """PlacerError unless `name` is auto, cpu, cuda or cuda:N of a CUDA device this host has."""
    m = _DEVICE.match(name)
    if not m or (m[2] is not None and m[1] != "cuda"):
        raise PlacerError(f"{option}: expected auto, cpu, cuda or cuda:N, got {name!r}")
    if m[1] != "cuda":
        return
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count == 0:
        raise PlacerError(f"{option} {name}: this host has no CUDA device (use cpu or auto)")
    if m[2] is not None and int(m[2]) >= count:
        raise PlacerError(f"{option} {name}: this host has {count} CUDA device"
                          f"{'s' if count > 1 else ''} (cuda:0..cuda:{count - 1})")


def device_name(device: str) -> str:
    """`device` with the model of what it names: "cpu (AMD EPYC 7R13 48-Core Processor)",
    "cuda:0 (NVIDIA GeForce RTX 3060)"."""
    if device.startswith("cuda"):
        import torch

        return f"{device} ({torch.cuda.get_device_name(torch.device(device))})"
    return f"cpu ({cpu_model()})"


def cpu_model() -> str:
    """This host's CPU model as /proc/cpuinfo names it (platform's guess elsewhere)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Model", "Hardware") and value.strip():
                    return " ".join(value.split())
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine() or "unknown CPU"
