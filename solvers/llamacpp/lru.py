"""llama.cpp's own expert cache (`--moe-cache-mib N`), replayed as its code runs.

Read from ggml-org/llama.cpp @4b060f27a806dab2072a66007607f0e98b6b9b40,
`src/llama-moe-cache.cpp` (`moe_cache_lru::plan`, `llama_moe_cache::impl::impl`,
`get_slot_map`, `copy`, `log_stats`); the flag (`common/arg.cpp`) gives N * 1024 * 1024 bytes.
No code of it is here; what it does:

- Which layers: those whose expert tensors (`ffn_gate_up_exps` or `ffn_gate_exps` and
  `ffn_up_exps`, and `ffn_down_exps`; not their biases) all live in host memory while the
  layer is assigned to a GPU. Layers of one device whose expert tensors have the same type,
  shape and per-expert stride (`nb[2]`) form a group, in the order of their first layer;
  a group shares one set of device banks and ONE LRU (keyed layer * E + expert). So the
  layers of a group evict each other: at concurrency 8 gpt-oss's 24 layers touch about 480
  keys a step, a scan longer than most such caches.
- Slots (`group_slots`): the budget goes to the devices with host experts in proportion to
  `--tensor-split`, or by default to their free memory (1 each when none reports it); a
  device's share goes to its groups in proportion to their host bytes, computed in double
  precision in that order and truncated. A group takes the most slots n (at most its layers x
  E) whose banks fit: sum over its expert tensors of GGML_PAD(nb[2] * (n + 1), alignment),
  one slot more than it uses (CUDA's MMQ may read past the last expert), each bank padded
  to the buffer type's alignment (CUDA 128 bytes). A group with fewer than n_expert_used
  slots is not cached (a warning); when no group is left, the context fails ("MoE cache is
  too small to hold the experts of one token"); with no host layer at all the cache is off.
- A fetch (`copy`: one ubatch at one layer of a cached group): the ubatch's selected ids, in
  the order of the selection tensor (token by token, the top-k in router order), deduplicated
  in order of first appearance; every hit moves to the LRU's tail in that order; then the
  misses, in ascending expert id, each take the head slot (evicting whatever expert of any
  layer of the group it held) and move to the tail. The hits went to the tail first, so a
  fetch never evicts an expert it uses. The misses are uploaded per expert tensor in runs of
  consecutive experts going to consecutive slots (one copy per run and tensor), after the
  host has synchronized on the selection (one round trip per cached layer and ubatch).
- Which ubatches use it (`get_slot_map`): at each layer, those of 1 .. 32 tokens with
  min(tokens * n_expert_used, E) <= the group's slots. Other ubatches leave the LRU as it is:
  they run the layer on the host experts (on the CPU, or op-offloaded at 32+ tokens, where
  `copy_experts` takes the experts the cache holds from its banks instead of over the link).
  The tokens are those the layer computes, not the ubatch's: a prompt's last layer computes
  only its output rows (llama.cpp's graphs keep only the `inp_out_ids` rows before the last
  layer's FFN; `build_moe_ffn` takes n_tokens = cur->ne[1], ggml-org/llama.cpp@434f71a5
  src/llama-graph.cpp), so a prompt of P tokens decoded with one output looks its last
  layer up with 1 token, whatever P: at slots >= k that lookup goes through the cache even
  where P * k experts do not fit, and a prompt of more than 32 tokens still fetches there.
  `layer_tokens` counts them per layer (a token with no id at a layer is not computed
  there). These were the "28 more lookups" a b11669 bench logged at 4 and 14 slots of a
  16-expert top-4 GGUF (7 prompts x the 4 experts of their last layer's output token); at
  19 and 29 slots every prompt fit and the counts were equal already.
- Its log (`log_stats`): hits and misses count distinct experts per fetch, `ubatch <= 8`
  where the lookup's selection holds at most 8 x n_expert_used ids (`copy`: `ids.size() <=
  8*n_expert_used`, the elements of the selection tensor: the layer's tokens x k),
  `ubatch  > 8` for the rest; uploaded bytes are the misses' nb[2] summed over the expert
  tensors.

Use: `groups = cache_groups(device, layout, E)`, `slots = group_slots(N * MIB, groups, k)`,
`fetches = LlamaCppCache(groups, slots, k).replay(tokens)` with tokens [S, B, L, k] the ids
of each ubatch in the order llama.cpp's selection tensor holds them, then
`log_stats(fetches, layer_tokens(tokens), groups)` gives the (hits, misses, uploaded bytes) of
llama.cpp's two exit log lines, to compare with a real run's.

The replay is compiled (numba): solvers/llamacpp/walk.py walks the ubatches, the fetch as
described above, with the LRU's kernels (`lru_use`, `lru_victim`) beside ClassLRU's, as
numba's per-file cache needs (solvers/cache/kernels.py says why that matters).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np

from solvers.errors import SolverError
from solvers.llamacpp.walk import walk

MIB = 1024 * 1024          # --moe-cache-mib N reserves N * MIB bytes
MAX_BATCH = 32             # impl::max_batch: larger ubatches only read the cache
SMALL_UBATCH = 8           # log_stats' "ubatch <= 8" line
CUDA_ALIGNMENT = 128       # ggml-cuda's buffer type alignment
TOO_SMALL = "MoE cache is too small to hold the experts of one token"


def ggml_pad(x: int, n: int) -> int:
    """GGML_PAD: x rounded up to a multiple of n."""
    return (x + n - 1) // n * n


@dataclass(frozen=True)
class Groups:
    """The cache's groups of layers, in llama.cpp's order (that of their first layer).

    layer_group:  [L] group of each MoE layer (ordinal), -1 where the layer is not cached.
    device:       [G] GPU (index among the cache's GPU devices) of each group.
    expert_bytes: [G][P] nb[2] of each expert tensor of the group (bytes of one expert).
    num_layers:   [G] layers of each group.
    num_experts:  experts per layer (E; every layer of a group has the same).
    """

    layer_group: np.ndarray
    device: tuple[int, ...]
    expert_bytes: tuple[tuple[int, ...], ...]
    num_layers: tuple[int, ...]
    num_experts: int

    @property
    def host_bytes(self) -> list[int]:
        """[G] bytes of each group's host experts (ggml_nbytes of its contiguous tensors)."""
        return [n * self.num_experts * sum(b)
                for n, b in zip(self.num_layers, self.expert_bytes, strict=True)]

    def slot_bytes(self, group: int) -> int:
        """Bytes one expert uploads into group `group` (its tensors' nb[2] summed)."""
        return sum(self.expert_bytes[group])


def cache_groups(device: Sequence[int], layout: Sequence[tuple[Hashable, tuple[int, ...]]],
                 num_experts: int) -> Groups:
    """Group MoE layers as llama.cpp does.

    device: [L] the GPU each layer is assigned to, -1 where its experts are not all in host
    memory (or the layer runs on the CPU): such a layer is not cached.
    layout: [L] (key, nb2) of each layer: `key` anything equal exactly where llama.cpp's
    layouts are the same (the expert tensors' types and shapes, in order), `nb2` the bytes
    of one expert of each of its expert tensors (gate, up, down or gate_up, down)."""
    layer_group = np.full(len(device), -1, dtype=np.int64)
    keys: list[tuple[int, Hashable, tuple[int, ...]]] = []
    layers: list[int] = []
    for il, (d, (key, nb2)) in enumerate(zip(device, layout, strict=True)):
        if d < 0:
            continue
        me = (int(d), key, tuple(int(b) for b in nb2))
        if me not in keys:
            keys.append(me)
            layers.append(0)
        g = keys.index(me)
        layer_group[il] = g
        layers[g] += 1
    return Groups(layer_group, tuple(k[0] for k in keys), tuple(k[2] for k in keys),
                  tuple(layers), int(num_experts))


def group_budgets(cache_bytes: int, groups: Groups, free_bytes: Sequence[float] | None = None,
                  tensor_split: Sequence[float] | None = None) -> np.ndarray:
    """[G] bytes of a cache of `cache_bytes` (N MiB: N * MIB) each group may fill.

    free_bytes: [D] free memory each GPU reports when the context is made (used when
    tensor_split is None or all 0; None or all 0: the devices report none, 1 each);
    tensor_split: [D] `--tensor-split` proportions."""
    num_devices = max(groups.device, default=-1) + 1
    for arr in (free_bytes, tensor_split):
        if arr is not None:
            num_devices = max(num_devices, len(arr))
    host = [0] * num_devices
    for g, b in enumerate(groups.host_bytes):
        host[groups.device[g]] += b
    by_free = tensor_split is None or all(x == 0.0 for x in tensor_split)
    weights = free_bytes if by_free else tensor_split
    split = [float(weights[d]) if host[d] > 0 and weights is not None and d < len(weights)
             else 0.0 for d in range(num_devices)]
    split_sum = sum(split)
    if split_sum == 0.0:
        split = [1.0 if h > 0 else 0.0 for h in host]
        split_sum = sum(split)
    return np.array([int(float(cache_bytes) * split[d] / split_sum * float(gb) / float(host[d]))
                     for d, gb in zip(groups.device, groups.host_bytes, strict=True)],
                    dtype=np.int64)


def group_slots(cache_bytes: int, groups: Groups, n_expert_used: int,
                free_bytes: Sequence[float] | None = None,
                tensor_split: Sequence[float] | None = None,
                alignment: Sequence[int] | int = CUDA_ALIGNMENT) -> np.ndarray:
    """[G] slots of each group for a cache of `cache_bytes`, 0 where a group is refused
    (fewer slots than n_expert_used). free_bytes, tensor_split: as group_budgets;
    alignment: [D] (or one for all) the devices' buffer alignment. SolverError when groups
    exist but every one is refused (llama.cpp then fails to make the context)."""
    if not groups.device:
        return np.zeros(0, dtype=np.int64)
    budgets = group_budgets(cache_bytes, groups, free_bytes, tensor_split)
    out = np.zeros(len(budgets), dtype=np.int64)
    for g, budget in enumerate(budgets):
        d = groups.device[g]
        align = int(alignment) if isinstance(alignment, int | np.integer) else alignment[d]
        n = fitting_slots(int(budget), groups.expert_bytes[g], int(align),
                          groups.num_layers[g] * groups.num_experts)
        out[g] = n if n >= n_expert_used else 0
    if not out.any():
        raise SolverError(f"{TOO_SMALL}: {cache_bytes / MIB:g} MiB give no group of host "
                          f"layers {n_expert_used} slots")
    return out


def bank_bytes(nb2: Sequence[int], slots: int, alignment: int) -> int:
    """Device bytes of a group's banks with `slots` slots (alloc_size: one slot extra)."""
    return sum(ggml_pad(b * (slots + 1), alignment) for b in nb2)


def fitting_slots(budget: int, nb2: Sequence[int], alignment: int, max_slots: int) -> int:
    """The most slots n <= max_slots with bank_bytes(n) <= budget (the constructor counts up
    one at a time; bank_bytes only grows, so start near the answer)."""
    n = max(0, min(max_slots, budget // max(1, sum(nb2)) - 1))
    while n > 0 and bank_bytes(nb2, n, alignment) > budget:
        n -= 1
    while n < max_slots and bank_bytes(nb2, n + 1, alignment) <= budget:
        n += 1
    return n


def cache_mib_for_slots(groups: Groups, slots: int, group: int = 0,
                        alignment: int = CUDA_ALIGNMENT) -> int:
    """The smallest --moe-cache-mib that gives `group` of a one-device cache `slots` slots
    (every group then holds about the same share of its experts)."""
    if not 0 < slots <= groups.num_layers[group] * groups.num_experts:
        raise ValueError(f"group {group} holds 1 .. {groups.num_layers[group]} x "
                         f"{groups.num_experts} slots, not {slots}")
    need = bank_bytes(groups.expert_bytes[group], slots, alignment)
    total = sum(groups.host_bytes)
    mib = max(1, need * total // (groups.host_bytes[group] * MIB))
    while fitting_slots(int(group_budgets(mib * MIB, groups)[group]),
                        groups.expert_bytes[group], alignment,
                        groups.num_layers[group] * groups.num_experts) < slots:
        mib += 1
    return int(mib)


@dataclass(frozen=True)
class Fetches:
    """What the cache did with S ubatches (steps), per MoE layer (ordinal) l.

    used:  [S, L] bool: the ubatch went through the layer's cache (LRU updated, misses
           uploaded); False where the layer is not cached or the ubatch may not use it.
    hits:  [S, L] int: distinct selected experts the cache held (used fetches only).
    misses:[S, L] int: distinct selected experts uploaded (used fetches only).
    runs:  [S, L] int: upload copies per expert tensor (runs of consecutive experts to
           consecutive slots).
    held:  [S, L, E] bool: the selected experts the cache held when the fetch came (for a
           fetch that did not use it: what copy_experts would find there, unchanged); None
           unless asked for (`replay(..., held=True)`).
    """

    used: np.ndarray
    hits: np.ndarray
    misses: np.ndarray
    runs: np.ndarray
    held: np.ndarray | None


class LlamaCppCache:
    """The LRUs of one llama.cpp MoE cache: `groups` with `slots` [G] slots each (0: not
    cached), E experts per layer, `n_expert_used` the graph's top-k. State carries across
    `replay` calls, so long traffic can go in chunks.

    A policy (this one, or a subclass) is its state (`reset`: the tuple of arrays its
    kernels in solvers/llamacpp/walk.py work on, its length naming them) and where that
    state keeps the slot of each key (SLOT_MAP: the index of its [L, E] array)."""

    SLOT_MAP = 6

    def __init__(self, groups: Groups, slots: Sequence[int], n_expert_used: int) -> None:
        self.groups = groups
        self.slots = np.asarray(slots, dtype=np.int64)
        if self.slots.shape != (len(groups.device),) or (self.slots < 0).any():
            raise ValueError(f"slots must be one count >= 0 per group, got {slots!r}")
        self.n_expert_used = int(n_expert_used)
        self.reset()

    def reset(self) -> None:
        """Empty every LRU (a new context)."""
        num_layers, experts = len(self.groups.layer_group), self.groups.num_experts
        base = np.zeros(len(self.slots) + 1, dtype=np.int64)
        np.cumsum(self.slots, out=base[1:])
        total = int(base[-1])
        local = np.arange(total) - np.repeat(base[:-1], self.slots)
        size = np.repeat(self.slots, self.slots)
        self.state = (base, np.full(total, -1, dtype=np.int64), local - 1,
                      np.where(local + 1 < size, local + 1, -1),
                      np.zeros(len(self.slots), dtype=np.int64), self.slots - 1,
                      np.full((num_layers, experts), -1, dtype=np.int64))

    def holds(self, layer: int, expert: int) -> bool:
        """Whether the cache holds `expert` of MoE layer `layer` now."""
        return bool(self.state[self.SLOT_MAP][layer, expert] >= 0)

    def replay(self, tokens: np.ndarray, held: bool = False) -> Fetches:
        """Walk ubatches through the cache, in order. tokens: [S, B, L, k] int expert ids of
        each ubatch's B tokens (-1: none; a token with no id at any layer is not in the
        ubatch), in router order; `held`: also say which selected experts it held."""
        tokens = np.ascontiguousarray(tokens, dtype=np.int64)
        num_steps, _, num_layers, _ = tokens.shape
        n_tokens, used = usable_fetches(tokens, self.groups, self.slots, self.n_expert_used)
        counts = np.zeros((3, num_steps, num_layers), dtype=np.int32)
        where = np.zeros((num_steps if held else 0, num_layers, self.groups.num_experts),
                         dtype=np.bool_)
        walk(self.state, self.state[self.SLOT_MAP],
             np.asarray(self.groups.layer_group, dtype=np.int64), tokens, n_tokens, used,
             self.groups.num_experts, counts, where, held)
        return Fetches(used, counts[0], counts[1], counts[2], where if held else None)


def layer_tokens(tokens: np.ndarray) -> np.ndarray:
    """[S, L] tokens each ubatch of `tokens` [S, B, L, k] computes at each layer: those with
    an id there (module docstring: a prompt's last layer computes its outputs only)."""
    return (np.asarray(tokens) >= 0).any(axis=3).sum(axis=1).astype(np.int64)


def usable_fetches(tokens: np.ndarray, groups: Groups, slots: np.ndarray,
                   n_expert_used: int) -> tuple[np.ndarray, np.ndarray]:
    """([S] tokens of each ubatch, [S, L] bool whether its fetch at each layer goes through
    the cache): `get_slot_map` lets a cached layer's lookup of 1 .. MAX_BATCH tokens (those
    the layer computes, `layer_tokens`) in when min(tokens * n_expert_used, E) <= its
    group's slots. The same for every policy."""
    n_tokens = (tokens >= 0).any(axis=(2, 3)).sum(axis=1).astype(np.int64)
    at_layer = layer_tokens(tokens)
    group = np.asarray(groups.layer_group, dtype=np.int64)
    room = np.where(group >= 0, np.append(np.asarray(slots, dtype=np.int64), 0)[group], 0)
    need = np.minimum(at_layer * n_expert_used, groups.num_experts)
    used = ((room[None, :] > 0) & (at_layer > 0) & (at_layer <= MAX_BATCH)
            & (need <= room[None, :]))
    return n_tokens, used


def log_stats(fetches: Fetches, tokens_per_step: np.ndarray, groups: Groups) -> dict:
    """What llama.cpp logs at exit for these fetches: {"ubatch <= 8": (hits, misses,
    uploaded bytes), "ubatch  > 8": (...)}. tokens_per_step: [S, L] tokens each ubatch
    computes at each layer (`layer_tokens`; a fetch's line follows its selection's size),
    or [S] where every layer computes the whole ubatch."""
    per_expert = np.array([groups.slot_bytes(g) for g in range(len(groups.device))] + [0])
    uploaded = fetches.misses * per_expert[np.asarray(groups.layer_group)][None, :]
    sizes = np.asarray(tokens_per_step)
    small = (sizes if sizes.ndim == 2 else sizes[:, None]) <= SMALL_UBATCH
    small = small & fetches.used
    large = ~small & fetches.used
    return {name: (int(fetches.hits[m].sum()), int(fetches.misses[m].sum()),
                   int(uploaded[m].sum()))
            for name, m in (("ubatch <= 8", small), ("ubatch  > 8", large))}
