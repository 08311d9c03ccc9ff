"""ggml's quantization blocks by type name: the one table placer's checkpoint estimate
(`--expert-dtype q4_k`) and hardware timings (`[[host.expert]]` dtype Q4_K) both read, from
the `gguf` package's GGML_QUANT_SIZES.

Built on first use: importing gguf costs about 28 ms, which only a command that meets a ggml
type should pay, not every command's start-up."""

from __future__ import annotations

import functools


@functools.cache
def block_sizes() -> dict[str, tuple[int, int]]:
    """{ggml type by its gguf name (Q4_K, MXFP4, F16, I8...): (weights a block, bytes a
    block)}, in GGML_QUANT_SIZES's order."""
    from gguf.constants import GGML_QUANT_SIZES

    return {t.name: (block, size) for t, (block, size) in GGML_QUANT_SIZES.items()}
