"""The host CPU as it runs cold experts (the `cpu` execution model: llama.cpp, KTransformers).

A cold expert e that n of a decode step's tokens selected runs on the host CPU from host RAM.
Its time is what `placer probe --host` measured: the expert kernel's seconds over n tokens
for a measured expert shape and dtype, cold from RAM (`ExpertCurve`: piecewise linear through
the measured points, 0 at n = 0, extended past the last point along its last segment),
scaled by bytes_e / the measured expert's bytes, from the curve measured nearest in bytes.
A host without a measured curve falls back to the roofline

    roofline_seconds(e, n) = max(bytes_e / memory_bandwidth, n * flops_e / flops)

where flops_e = 2 x the expert's weight elements (one multiply-add per weight and token).
One CPU serves every card, so a layer's CPU time is the sum over its selected cold experts.

llama.cpp does not compute a large batch there: for a MUL_MAT_ID whose batch (`ne[2]`, the
ubatch's tokens) reaches `op_offload_min_batch_size` (env GGML_OP_OFFLOAD_MIN_BATCH, default
32; `ggml-cuda.cu` `ggml_backend_cuda_device_offload_op`, llama.cpp 0c1e5709), the scheduler
runs the op on the first GPU and copies over only the experts the ubatch uses
(`ggml-backend.cpp` `ggml_backend_sched_compute_splits`). So a step of at least
`Host.offload_min_batch` tokens (0: never, e.g. KTransformers, or llama.cpp run with
`--no-op-offload`) pays, per layer, the bytes of its selected cold experts over the host link
(h2d_bandwidth) and no CPU time, hand-off or activation round trip; its GPU compute is in the
base step time. A prefill ubatch is such a step.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from solvers.errors import SolverError

OFFLOAD_MIN_BATCH = 32  # llama.cpp's default GGML_OP_OFFLOAD_MIN_BATCH


@dataclass(frozen=True)
class ExpertCurve:
    """Measured seconds of one cold expert of `expert_bytes` over n tokens: `seconds[i]` at
    `tokens[i]` (ascending, from 1)."""

    expert_bytes: float
    tokens: tuple[int, ...]
    seconds: tuple[float, ...]

    def check(self) -> None:
        """SolverError unless the points make a curve: tokens ascending from >= 1, seconds
        positive, finite and not falling."""
        tokens, seconds = np.asarray(self.tokens, float), np.asarray(self.seconds, float)
        if (not np.isfinite(self.expert_bytes) or self.expert_bytes <= 0 or not len(tokens)
                or tokens.shape != seconds.shape or tokens[0] < 1 or np.any(np.diff(tokens) <= 0)
                or not np.all(np.isfinite(seconds)) or seconds[0] <= 0
                or np.any(np.diff(seconds) < 0)):
            raise SolverError(f"an expert curve needs ascending tokens from 1 and positive, "
                              f"non-falling seconds, got {self.tokens} -> {self.seconds}")

    def at(self, tokens: np.ndarray) -> np.ndarray:
        """Seconds of the measured expert at `tokens` (any shape): linear between the points
        and from (0, 0) to the first, along the last segment past the last point."""
        n = np.asarray(tokens, dtype=np.float64)
        x = np.concatenate([[0.0], np.asarray(self.tokens, float)])
        y = np.concatenate([[0.0], np.asarray(self.seconds, float)])
        slope = (y[-1] - y[-2]) / (x[-1] - x[-2])
        return np.where(n <= x[-1], np.interp(n, x, y), y[-1] + slope * (n - x[-1]))


@dataclass(frozen=True)
class Host:
    """The host as the `cpu` execution model sees it.

    memory_bandwidth: bytes/s the CPU streams expert weights from host RAM (roofline).
    flops:            FLOP/s the CPU sustains on the expert matmuls (roofline).
    sync_s:           seconds a layer waits to hand its tokens to the CPU and back, once per
                      layer with any cold expert selected.
    activation_bytes: bytes per token moved each way (hidden_size x 2 bytes, bf16).
    h2d_bandwidth:    bytes/s of the activations' round trip over PCIe, and of the copies of
                      cold experts a GPU computes at offload_min_batch tokens or more.
    curves:           measured expert times (`placer probe --host`); none: the roofline.
    offload_min_batch: steps of this many tokens or more have the GPU compute the cold
                      experts after copying them (0: never; module docstring).
    """

    memory_bandwidth: float
    flops: float
    sync_s: float
    activation_bytes: float
    h2d_bandwidth: float
    curves: tuple[ExpertCurve, ...] = ()
    offload_min_batch: int = OFFLOAD_MIN_BATCH

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
        if not isinstance(self.offload_min_batch, int) or self.offload_min_batch < 0:
            raise SolverError(f"host.offload_min_batch must be an integer >= 0, got "
                              f"{self.offload_min_batch}")
        for curve in self.curves:
            curve.check()

    @property
    def round_trip_s(self) -> float:
        """Seconds to move one token's activations to the host and back."""
        return 2.0 * self.activation_bytes / self.h2d_bandwidth

    def offloads(self, batch: np.ndarray | int) -> np.ndarray:
        """Whether a step of `batch` tokens has the GPU compute its cold experts."""
        batch = np.asarray(batch)
        return (self.offload_min_batch > 0) & (batch >= self.offload_min_batch)

    def expert_seconds(self, expert_bytes: np.ndarray | float,
                       expert_flops: np.ndarray | float,
                       tokens: np.ndarray | float) -> np.ndarray:
        """CPU seconds of cold experts run for `tokens` tokens (broadcasting; 0 where tokens
        is 0): the measured curve nearest in bytes, scaled by bytes, else the roofline."""
        if not self.curves:
            return roofline_seconds(expert_bytes, expert_flops, tokens, self.memory_bandwidth,
                                    self.flops)
        eb = np.asarray(expert_bytes, dtype=np.float64)
        n = np.asarray(tokens, dtype=np.float64)
        measured = np.array([c.expert_bytes for c in self.curves])
        distance = np.abs(np.log(np.maximum(eb, 1.0))[..., None] - np.log(measured))
        nearest = np.broadcast_to(np.argmin(distance, axis=-1), np.broadcast(eb, n).shape)
        out = np.zeros(nearest.shape)
        for i, curve in enumerate(self.curves):
            pick = nearest == i
            out = np.where(pick, curve.at(n) * eb / curve.expert_bytes, out)
        return np.where(n > 0, out, 0.0)


