"""The host CPU as it runs cold experts (the `cpu` execution model: llama.cpp, KTransformers).

A cold expert e that n of a decode step's tokens selected runs on the host CPU from host RAM
in a roofline time

    expert_seconds(e, n) = max(bytes_e / memory_bandwidth, n * flops_e / flops)

where flops_e = 2 x the expert's weight elements (one multiply-add per weight and token).
One CPU serves every card, so a layer's CPU time is the sum over its selected cold experts.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from solvers.errors import SolverError


@dataclass(frozen=True)
class Host:
    """The host as the `cpu` execution model sees it.

    memory_bandwidth: bytes/s the CPU streams expert weights from host RAM.
    flops:            FLOP/s the CPU sustains on the expert matmuls (effective, not peak).
    sync_s:           seconds a layer waits to hand its tokens to the CPU and back, once per
                      layer with any cold expert selected.
    activation_bytes: bytes per token moved each way (hidden_size x 2 bytes, bf16).
    h2d_bandwidth:    bytes/s of the activations' round trip over PCIe.
    """

    memory_bandwidth: float
    flops: float
    sync_s: float
    activation_bytes: float
    h2d_bandwidth: float

    def check(self) -> None:
        """SolverError unless every figure is finite and in range."""
        for name in ("memory_bandwidth", "flops", "h2d_bandwidth"):
            value = getattr(self, name)
            if not np.isfinite(value) or value <= 0:
                raise SolverError(f"host.{name} must be positive and finite, got {value}")
        for name in ("sync_s", "activation_bytes"):
            value = getattr(self, name)
            if not np.isfinite(value) or value < 0:
                raise SolverError(f"host.{name} must be non-negative and finite, got {value}")

    @property
    def round_trip_s(self) -> float:
        """Seconds to move one token's activations to the host and back."""
        return 2.0 * self.activation_bytes / self.h2d_bandwidth


def expert_seconds(expert_bytes: np.ndarray | float, expert_flops: np.ndarray | float,
                   tokens: np.ndarray | float, memory_bandwidth: float,
                   flops: float) -> np.ndarray:
    """Roofline seconds of cold experts on the CPU (broadcasting):
    max(bytes / memory_bandwidth, tokens * flops_e / flops); 0 where tokens is 0."""
    expert_bytes = np.asarray(expert_bytes, dtype=np.float64)
    tokens = np.asarray(tokens, dtype=np.float64)
    t = np.maximum(expert_bytes / memory_bandwidth,
                   tokens * np.asarray(expert_flops, dtype=np.float64) / flops)
    return np.where(tokens > 0, t, 0.0)


CHUNK_CELLS = 1 << 22  # steps x layers x experts processed at once (bounded memory)


def token_counts(tokens: np.ndarray, num_experts: int) -> np.ndarray:
    """tokens: [S, B, L, k] int expert ids (-1: none) -> [S, L, E] int64: how many of each
    step's tokens selected each expert."""
    tokens = np.asarray(tokens)
    num_steps, _, num_layers, _ = tokens.shape
    valid = tokens >= 0
    step = np.broadcast_to(np.arange(num_steps)[:, None, None, None], tokens.shape)
    layer = np.broadcast_to(np.arange(num_layers)[None, None, :, None], tokens.shape)
    key = (step[valid] * num_layers + layer[valid]) * num_experts + tokens[valid]
    size = num_steps * num_layers * num_experts
    return np.bincount(key, minlength=size).reshape(num_steps, num_layers, num_experts)


def waiting_tokens(tokens: np.ndarray, cold: np.ndarray) -> np.ndarray:
    """tokens: [S, B, L, k], cold: [L, E] bool -> [S, L] int: tokens of each step that selected
    at least one cold expert at each layer (their activations go to the host and back)."""
    tokens = np.asarray(tokens)
    layer = np.arange(tokens.shape[2])[None, None, :, None]
    hit = (tokens >= 0) & cold[layer, np.maximum(tokens, 0)]
    return hit.any(axis=3).sum(axis=1)


