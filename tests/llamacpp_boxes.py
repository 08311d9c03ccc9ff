"""The hardware spec of the llama.cpp planner's small end-to-end tests: one card of `vram`
bytes with nothing reserved, a 10 GB/s link and a host (its CPU computes host layers)."""

from __future__ import annotations

from pathlib import Path


def write_one_card_spec(path: Path, vram: int) -> Path:
    path.write_text(f'name = "tiny"\ndescription = "tiny"\nhost_ram = "1GiB"\ncards = 1\n'
                    f'[card]\nmodel = "t"\nvram = "{vram}B"\nreserved_dense = "0B"\n'
                    f'reserved_kv = "0B"\nreserved_activations = "0B"\nh2d_bandwidth = "10GB/s"\n'
                    f'latency_us = 5.0\n[decode]\nbase_step_ms = {{ 1 = 5.0, 4 = 6.0 }}\n'
                    f'[host]\nmemory_bandwidth = "50GB/s"\nflops = "1TFLOPS"\nsync_us = 20.0\n')
    return path
