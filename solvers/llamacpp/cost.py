"""What a llama.cpp setup costs at decode: which MoE layers keep their experts in host memory
(`-ot` / `-ncmoe`) and the `--moe-cache-mib` cache for them (solvers/llamacpp/lru.py).

Per decode step s (one ubatch of its B tokens) and MoE layer l, the seconds the step waits on
the layer's experts:

- a layer whose experts are on the GPU: 0 (its compute is in the base step time);
- a host layer whose ubatch goes through the cache (`Fetches.used`): the host reads the
  selection back before the layer can go on (`ggml_backend_synchronize` in the cache's
  `copy`, and the graph split the lookup starts: the spec's per-layer `sync_s`), plus its
  uploads, `runs` copies per expert tensor at the latency of the card the layer runs on
  and the missed experts' bytes at that card's host-to-device bandwidth; hits cost nothing;
- any other host layer: the `cpu` execution model (solvers/cpu.py `cpu_loads`: the CPU
  computes its selected experts, measured curve or roofline, plus the hand-off and the
  activations' round trip), or, at `offload_min_batch` tokens or more, the copy of its
  selected experts over the link (op offload), less the experts the cache holds (llama.cpp's
  `copy_experts` takes those from the banks).

With several GPUs (`-ts`) the layers run one after another, so the step's stall is still the
sum over layers: each card's cached layers over its own link, every host layer without the
cache on the one CPU.

**The spill past VRAM.** Where a card's experts (with its reserves: dense weights, KV cache,
buffers) exceed its VRAM and its box spills (`Machine.spills`: Windows CUDA with the driver's
system memory fallback, HIP on Windows; placer/hardware/spill.py) rather than failing to
load, the overflow lies in host memory and the card reads it over its link whenever a step
touches it. Which bytes the driver moves out is not known; they are taken from the card's
expert weights (the bulk of what it holds, and the bytes a step reads least of), as a
uniform share of them: each step reads that share of the selected experts of its GPU layers
at `spill_rate` x the card's host-to-device bandwidth (fitted to published spilled runs:
placer/hardware/host_fit.py), added to the step's stall (the same bytes' VRAM read
stays in the base step: an over-count of at most the link's over the VRAM's bandwidth, a few
percent). docs/accuracy.md says how this was chosen: a share of everything the card holds,
dense weights included, at the full bandwidth, predicted group C's spilled runs 2x too slow.

A step's cost is split among its tokens equally (solvers.judge.intervals.attribute), so the
intervals here are over sequences like evaluate's, with equal shares per token.

**The CPU share** (`--moe-cache-cpu-share F`, v1.0.0, ggml-org/llama.cpp #30966; read from
`docs/moe-cache.md` at b12191 and the `llama_moe_cache` constructor comment in the
llama-cpp-native 0.32 crate's vendored `src/llama-moe-cache.h`: "cpu_share is the share of
the misses computed on the CPU instead of uploaded"): once the cache is full, "the CPU
computes a share F of the misses while the device computes the hits and uploads the other
misses into the cache"; until it is full every miss is uploaded. The code that picks which
misses go to the CPU (and how F x misses is rounded) could not be read (docs/llamacpp.md);
the reading here: a used fetch of a group whose slots have all been filled by earlier fetches
sends F x misses (the expected count, unrounded) to the CPU and uploads the rest, the two
running at once ("while"), so the fetch costs the selection's read-back plus the longer of
(1 - F) of its uploads and the CPU's share of the time the cpu model gives the layer (its
selected experts, minus the per-layer sync the fetch pays already) in proportion F x misses
over the experts it selects. The replay still puts every miss into the cache (the CPU's
misses are not uploaded, so llama.cpp evicts less than the replay: the prediction errs
towards more misses).

**Pinned or mmap'd host experts** (the same page): `-lm none|mlock|dio` load the host
experts into pinned memory (unless `--no-host`), which "the device uploads at the full speed
of the link"; mmap'd (llama.cpp's default) experts upload slower. A Setup says which
(`pinned`): pinned ones copy at the card's `h2d_bandwidth`, mmap'd ones at its pageable
bandwidth (Machine.pageable; the spec's `h2d_pageable_bandwidth`, else the pinned bandwidth x
PAGEABLE_FACTOR, ESTIMATED), for the cache's uploads and op-offloaded copies alike; the CPU
reads either at the same speed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from solvers.cpu import Host, cpu_loads, step_tokens
from solvers.judge.intervals import (
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
from solvers.llamacpp.lru import (
    Fetches,
    Groups,
    LlamaCppCache,
    cache_groups,
    group_slots,
)

MIB = 1024 * 1024
PAGEABLE_FACTOR = 0.5  # ESTIMATED: mmap'd (pageable) over pinned upload bandwidth, no spec figure


def layer_devices(n_layer: int, tensor_split: Sequence[float]) -> np.ndarray:
    """[n_layer + 1] the GPU of each decoder layer and, last, of the output layer under
    `-ngl all -ts a,b,...`, as ggml-org/llama.cpp `src/llama-model.cpp` `load_tensors` assigns
    them (read at 00342301d01add50835550e8a916f12097d94517; newer builds write i_gpu_start as
    max(n_layer + 1 - ngl, 0), the same 0 with every layer on the GPUs): the `-ts` values
    summed in float into cumulative points, each divided by the sum; with i_gpu_start 0 and
    act_gpu_layers n_layer + 1, layer il goes to device upper_bound(points,
    float(il) / (n_layer + 1)), and the output layer is il = n_layer of the same rule (so the
    last device with a share); the input embeddings stay on the CPU. A layer's tensors then
    take its device's buffer types unless an `-ot` pattern matches first. E.g. 24 layers,
    -ts 1,1: points 0.5, 1; il / 25 >= 0.5 from il = 13, so layers 0-12 go to device 0,
    13-23 and the output to device 1."""
    split = np.asarray(tensor_split, dtype=np.float32)
    if split.ndim != 1 or not len(split) or (split < 0).any() or not split.sum() > 0:
        raise ValueError(f"tensor_split must be >= 0 with a positive sum, got {tensor_split!r}")
    points = np.cumsum(split, dtype=np.float32)  # float split_sum, accumulated in order
    points = points / points[-1]
    where = np.arange(n_layer + 1, dtype=np.float32) / np.float32(n_layer + 1)
    return np.searchsorted(points, where, side="right").astype(np.int64)


@dataclass(frozen=True)
class Machine:
    """The model and the box as the cost needs them.

    expert_bytes, expert_flops: [L, E] of each routed expert; layout: [L] (key, nb2) of each
    MoE layer's expert tensors (solvers.llamacpp.lru.cache_groups); top_k: the router's k;
    capacity: VRAM bytes for expert layers and the cache's banks, per GPU ([D], or one number
    for one card); bandwidth, latency_s: each GPU's host-to-device copies (likewise);
    alignment: the buffer alignment; host: the one CPU (solvers.cpu.Host) that computes every
    GPU's host layers; device: [L] the GPU of each MoE layer (layer_devices; empty: all on
    GPU 0); tensor_split: the `-ts` proportions that also split the cache over the GPUs
    (None: one GPU)."""

    expert_bytes: np.ndarray
    expert_flops: np.ndarray
    layout: tuple
    top_k: int
    capacity: int | tuple[int, ...]
    bandwidth: float | tuple[float, ...]
    latency_s: float | tuple[float, ...]
    alignment: int
    host: Host
    device: tuple[int, ...] = ()
    tensor_split: tuple[float, ...] | None = None
    pageable: float | tuple[float | None, ...] | None = None
    cache: type = LlamaCppCache  # the build's cache (solvers/llamacpp/builds.py cache_class)
    alloc_limit: int | tuple[int, ...] = 0  # bytes of one GPU's largest allocation (0: none)
    spills: bool | tuple[bool, ...] = False  # past its VRAM a GPU spills (else: fails to load)
    vram: int | tuple[int, ...] = 0  # each GPU's VRAM (bytes), for the spill
    reserved: int | tuple[int, ...] = 0  # bytes each GPU holds beside its experts
    spill_rate: float = 1.0  # the share of `bandwidth` a GPU reads its spilled bytes at

    def upload_bandwidth(self, pinned: bool) -> np.ndarray:
        """[D] bytes/s of each GPU's uploads from pinned host experts (`bandwidth`) or from
        mmap'd ones (`pageable`, per GPU; None: bandwidth x PAGEABLE_FACTOR, ESTIMATED)."""
        pinned_bw = self.per_device(self.bandwidth)
        if pinned:
            return pinned_bw
        given = np.broadcast_to(np.asarray(self.pageable, dtype=object), pinned_bw.shape)
        return np.array([PAGEABLE_FACTOR * bw if g is None else min(float(g), bw)
                         for g, bw in zip(given, pinned_bw, strict=True)])

    @property
    def layer_bytes(self) -> np.ndarray:
        """[L] expert bytes of each MoE layer."""
        return np.asarray(self.expert_bytes, dtype=np.int64).sum(axis=1)

    @property
    def layer_device(self) -> np.ndarray:
        """[L] the GPU of each MoE layer."""
        if self.device:
            return np.asarray(self.device, dtype=np.int64)
        return np.zeros(len(self.layer_bytes), dtype=np.int64)

    def per_device(self, value: float | tuple[float, ...]) -> np.ndarray:
        """[D] of a per-GPU field (one number: the same on every GPU)."""
        count = max(int(self.layer_device.max(initial=0)) + 1,
                    len(self.tensor_split or ()), np.size(self.capacity))
        return np.broadcast_to(np.asarray(value, dtype=np.float64), (count,))

    def groups(self, host_layers: np.ndarray) -> Groups:
        """The cache's groups when `host_layers` ([L] bool) keep their experts on the host."""
        return cache_groups(np.where(host_layers, self.layer_device, -1), self.layout,
                            self.expert_bytes.shape[1])

    def gpu_bytes(self, host_layers: np.ndarray) -> np.ndarray:
        """[D] expert bytes each GPU holds for its layers that are not host layers."""
        gpu = ~np.asarray(host_layers, dtype=bool)
        return np.bincount(self.layer_device[gpu], weights=self.layer_bytes[gpu],
                           minlength=len(self.per_device(self.capacity)))

    def spill_bytes(self, host_layers: np.ndarray) -> np.ndarray:
        """[D] bytes past each GPU's VRAM (its reserves and experts over it) where it spills,
        at most its experts' bytes (0 where it fits or does not spill)."""
        experts = self.gpu_bytes(host_layers)
        over = self.per_device(self.reserved) + experts - self.per_device(self.vram)
        spills = self.per_device(self.spills).astype(bool) & (self.per_device(self.vram) > 0)
        return np.where(spills, np.clip(over, 0.0, experts), 0.0)

    def spill_share(self, host_layers: np.ndarray) -> np.ndarray:
        """[D] the share of each GPU's expert bytes in host memory (module docstring)."""
        return self.spill_bytes(host_layers) / np.maximum(self.gpu_bytes(host_layers), 1.0)

    def bank_room(self, host_layers: np.ndarray) -> int:
        """The largest cache (bytes) whose banks fit beside the experts of the GPU layers:
        llama.cpp gives each GPU with host layers its -ts share of the cache, which may not
        pass the GPU's largest allocation (`alloc_limit`: a Vulkan device's; llama.cpp aborts
        at load above it)."""
        host = np.asarray(host_layers, dtype=bool)
        room = self.per_device(self.capacity) - self.gpu_bytes(host)
        cached = np.bincount(self.layer_device[host], minlength=len(room)) > 0
        if not cached.any():
            return int(room.min())
        limit = self.per_device(self.alloc_limit)
        room = np.where(limit > 0, np.minimum(room, limit), room)
        split = self.per_device(self.tensor_split or 1.0)[cached]
        return int(np.floor((room[cached] * split.sum() / split).min()))