@dataclass(frozen=True)
class CpuLoads:
    """What the host does at each step and layer. All arrays [S, L].

    layer_stall:  seconds the layer waits: CPU time of its selected cold experts, plus
                  sync_s when any ran, plus the waiting tokens' activation round trips.
    cold_bytes:   bytes of the selected cold experts (what the CPU reads from host RAM).
    cold_experts: selected cold experts (each computed once on the host).
    """

    layer_stall: np.ndarray
    cold_bytes: np.ndarray
    cold_experts: np.ndarray


def cpu_loads(expert_bytes: np.ndarray, expert_flops: np.ndarray, host: Host,
              cold: np.ndarray, tokens: np.ndarray) -> CpuLoads:
    """The cpu execution model replayed: expert_bytes, expert_flops, cold: [L, E];
    tokens: [S, B, L, k] int expert ids (-1: none). Processed in chunks of steps."""
    tokens = np.asarray(tokens)
    num_steps, _, num_layers, _ = tokens.shape
    num_experts = expert_bytes.shape[1]
    eb = np.asarray(expert_bytes, dtype=np.float64)
    parts = []
    chunk = max(1, CHUNK_CELLS // (num_layers * num_experts))
    for start in range(0, num_steps, chunk):
        part = tokens[start:start + chunk]
        counts = token_counts(part, num_experts)  # [s, L, E]
        run = (counts > 0) & cold[None]
        seconds = np.where(run, expert_seconds(eb, expert_flops, counts, host.memory_bandwidth,
                                               host.flops), 0.0).sum(axis=2)
        any_cold = run.any(axis=2)
        stall = (seconds + host.sync_s * any_cold
                 + host.round_trip_s * waiting_tokens(part, cold))
        parts.append((stall, (run * eb).sum(axis=2), run.sum(axis=2).astype(np.float64)))
    if not parts:
        empty = np.zeros((0, num_layers))
        return CpuLoads(empty, empty, empty)
    return CpuLoads(*(np.concatenate(p) for p in zip(*parts, strict=True)))


def cpu_rows(expert_bytes: np.ndarray, expert_flops: np.ndarray, host: Host, tokens: np.ndarray,
             weight: float, layer: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """The cpu objective of one layer of sampled steps as weighted "any cold" rows.

    A row is a set of experts (packed bits, [N, ceil(E / 8)] uint8) and a weight in seconds
    that is paid once when any of them is cold: each step's selected set (weight * sync_s),
    each token's selected set (weight * round_trip_s), and each expert alone with the CPU
    time it would take in the steps that select it (its roofline, summed, times weight).
    tokens: [S, B, L, k]; weight: objective weight of one step (profile weight / S).
    Returns (packed rows, weights) lists to concatenate over step sets and merge.
    """
    num_experts = expert_bytes.shape[1]
    ids = np.asarray(tokens)[:, :, layer, :]  # [S, B, k]
    num_steps, batch, _ = ids.shape
    eb, fl = np.asarray(expert_bytes[layer], np.float64), np.asarray(expert_flops[layer])
    rows, weights = [], []
    linear = np.zeros(num_experts)
    chunk = max(1, CHUNK_CELLS // (batch * num_experts))
    for start in range(0, num_steps, chunk):
        part = ids[start:start + chunk]  # [s, B, k]
        s = part.shape[0]
        valid = part >= 0
        token = np.broadcast_to(np.arange(s * batch).reshape(s, batch, 1), part.shape)
        per_token = np.zeros((s * batch, num_experts), dtype=bool)
        per_token[token[valid], part[valid]] = True
        per_step = per_token.reshape(s, batch, num_experts)
        counts = per_step.sum(axis=1)  # [s, E]
        linear += expert_seconds(eb, fl, counts, host.memory_bandwidth, host.flops).sum(axis=0)
        real = per_token.any(axis=1)
        rows += [np.packbits(counts > 0, axis=1), np.packbits(per_token[real], axis=1)]
        weights += [np.full(s, weight * host.sync_s),
                    np.full(int(real.sum()), weight * host.round_trip_s)]
    rows.append(np.packbits(np.eye(num_experts, dtype=bool), axis=1))
    weights.append(weight * linear)
    return rows, weights
