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
  last use (so at layer l, keys of later layers used in the previous ubatch have age 0).
  The other reading, one clock per group advanced at every layer's fetch (the group's L
  layers then age its keys about L times faster per ubatch), is `clock="group"`;
- a use (hit or fill) adds 1 to the decayed CRF once per distinct expert of a fetch; CRF is
  computed in double and stored as float (C++ `float`);
- the fetch keeps b11669's order: ids deduplicated in order of first appearance, hits updated
  in that order, then misses in ascending expert id, each taking the victim;
- empty slots (only after a reset) are taken in ascending slot index;
- "in the current plan" = a hit or fill of this very fetch; a list's candidate is its first
  slot from the head that is not; ties of age / 2^class go to the lowest class.

Use: `ClassLruCache(groups, slots, n_expert_used).replay(tokens)`, as `LlamaCppCache`.
The replay is compiled (numba); its kernels call only each other, all in this module, so
numba's per-file cache stays right (solvers/cache/kernels.py says why that matters).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numba import njit

from solvers.llamacpp.lru import Groups, LlamaCppCache

N_CLASS = 8              # moe_cache_lru::n_class
CRF_HALF_LIFE = 128.0    # moe_cache_lru::crf_half_life, tokens
CLOCKS = ("layer", "group")  # the two readings of the "layer clock" (see ClassLruCache)


class ClassLruCache(LlamaCppCache):
    """The ClassLRU lists of one llama.cpp (b12170+) MoE cache: `groups` with `slots` [G]
    slots each (0: not cached), E experts per layer, `n_expert_used` the graph's top-k. State
    carries across `replay` calls.

    clock: "layer" (the reading chosen: one clock per layer, a key aged by its own layer's
    clock) or "group" (the other reading: one clock per group, advanced at every layer's
    fetch, so a group of L layers ages its keys about L times faster per ubatch)."""

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
        clock_of = (np.arange(num_layers, dtype=np.int64) if self.clock == "layer"
                    else num_layers + np.maximum(layer_group, 0))
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
                      clock_of)                                        # [L] clock of a layer

    def holds(self, layer: int, expert: int) -> bool:
        """Whether the cache holds `expert` of MoE layer `layer` now."""
        return bool(self.state[11][layer, expert] >= 0)

    def crf(self, layer: int, expert: int) -> float:
        """The key's CRF as of its last use (kept across evictions; 0.0 if never used)."""
        return float(self.state[8][layer, expert])

    def frequency_class(self, layer: int, expert: int) -> int:
        """The class list the key's slot is in (-1 if not cached)."""
        slot = self.state[11][layer, expert]
        if slot < 0:
            return -1
        g = int(self.groups.layer_group[layer])
        return int(self.state[6][self.state[0][g] + slot])

    def _walk(self, tokens: np.ndarray, n_tokens: np.ndarray, used: np.ndarray,
              counts: np.ndarray, where: np.ndarray, held: bool) -> None:
        _replay(self.state, np.asarray(self.groups.layer_group, dtype=np.int64), tokens,
                n_tokens, used, self.groups.num_experts, counts, where, held)


@njit(cache=True, nogil=True, inline="always")
def _unlink(prev, nxt, head, tail, g, base, s, c):
    """Take local slot s of group g out of class list c."""
    p, n = prev[base + s], nxt[base + s]
    if p >= 0:
        nxt[base + p] = n
    else:
        head[g, c] = n
    if n >= 0:
        prev[base + n] = p
    else:
        tail[g, c] = p
    prev[base + s] = -1
    nxt[base + s] = -1


@njit(cache=True, nogil=True, inline="always")
def _use(state, g, s, il, e, now):
    """A use of expert e of layer il, in local slot s of group g, at clock `now`: its CRF
    decays to now and gains 1, and the slot moves to the tail of its class's list."""
    base_all, _, prev, nxt, head, tail, list_of, _, crf, last_use, _, _, _ = state
    base = base_all[g]
    value = 1.0
    if last_use[il, e] >= 0:
        value += np.float64(crf[il, e]) * 2.0 ** (-(now - last_use[il, e]) / CRF_HALF_LIFE)
    crf[il, e] = np.float32(value)
    last_use[il, e] = now
    c = min(N_CLASS - 1, int(np.floor(np.log2(np.float64(crf[il, e])))))
    if list_of[base + s] >= 0:
        _unlink(prev, nxt, head, tail, g, base, s, list_of[base + s])
    list_of[base + s] = c
    t = tail[g, c]
    prev[base + s] = t
    nxt[base + s] = -1
    if t >= 0:
        nxt[base + t] = s
    else:
        head[g, c] = s
    tail[g, c] = s


