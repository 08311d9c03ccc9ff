"""What a llama.cpp setup costs at decode: which MoE layers keep their experts in host memory
(`-ot` / `-ncmoe`) and the `--moe-cache-mib` cache for them (solvers/cache/llamacpp.py).

Per decode step s (one ubatch of its B tokens) and MoE layer l, the seconds the step waits on
the layer's experts:

- a layer whose experts are on the GPU: 0 (its compute is in the base step time);
- a host layer whose ubatch goes through the cache (`Fetches.used`): the host reads the
  selection back before the layer can go on (`ggml_backend_synchronize` in the cache's
  `copy`, and the graph split the lookup starts: the spec's per-layer `sync_s`), plus its
  uploads, `runs` copies per expert tensor at the card's latency each and the missed experts'
  bytes at its host-to-device bandwidth; hits cost nothing;
- any other host layer: the `cpu` execution model (solvers/cpu.py `cpu_loads`: the CPU
  computes its selected experts, measured curve or roofline, plus the hand-off and the
  activations' round trip), or, at `offload_min_batch` tokens or more, the copy of its
  selected experts over the link (op offload), less the experts the cache holds (llama.cpp's
  `copy_experts` takes those from the banks).

A step's cost is split among its tokens equally (solvers.intervals.attribute), so the
intervals here are over sequences like evaluate's, with equal shares per token.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from solvers.cache.llamacpp import Fetches, Groups, LlamaCppCache, cache_groups, group_slots
from solvers.cpu import Host, cpu_loads, step_tokens
from solvers.intervals import (
    REPLICATES,
    Estimate,
    Units,
    attribute,
    estimable,
    line_figures,
    replicate_weights,
    units_of,
    without_intervals,
)

MIB = 1024 * 1024


@dataclass(frozen=True)
class Machine:
    """The model and the box as the cost needs them.

    expert_bytes, expert_flops: [L, E] of each routed expert; layout: [L] (key, nb2) of each
    MoE layer's expert tensors (solvers.cache.llamacpp.cache_groups); top_k: the router's k;
    capacity: VRAM bytes for expert layers and the cache's banks on the one card;
    bandwidth, latency_s: the card's host-to-device copies; alignment: its buffer alignment;
    host: the CPU (solvers.cpu.Host)."""

    expert_bytes: np.ndarray
    expert_flops: np.ndarray
    layout: tuple
    top_k: int
    capacity: int
    bandwidth: float
    latency_s: float
    alignment: int
    host: Host

    @property
    def layer_bytes(self) -> np.ndarray:
        """[L] expert bytes of each MoE layer."""
        return np.asarray(self.expert_bytes, dtype=np.int64).sum(axis=1)

    def groups(self, host_layers: np.ndarray) -> Groups:
        """The cache's groups when `host_layers` ([L] bool) keep their experts on the host."""
        return cache_groups(np.where(host_layers, 0, -1), self.layout,
                            self.expert_bytes.shape[1])

    def bank_room(self, host_layers: np.ndarray) -> int:
        """VRAM left for the cache's banks beside the experts of the GPU layers."""
        return int(self.capacity - self.layer_bytes[~np.asarray(host_layers)].sum())


@dataclass(frozen=True)
class Setup:
    """One way to run llama.cpp: `host` [L] bool, the MoE layers whose experts stay in host
    memory, and `cache_mib` (0: no --moe-cache-mib); `slots` [G] of its groups."""

    name: str
    host: np.ndarray
    cache_mib: int = 0
    slots: tuple[int, ...] = ()

    @property
    def host_layers(self) -> list[int]:
        return [int(i) for i in np.flatnonzero(self.host)]


def with_cache(machine: Machine, name: str, host: np.ndarray, cache_mib: int) -> Setup:
    """A Setup with its slot counts (SolverError where llama.cpp refuses the cache)."""
    if cache_mib == 0:
        return Setup(name, np.asarray(host, dtype=bool))
    groups = machine.groups(host)
    slots = group_slots(cache_mib * MIB, groups, machine.top_k, alignment=machine.alignment)
    return Setup(name, np.asarray(host, dtype=bool), int(cache_mib), tuple(map(int, slots)))


@dataclass(frozen=True)
class HostCosts:
    """The cpu model's figures of every MoE layer as if it were a host layer, for one set of
    steps ([S, L] each): stall, bytes the CPU reads or copies, experts it computes or
    copies; offloaded: [S] whether a step is op-offloaded."""

    stall: np.ndarray
    moved: np.ndarray
    experts: np.ndarray
    offloaded: np.ndarray