@dataclass(frozen=True)
class Setup:
    """One way to run llama.cpp: `host` [L] bool, the MoE layers whose experts stay in host
    memory, and `cache_mib` (0: no --moe-cache-mib); `slots` [G] of its groups; `cpu_share`
    (--moe-cache-cpu-share, 0 without it); `pinned`: the host experts pinned (`-lm none`)
    rather than mmap'd (llama.cpp's default)."""

    name: str
    host: np.ndarray
    cache_mib: int = 0
    slots: tuple[int, ...] = ()
    cpu_share: float = 0.0
    pinned: bool = True

    @property
    def host_layers(self) -> list[int]:
        return [int(i) for i in np.flatnonzero(self.host)]


def with_cache(machine: Machine, name: str, host: np.ndarray, cache_mib: int,
               cpu_share: float = 0.0, pinned: bool = True) -> Setup:
    """A Setup with its slot counts (SolverError where llama.cpp refuses the cache)."""
    if cache_mib == 0:
        return Setup(name, np.asarray(host, dtype=bool), pinned=pinned)
    groups = machine.groups(host)
    slots = group_slots(cache_mib * MIB, groups, machine.top_k,
                        tensor_split=machine.tensor_split, alignment=machine.alignment)
    return Setup(name, np.asarray(host, dtype=bool), int(cache_mib), tuple(map(int, slots)),
                 float(cpu_share), pinned)


