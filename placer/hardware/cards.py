"""Memory bandwidth of GPUs by the model name a spec's card gives, from the vendors' data
sheets: what `placer probe --step` estimates a decode step from where the model cannot run
here (`--memory-bandwidth` overrides, and names a card this table lacks)."""

from __future__ import annotations

MEMORY_BANDWIDTH_GBPS = {  # GB/s of device memory
    "RTX 3090": 936.0, "RTX 3090 Ti": 1008.0, "RTX 4090": 1008.0, "RTX 4090 D": 1008.0,
    "RTX 5090": 1792.0, "RTX 5090 D": 1792.0, "RTX 6000 Ada": 960.0, "L40S": 864.0,
    "A100": 2039.0, "H100": 3350.0, "H200": 4800.0, "B200": 8000.0,
}


def memory_bandwidth(card_model: str) -> float | None:
    """Bytes/s of `card_model`'s memory, or None for a card not in the table."""
    gbps = MEMORY_BANDWIDTH_GBPS.get(card_model.strip())
    return None if gbps is None else gbps * 1e9
