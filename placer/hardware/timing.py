"""Measured expert times in a hardware spec: the `[[host.expert]]` tables `placer probe --host`
writes, read back for the `cpu` execution model.

    [[host.expert]]        # one SwiGLU expert, cold from RAM, on every core of the host
    hidden = 2048          # gate / up [inter x hidden], down [hidden x inter]
    inter = 768
    dtype = "bfloat16"     # the weights' and activations' dtype it ran in, or the GGUF
                           # expert type llama.cpp's CPU kernels ran (Q4_K, MXFP4, F16...)
    tokens = [1, 2, 4, 8, 16, 32, 64]
    ms = [8.9, 10.1, 13.0, 24.0, 40.2, 71.5, 136.0]   # mean wall time at each token count

Tokens ascend from 1 or more; times are positive and never fall (the probe makes them so: a
later point below an earlier one is measurement noise). The model reads the points as a
curve (solvers.cpu.ExpertCurve) over the expert's bytes, 3 x hidden x inter x the dtype's
size (a GGUF type's: its blocks' bytes), and scales it to other experts by their bytes. In
a plan's JSON form the times are `seconds`, as `sync_us` becomes `sync_s`.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

from placer.errors import PlacerError
from traces.formats.ggml import block_sizes

DTYPE_BYTES = {"bfloat16": 2, "float32": 4}
DEFAULT_TOKENS = (1, 2, 4, 8, 16, 32, 64)  # the token counts `probe --host` times an expert at
DEFAULT_SHAPE = (2048, 768)  # (hidden, inter): a Qwen3-30B-A3B expert


@functools.cache
def ggml_blocks() -> dict[str, tuple[int, int]]:
    """ggml weight types by their gguf names (Q4_K, MXFP4, F16...): (weights a block, bytes a
    block), traces.formats.ggml's table less the integer and F64 types (built on first use: only a
    spec or probe with a GGUF type pays for importing gguf, not every command's start)."""
    return {name: blocks for name, blocks in block_sizes().items()
            if name not in ("I8", "I16", "I32", "I64", "F64")}


def expert_bytes(hidden: int, inter: int, dtype: str) -> int:
    """Bytes of one SwiGLU expert's three [inter x hidden] weights in `dtype` (a torch dtype
    name or a GGUF type, whose blocks pack `block` weights in `size` bytes)."""
    if dtype in DTYPE_BYTES:
        return 3 * hidden * inter * DTYPE_BYTES[dtype]
    block, size = ggml_blocks()[dtype]
    return 3 * hidden * inter // block * size
MAX_TIMING_POINTS = 64
MAX_DIM = 1 << 20
MAX_SECONDS = 1e3


@dataclass(frozen=True)
class ExpertTiming:
    """One measured expert: its shape and dtype, and its seconds at each token count."""

    hidden: int
    inter: int
    dtype: str
    tokens: tuple[int, ...]
    seconds: tuple[float, ...]

    @property
    def expert_bytes(self) -> int:
        """Bytes of its three weight matrices."""
        return expert_bytes(self.hidden, self.inter, self.dtype)


def parse_timings(value: Any, where: str, seconds: bool) -> tuple[ExpertTiming, ...]:
    """The `[[host.expert]]` tables (`seconds`: the JSON form, times in seconds)."""
    if not isinstance(value, list | tuple) or not all(isinstance(t, dict) for t in value):
        raise PlacerError(f"{where}: expected a list of tables ([[host.expert]])")
    return tuple(_timing(t, f"{where}[{i}]", seconds) for i, t in enumerate(value))


def _timing(table: dict, where: str, seconds: bool) -> ExpertTiming:
    times_key = "seconds" if seconds else "ms"
    fields = {"hidden", "inter", "dtype", "tokens", times_key}
    if set(table) != fields:
        extra = sorted(set(table) - fields)
        raise PlacerError(f"{where}: " + (f"unknown field {extra[0]!r}" if extra else
                                          f"missing {sorted(fields - set(table))[0]}"))
    for key in ("hidden", "inter"):
        if not _count(table[key]) or not 1 <= table[key] <= MAX_DIM:
            raise PlacerError(f"{where}.{key}: expected an integer in 1..{MAX_DIM}, got "
                              f"{table[key]!r}")
    if table["dtype"] not in DTYPE_BYTES and table["dtype"] not in ggml_blocks():
        raise PlacerError(f"{where}.dtype: expected one of {', '.join(DTYPE_BYTES)} or a GGUF "
                          f"type ({', '.join(list(ggml_blocks())[:6])}...), got "
                          f"{table['dtype']!r}")
    block = ggml_blocks().get(table["dtype"], (1, 0))[0]
    if table["hidden"] % block or table["inter"] % block:
        raise PlacerError(f"{where}: {table['dtype']} packs {block} weights a block; hidden "
                          f"and inter must be multiples of {block}")
    tokens, times = table["tokens"], table[times_key]
    if not isinstance(tokens, list | tuple) or not isinstance(times, list | tuple) or not tokens \
            or len(tokens) != len(times) or len(tokens) > MAX_TIMING_POINTS:
        raise PlacerError(f"{where}: tokens and {times_key} must be lists of the same length, "
                          f"1 to {MAX_TIMING_POINTS} points")
    if not all(_count(n) and n >= 1 for n in tokens) or any(
            b <= a for a, b in zip(tokens, tokens[1:], strict=False)):
        raise PlacerError(f"{where}.tokens: expected ascending integers >= 1, got {tokens}")
    scale = 1.0 if seconds else 1e-3
    if not all(isinstance(t, int | float) and not isinstance(t, bool) and math.isfinite(t)
               and 0 < t * scale <= MAX_SECONDS for t in times) or any(
            b < a for a, b in zip(times, times[1:], strict=False)):
        raise PlacerError(f"{where}.{times_key}: expected positive times that never fall, "
                          f"got {times}")
    return ExpertTiming(table["hidden"], table["inter"], table["dtype"], tuple(tokens),
                        tuple(float(t) * scale for t in times))


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def timing_fragment(timing: ExpertTiming, comment: str) -> str:
    """The `[[host.expert]]` TOML table of a measured expert."""
    return "\n".join([
        f"[[host.expert]]  # {comment}",
        f"hidden = {timing.hidden}", f"inter = {timing.inter}", f'dtype = "{timing.dtype}"',
        f"tokens = [{', '.join(map(str, timing.tokens))}]",
        f"ms = [{', '.join(f'{s * 1e3:.4g}' for s in timing.seconds)}]"]) + "\n"