def host_costs(machine: Machine, tokens: np.ndarray) -> HostCosts:
    """HostCosts of `tokens` ([S, B, L, k] expert ids, -1: none). Layers are independent
    under the cpu model, so a host set's cost without a cache is a column sum of these."""
    eb = np.asarray(machine.expert_bytes)
    loads = cpu_loads(eb, machine.expert_flops, machine.host, np.ones(eb.shape, dtype=bool),
                      tokens)
    return HostCosts(loads.layer_stall, loads.cold_bytes, loads.cold_experts,
                     machine.host.offloads(step_tokens(tokens)))


def step_costs(machine: Machine, setup: Setup, tokens: np.ndarray,
               costs: HostCosts | None = None) -> np.ndarray:
    """[S, 4] FIELDS of each step under `setup`: stall seconds, bytes staged or read by the
    CPU, experts staged or computed on the CPU, bytes of the selected experts."""
    tokens = np.asarray(tokens)
    costs = costs or host_costs(machine, tokens)
    eb = np.asarray(machine.expert_bytes, dtype=np.float64)
    host = np.asarray(setup.host, dtype=bool)
    stall, moved, experts = costs.stall.copy(), costs.moved.copy(), costs.experts.copy()
    if setup.cache_mib:
        fetches = LlamaCppCache(machine.groups(host), setup.slots, machine.top_k).replay(
            tokens, held=True)
        held = (fetches.held * eb[None]).sum(axis=2)
        copied = (moved - held) / machine.host.h2d_bandwidth
        stall = np.where(costs.offloaded[:, None], copied, stall)
        moved = np.where(costs.offloaded[:, None], moved - held, moved)
        cached = cache_stall(machine, setup, fetches)
        stall = np.where(fetches.used, cached, stall)
        moved = np.where(fetches.used, fetches.misses * eb.max(axis=1)[None], moved)
        experts = np.where(fetches.used, fetches.misses, experts)
    selected = np.zeros(len(tokens))
    for layer in range(tokens.shape[2]):
        ids = tokens[:, :, layer, :]
        mask = np.zeros((len(tokens), eb.shape[1]), dtype=bool)
        step, _, _ = np.nonzero(ids >= 0)
        mask[step, ids[ids >= 0]] = True
        selected += mask @ eb[layer]
    return np.stack([stall[:, host].sum(axis=1), moved[:, host].sum(axis=1),
                     experts[:, host].sum(axis=1), selected], axis=1)


def cache_stall(machine: Machine, setup: Setup, fetches: Fetches) -> np.ndarray:
    """[S, L] seconds of the fetches that went through the cache: the selection's read-back
    (sync_s), `runs` uploads per expert tensor at the card's latency, the misses' bytes at its
    bandwidth."""
    groups = machine.groups(setup.host)
    tensors = np.array([len(groups.expert_bytes[g]) if g >= 0 else 0
                        for g in groups.layer_group])
    per_miss = np.array([groups.slot_bytes(g) if g >= 0 else 0 for g in groups.layer_group])
    return (machine.host.sync_s + fetches.runs * tensors[None] * machine.latency_s
            + fetches.misses * per_miss[None] / machine.bandwidth)


@dataclass(frozen=True)
class Judged:
    """Setups replayed on one set of steps at concurrency `batch`: each setup's figures with
    95% intervals (solvers.intervals.line_figures) and its stall estimate; the resampling
    units (solvers.intervals.Units) and the tokens replayed."""

    batch: int
    figures: dict[str, dict]
    stall: dict[str, Estimate]
    units: Units

    @property
    def estimable(self) -> bool:
        return estimable(self.units)

    def ratio(self, name: str, other: str) -> tuple[float, list[float] | None]:
        """Stall of `name` over `other`'s, with its paired 95% interval."""
        r = self.stall[name].ratio_to(self.stall[other])
        return r.point, r.ci95() if self.estimable else None


def judge(machine: Machine, setups: list[Setup], tokens: np.ndarray, seqs: np.ndarray,
          base_step_s: float, replicates: int = REPLICATES, seed: int = 0) -> Judged:
    """Replay `tokens` ([S, B, L, k]; seqs [S, B] sequence ids) under every setup, with
    paired bootstrap intervals over sequences."""
    units = units_of(seqs)
    weights = replicate_weights(units.count, replicates, seed)
    costs = host_costs(machine, tokens)
    figures, stall = {}, {}
    for setup in setups:
        sums = attribute(units.unit_of, step_costs(machine, setup, tokens, costs), units.count)
        figures[setup.name], stall[setup.name] = line_figures(
            sums, units.tokens(), weights, tokens.shape[1], base_step_s)
        if not estimable(units):
            figures[setup.name] = without_intervals(figures[setup.name])
    return Judged(tokens.shape[1], figures, stall, units)