@njit(cache=True, nogil=True, inline="always")
def _victim(state, g, il, now, experts):
    """The local slot a miss of layer il takes: an empty one, else the largest age / 2^class
    among each class list's least recently used slot not used by this fetch."""
    base_all, key_of, _, nxt, head, _, _, filled, _, last_use, clock, _, clock_of = state
    base = base_all[g]
    if filled[g] < base_all[g + 1] - base:
        filled[g] += 1
        return filled[g] - 1
    best, best_score = -1, -1.0
    for c in range(N_CLASS):
        s = head[g, c]
        while s >= 0:
            key = key_of[base + s]
            layer, e = key // experts, key % experts
            if not (layer == il and last_use[layer, e] == now):
                break
            s = nxt[base + s]
        if s < 0:
            continue
        key = key_of[base + s]
        layer, e = key // experts, key % experts
        score = (clock[clock_of[layer]] - last_use[layer, e]) / 2.0 ** c
        if score > best_score:
            best, best_score = s, score
    return best


@njit(cache=True, nogil=True, inline="always")
def _fetch(state, g, il, n_tokens, ids, n_ids, experts, uniq, mark, fill_e, fill_s):
    """plan() for layer il of group g over ids[:n_ids] of a ubatch of n_tokens tokens;
    returns (hits, fills) with the fills' experts and slots in fill_e, fill_s."""
    base_all, key_of, _, _, _, _, _, _, _, _, clock, slot_map, clock_of = state
    base = base_all[g]
    clock[clock_of[il]] += n_tokens
    now = clock[clock_of[il]]
    nu = 0
    for i in range(n_ids):
        e = ids[i]
        if not mark[e]:
            mark[e] = True
            uniq[nu] = e
            nu += 1
    n_hit = 0
    for j in range(nu):
        e = uniq[j]
        mark[e] = False
        if slot_map[il, e] >= 0:
            _use(state, g, slot_map[il, e], il, e, now)
            n_hit += 1
    for j in range(1, nu):  # ascending ids, in place (a fetch has a few dozen at most)
        e = uniq[j]
        i = j - 1
        while i >= 0 and uniq[i] > e:
            uniq[i + 1] = uniq[i]
            i -= 1
        uniq[i + 1] = e
    n_fill = 0
    for j in range(nu):
        e = uniq[j]
        if slot_map[il, e] >= 0:
            continue
        s = _victim(state, g, il, now, experts)
        old = key_of[base + s]
        if old >= 0:
            slot_map[old // experts, old % experts] = -1
        key_of[base + s] = il * experts + e
        slot_map[il, e] = s
        _use(state, g, s, il, e, now)
        fill_e[n_fill] = e
        fill_s[n_fill] = s
        n_fill += 1
    return n_hit, n_fill


@njit(cache=True, nogil=True)
def _replay(state, layer_group, tokens, n_tokens, used, experts, counts, held, want_held):
    num_steps, batch, num_layers, k = tokens.shape
    slot_map = state[11]
    ids = np.empty(batch * k, dtype=np.int64)
    uniq = np.empty(experts, dtype=np.int64)
    mark = np.zeros(experts, dtype=np.bool_)
    fill_e = np.empty(experts, dtype=np.int64)
    fill_s = np.empty(experts, dtype=np.int64)
    for s in range(num_steps):
        for il in range(num_layers):
            n = 0
            for b in range(batch):
                for j in range(k):
                    e = tokens[s, b, il, j]
                    if e >= 0:
                        ids[n] = e
                        n += 1
            g = layer_group[il]
            if want_held:
                for i in range(n):
                    held[s, il, ids[i]] = g >= 0 and slot_map[il, ids[i]] >= 0
            if not used[s, il]:
                continue
            n_hit, n_fill = _fetch(state, g, il, n_tokens[s], ids, n, experts, uniq, mark,
                                   fill_e, fill_s)
            counts[0, s, il] = n_hit
            counts[1, s, il] = n_fill
            i = 0
            while i < n_fill:
                r = 1
                while (i + r < n_fill and fill_e[i + r] == fill_e[i] + r
                       and fill_s[i + r] == fill_s[i] + r):
                    r += 1
                counts[2, s, il] += 1
                i += r