@dataclass(frozen=True)
class HostCosts:
    """The cpu model's figures of every MoE layer as if it were a host layer, for one set of
    steps ([S, L] each): stall, bytes the CPU reads or copies, experts it computes or
    copies, bytes of the experts each step selects; offloaded: [S] whether a step is
    op-offloaded."""

    stall: np.ndarray
    moved: np.ndarray
    experts: np.ndarray
    offloaded: np.ndarray
    layer_selected: np.ndarray

    @property
    def selected(self) -> np.ndarray:
        """[S] bytes of the experts each step selects (any setup's)."""
        return self.layer_selected.sum(axis=1)


def host_costs(machine: Machine, tokens: np.ndarray) -> HostCosts:
    """HostCosts of `tokens` ([S, B, L, k] expert ids, -1: none). Layers are independent
    under the cpu model, so a host set's cost without a cache is a column sum of these."""
    eb = np.asarray(machine.expert_bytes)
    loads = cpu_loads(eb, machine.expert_flops, machine.host, np.ones(eb.shape, dtype=bool),
                      tokens)
    selected = np.zeros((len(tokens), tokens.shape[2]))
    for layer in range(tokens.shape[2]):
        ids = tokens[:, :, layer, :]
        mask = np.zeros((len(tokens), eb.shape[1]), dtype=bool)
        step, _, _ = np.nonzero(ids >= 0)
        mask[step, ids[ids >= 0]] = True
        selected[:, layer] = mask @ np.asarray(eb[layer], dtype=np.float64)
    return HostCosts(loads.layer_stall, loads.cold_bytes, loads.cold_experts,
                     machine.host.offloads(step_tokens(tokens)), selected)