def roofline_seconds(expert_bytes: np.ndarray | float, expert_flops: np.ndarray | float,
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


def step_tokens(tokens: np.ndarray) -> np.ndarray:
    """tokens: [S, B, L, k] -> [S] tokens in each step (those with any expert id)."""
    return (np.asarray(tokens) >= 0).any(axis=(2, 3)).sum(axis=1)


@dataclass(frozen=True)
class CpuLoads:
    """What the host does at each step and layer. All arrays [S, L].

    layer_stall:  seconds the layer waits: CPU time of its selected cold experts, plus
                  sync_s when any ran, plus the waiting tokens' activation round trips; in a
                  step the GPU computes (offload_min_batch), the copies of those experts.
    cold_bytes:   bytes of the selected cold experts (what the CPU reads from host RAM, or
                  what is copied to the GPU).
    cold_experts: selected cold experts (each computed once on the host, or copied once).
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
        seconds = np.where(run, host.expert_seconds(eb, expert_flops, counts), 0.0).sum(axis=2)
        any_cold = run.any(axis=2)
        on_cpu = (seconds + host.sync_s * any_cold
                  + host.round_trip_s * waiting_tokens(part, cold))
        moved = (run * eb).sum(axis=2)
        stall = np.where(host.offloads(step_tokens(part))[:, None],
                         moved / host.h2d_bandwidth, on_cpu)
        parts.append((stall, moved, run.sum(axis=2).astype(np.float64)))
    if not parts:
        empty = np.zeros((0, num_layers))
        return CpuLoads(empty, empty, empty)
    return CpuLoads(*(np.concatenate(p) for p in zip(*parts, strict=True)))


def cpu_rows(expert_bytes: np.ndarray, expert_flops: np.ndarray, host: Host, tokens: np.ndarray,
             weight: float, layer: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """The cpu objective of one layer of sampled steps as weighted "any cold" rows.

    A row is a set of experts (packed bits, [N, ceil(E / 8)] uint8) and a weight in seconds
    that is paid once when any of them is cold: each CPU step's selected set (weight *
    sync_s), each of its tokens' selected set (weight * round_trip_s), and each expert alone
    with the time it would take in the steps that select it (CPU time, or in a step the GPU
    computes its copy over the host link, summed, times weight).
    tokens: [S, B, L, k]; weight: objective weight of one step (profile weight / S).
    Returns (packed rows, weights) lists to concatenate over step sets and merge.
    """
    num_experts = expert_bytes.shape[1]
    tokens = np.asarray(tokens)
    ids = tokens[:, :, layer, :]  # [S, B, k]
    num_steps, batch, _ = ids.shape
    eb, fl = np.asarray(expert_bytes[layer], np.float64), np.asarray(expert_flops[layer])
    rows, weights = [], []
    linear = np.zeros(num_experts)
    chunk = max(1, CHUNK_CELLS // (batch * num_experts))
    for start in range(0, num_steps, chunk):
        part = ids[start:start + chunk]  # [s, B, k]
        gpu = host.offloads(step_tokens(tokens[start:start + chunk]))  # [s]
        s = part.shape[0]
        valid = part >= 0
        token = np.broadcast_to(np.arange(s * batch).reshape(s, batch, 1), part.shape)
        per_token = np.zeros((s * batch, num_experts), dtype=bool)
        per_token[token[valid], part[valid]] = True
        per_step = per_token.reshape(s, batch, num_experts)
        counts = per_step[~gpu].sum(axis=1)  # [CPU steps, E]
        linear += host.expert_seconds(eb, fl, counts).sum(axis=0)
        linear += per_step[gpu].any(axis=1).sum(axis=0) * eb / host.h2d_bandwidth  # copied
        on_cpu = per_step[~gpu].reshape(-1, num_experts)
        real = on_cpu.any(axis=1)
        rows += [np.packbits(counts > 0, axis=1), np.packbits(on_cpu[real], axis=1)]
        weights += [np.full(len(counts), weight * host.sync_s),
                    np.full(int(real.sum()), weight * host.round_trip_s)]
    rows.append(np.packbits(np.eye(num_experts, dtype=bool), axis=1))
    weights.append(weight * linear)
    return rows, weights
