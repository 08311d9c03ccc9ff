"""llama.cpp's expert cache from b12170 on: ClassLRU, replayed as its rules read.

b12170 (`moe-cache : LRFU/MQ-like hybrid cache, ClassLRU`, ggml-org/llama.cpp #31233) replaced
the plain LRU of b11480..b12169 (solvers/llamacpp/lru.py) in `src/llama-moe-cache.cpp`.
Read: the header comment and the fields of `moe_cache_lru` at ggml-org/llama.cpp
c4fb579695320929b6a453f4f3a56951bda332ee (the stored copy stops after the fields), the commit
list of the b12170 release, and the first lines of `docs/moe-cache.md` and
`scripts/moe-cache-tune.py` at b12191. The body of `plan()` could not be read anywhere here
(nor the vendored copies in the llama-cpp-native 0.31/0.32 and llama-cpp-sys-4 0.12 crates,
whose docs.rs source pages are stored as line numbers only). No code of it is here.

Read (per group of layers; groups, slots, the 32-token rule, hits/misses and the exit log
lines are b11669's, solvers/llamacpp/lru.py, shared with it):

- one LRU list per frequency class (8 classes), head = least recently used; a slot is in the
  list of its class as of its last use;
- CRF (combined recency and frequency) = the uses of an expert, decayed with a half-life of
  128 tokens (`crf_half_life = 128.0f`), kept per key (layer, expert) across evictions;
- class = floor(log2(CRF)), at most 7;
- victim: an empty slot, else among the least recently used slot of each list that is not in
  the current plan(), the one with the largest age / 2^class;
- the clock advances by the ubatch's real token count; `last_use` holds the "layer clock".

Not readable, and the reading chosen (docs/llamacpp.md lists them too):

- the clock: one per layer, advanced by the ubatch's tokens at each fetch of that layer that
  goes through the cache, before its updates; a key's age is its own layer's clock minus its
  last use (so at layer l, keys of later layers used in the previous ubatch have age 0, and
  a layer tends to evict its own keys first). Two other readings are kept, to measure how
  much this one matters (docs/llamacpp.md: a lot, at B = 8 with a mid-size cache):
  `clock="fetch"` ages every key by the fetching layer's clock (`now`), `clock="group"` keeps
  one clock per group advanced at every layer's fetch (a group of L layers then ages its
  keys about L times faster per ubatch);
- a use (hit or fill) adds 1 to the decayed CRF once per distinct expert of a fetch; CRF is
  computed in double and stored as float (C++ `float`);
- the fetch keeps b11669's order: ids deduplicated in order of first appearance, hits updated
  in that order, then misses in ascending expert id, each taking the victim;
- empty slots (only after a reset) are taken in ascending slot index;
- "in the current plan" = a hit or fill of this very fetch; a list's candidate is its first
  slot from the head that is not; ties of age / 2^class go to the lowest class.

Use: `ClassLruCache(groups, slots, n_expert_used).replay(tokens)`, as `LlamaCppCache`.
The replay is compiled (numba): solvers/llamacpp/walk.py walks the ubatches with ClassLRU's
kernels (`class_use` a hit or fill, `class_victim` the victim rule above), kept beside
b11669's and the walk, as numba's per-file cache needs (solvers/cache/kernels.py says
why that matters).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from solvers.llamacpp.lru import Groups, LlamaCppCache
from solvers.llamacpp.walk import CRF_HALF_LIFE as CRF_HALF_LIFE  # re-exported
from solvers.llamacpp.walk import N_CLASS

CLOCKS = ("layer", "fetch", "group")  # readings of the "layer clock" (ClassLruCache)


class ClassLruCache(LlamaCppCache):
    """The ClassLRU lists of one llama.cpp (b12170+) MoE cache: `groups` with `slots` [G]
    slots each (0: not cached), E experts per layer, `n_expert_used` the graph's top-k. State
    carries across `replay` calls.

    clock: "layer" (the reading chosen: one clock per layer, a key aged by its own layer's
    clock), "fetch" (one clock per layer, every key aged by the fetching layer's) or "group"
    (one clock per group, advanced at every layer's fetch, so a group of L layers ages its
    keys about L times faster per ubatch)."""

    SLOT_MAP = 11

    def __init__(self, groups: Groups, slots: Sequence[int], n_expert_used: int,
                 clock: str = "layer") -> None:
        if clock not in CLOCKS:
            raise ValueError(f"clock must be one of {CLOCKS}, got {clock!r}")
        self.clock = clock
        super().__init__(groups, slots, n_expert_used)

    def reset(self) -> None:
        """Empty every list and forget every CRF (a new context)."""
        num_layers, experts = len(self.groups.layer_group), self.groups.num_experts
        groups = len(self.slots)
        base = np.zeros(groups + 1, dtype=np.int64)
        np.cumsum(self.slots, out=base[1:])
        total = int(base[-1])
        layer_group = np.asarray(self.groups.layer_group, dtype=np.int64)
        clock_of = (num_layers + np.maximum(layer_group, 0) if self.clock == "group"
                    else np.arange(num_layers, dtype=np.int64))
        self.state = (base,
                      np.full(total, -1, dtype=np.int64),             # key_of
                      np.full(total, -1, dtype=np.int64),             # prev (local)
                      np.full(total, -1, dtype=np.int64),             # next (local)
                      np.full((groups, N_CLASS), -1, dtype=np.int64),  # head
                      np.full((groups, N_CLASS), -1, dtype=np.int64),  # tail
                      np.full(total, -1, dtype=np.int64),             # list_of
                      np.zeros(groups, dtype=np.int64),                # filled
                      np.zeros((num_layers, experts), dtype=np.float32),  # crf
                      np.full((num_layers, experts), -1, dtype=np.int64),  # last_use
                      np.zeros(num_layers + groups, dtype=np.int64),   # clock
                      np.full((num_layers, experts), -1, dtype=np.int64),  # slot_map
                      clock_of,                                        # [L] clock of a layer
                      np.array([self.clock == "layer"]))               # age by own clock

    def crf(self, layer: int, expert: int) -> float:
        """The key's CRF as of its last use (kept across evictions; 0.0 if never used)."""
        return float(self.state[8][layer, expert])

    def frequency_class(self, layer: int, expert: int) -> int:
        """The class list the key's slot is in (-1 if not cached)."""
        slot = self.state[self.SLOT_MAP][layer, expert]
        if slot < 0:
            return -1
        g = int(self.groups.layer_group[layer])
        return int(self.state[6][self.state[0][g] + slot])