def step_costs(machine: Machine, setup: Setup, tokens: np.ndarray,
               costs: HostCosts | None = None, replays: dict | None = None) -> np.ndarray:
    """[S, 4] FIELDS of each step under `setup`: stall seconds, bytes staged or read by the
    CPU, experts staged or computed on the CPU, bytes of the selected experts. The cache is
    the build's (Machine.cache); `replays`: a memo of cache replays by (host layers, slots,
    tokens), shared by setups that differ only in CPU share or pinning."""
    tokens = np.asarray(tokens)
    costs = costs or host_costs(machine, tokens)
    eb = np.asarray(machine.expert_bytes, dtype=np.float64)
    host = np.asarray(setup.host, dtype=bool)
    stall, moved, experts = costs.stall.copy(), costs.moved.copy(), costs.experts.copy()
    # op-offloaded copies at the upload bandwidth of pinned or mmap'd host experts
    slow = (machine.per_device(machine.bandwidth)
            / machine.upload_bandwidth(setup.pinned))[machine.layer_device]
    stall = np.where(costs.offloaded[:, None], stall * slow[None], stall)
    if setup.cache_mib:
        key = (host.tobytes(), setup.slots, id(tokens))
        fetches, held = (replays or {}).get(key, (None, None))
        if fetches is None:
            fetches = machine.cache(machine.groups(host), setup.slots, machine.top_k).replay(
                tokens, held=True)
            held = (fetches.held * eb[None]).sum(axis=2)
            if replays is not None:
                replays[key] = fetches, held
        copied = (moved - held) / machine.host.h2d_bandwidth * slow[None]
        stall = np.where(costs.offloaded[:, None], copied, stall)
        moved = np.where(costs.offloaded[:, None], moved - held, moved)
        cached = cache_stall(machine, setup, fetches, costs.stall)
        stall = np.where(fetches.used, cached, stall)
        moved = np.where(fetches.used, fetches.misses * eb.max(axis=1)[None], moved)
        experts = np.where(fetches.used, fetches.misses, experts)
    return np.stack([stall[:, host].sum(axis=1) + spill_stall(machine, host, costs),
                     moved[:, host].sum(axis=1), experts[:, host].sum(axis=1), costs.selected],
                    axis=1)


def spill_stall(machine: Machine, host: np.ndarray, costs: HostCosts) -> np.ndarray:
    """[S] seconds each step reads its GPUs' spilled share over their links (module
    docstring): the share x the selected experts of each GPU's layers, at its bandwidth."""
    share = machine.spill_share(host)
    if not share.any():
        return np.zeros(len(costs.layer_selected))
    gpu = np.where(host, -1, machine.layer_device)
    read = np.stack([costs.layer_selected[:, gpu == d].sum(axis=1) for d in range(len(share))],
                    axis=1)
    rate = machine.spill_rate * machine.per_device(machine.bandwidth)
    return (read * (share / rate)[None]).sum(axis=1)


def cache_stall(machine: Machine, setup: Setup, fetches: Fetches,
                cpu_stall: np.ndarray | None = None) -> np.ndarray:
    """[S, L] seconds of the fetches that went through the cache: the selection's read-back
    (sync_s), `runs` uploads per expert tensor at the latency of the layer's GPU, the misses'
    bytes at its upload bandwidth (pinned or mmap'd); with a CPU share, once the group is
    full, the longer of (1 - F) of those uploads and the CPU's share (module docstring; its
    time from `cpu_stall` [S, L], the cpu model's time of each layer on the host)."""
    groups = machine.groups(setup.host)
    tensors = np.array([len(groups.expert_bytes[g]) if g >= 0 else 0
                        for g in groups.layer_group])
    per_miss = np.array([groups.slot_bytes(g) if g >= 0 else 0 for g in groups.layer_group])
    latency = machine.per_device(machine.latency_s)[machine.layer_device]
    bandwidth = machine.upload_bandwidth(setup.pinned)[machine.layer_device]
    upload = (fetches.runs * tensors[None] * latency[None]
              + fetches.misses * per_miss[None] / bandwidth[None])
    if not setup.cpu_share or cpu_stall is None:
        return machine.host.sync_s + upload
    share = np.where(cache_full(groups.layer_group, setup.slots, fetches), setup.cpu_share, 0.0)
    selected = np.maximum(fetches.hits + fetches.misses, 1)
    cpu = (share * fetches.misses / selected
           * np.maximum(np.asarray(cpu_stall) - machine.host.sync_s, 0.0))
    return machine.host.sync_s + np.maximum((1.0 - share) * upload, cpu)


def cache_full(layer_group: Sequence[int], slots: Sequence[int], fetches: Fetches
               ) -> np.ndarray:
    """[S, L] whether each fetch finds its group's slots all filled by earlier steps' misses
    (a group fills from empty; every miss takes a slot until none is left)."""
    layer_group = np.asarray(layer_group)
    full = np.zeros(fetches.misses.shape, dtype=bool)
    for g, n in enumerate(slots):
        mine = layer_group == g
        if not mine.any():
            continue
        filled = np.cumsum(fetches.misses[:, mine].sum(axis=1)) - fetches.misses[:, mine].sum(
            axis=1)
        full[:, mine] = (filled >= n)[:, None]
    return full


@dataclass(frozen=True)
class Judged:
    """Setups replayed on one set of steps at concurrency `batch`: each setup's figures with
    95% intervals (solvers.judge.intervals.line_figures) and its stall estimate; the resampling
    units (solvers.judge.intervals.Units) and the tokens replayed."""

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
    figures, stall, replays = {}, {}, {}
    for setup in setups:
        sums = attribute(units.unit_of, step_costs(machine, setup, tokens, costs, replays),
                         units.count)
        figures[setup.name], stall[setup.name] = line_figures(
            sums, units.tokens(), weights, tokens.shape[1], base_step_s)
        if not estimable(units):
            figures[setup.name] = without_intervals(figures[setup.name])
    return Judged(tokens.shape[1], figures, stall, units)

