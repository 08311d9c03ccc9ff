"""The compiled replay of llama.cpp's expert cache: one walk of recorded ubatches, and the
kernels of each policy it walks (b11669's LRU, solvers/llamacpp/lru.py; b12170's ClassLRU,
solvers/llamacpp/classlru.py: their docstrings cite the code and rules each is read from).

The walk is what both builds share: the ids each ubatch selects at each layer (token by
token, the top-k in router order), which fetches go through the cache (`used`), a fetch's
order (ids deduplicated in order of first appearance, hits updated in that order, then the
misses in ascending expert id, each taking the policy's victim), what it counts (distinct
hits, fills, upload runs of consecutive experts to consecutive slots) and the held experts.
A policy is its state (a tuple of arrays) and its kernels over it: `use` (a hit or a fill
moves its slot in the policy's lists), `victim` (the slot the next miss takes) and, for
ClassLRU, `class_begin` (a fetch advances its clock, `now`).

The walk picks a policy by the length of its state (ClassLRU's is 14 arrays, the LRU's 7):
numba makes `len` of a tuple argument a constant when it compiles the walk for that state's
type and drops the other policy's branches before typing (they would not type: each policy's
kernels unpack its own state). Each policy so gets a walk of its own with its kernels inlined,
as fast as the two walks this one replaced (gpt-oss-20b routing at B = 1 and 8, best of 3
to 5, interleaved with them on a shared machine: 0.84x to 1.04x their time). Not kernels
passed to the walk as arguments: numba never loads such a walk from its disk cache (their
types differ in every process, so it compiles again each time, seconds, and the cache grows)
and calls them out of line (ClassLRU 1.5x to 1.7x slower).

numba caches each compiled function on disk and checks only its own source file for changes:
the walk compiled for a policy holds that policy's kernels, so they all live here.
"""

from __future__ import annotations

import numpy as np
from numba import njit

# ClassLRU's constants, here for both of its replays (this walk compiles them in; placer's
# per-card ClassLRU, solvers/cache/classlru.py, hands them to its kernel as parameters)
N_CLASS = 8              # moe_cache_lru::n_class (ClassLRU)
CRF_HALF_LIFE = 128.0    # moe_cache_lru::crf_half_life, tokens (ClassLRU)
CLASS_LRU_STATE = 14     # the length of ClassLRU's state (ClassLruCache.reset); any other:
# b11669's LRU (7, LlamaCppCache.reset)


@njit(cache=True, nogil=True)
def walk(state, slot_map, layer_group, tokens, n_tokens, used, experts, counts, held,
         want_held):
    """Walk ubatches tokens [S, B, L, k] (-1: none; n_tokens [S] tokens of each) through the
    policy whose `state` it is (slot_map: its [L, E] local slot of each key, -1 where not
    held): fill counts [3, S, L] (hits, misses, runs) of the `used` [S, L] fetches, and held
    [S, L, E] (if want_held) the selected experts held before each."""
    classlru = len(state) == CLASS_LRU_STATE  # a constant: the other policy's calls are dropped
    num_steps, batch, num_layers, k = tokens.shape
    key_of = state[1]
    ids = np.empty(batch * k, dtype=np.int64)
    uniq = np.empty(experts, dtype=np.int64)
    mark = np.zeros(experts, dtype=np.bool_)
    fill_e = np.empty(experts, dtype=np.int64)
    fill_s = np.empty(experts, dtype=np.int64)
    for step in range(num_steps):
        for il in range(num_layers):
            n = 0
            for b in range(batch):
                for j in range(k):
                    e = tokens[step, b, il, j]
                    if e >= 0:
                        ids[n] = e
                        n += 1
            g = layer_group[il]
            if want_held:
                for i in range(n):
                    held[step, il, ids[i]] = g >= 0 and slot_map[il, ids[i]] >= 0
            if not used[step, il]:
                continue
            # plan(): distinct ids in order of first appearance, hits used in that order,
            # then the misses in ascending id, each taking the policy's victim
            base = state[0][g]
            now = class_begin(state, il, n_tokens[step]) if classlru else 0  # LRU: no clock
            nu = 0
            for i in range(n):
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
                    if classlru:
                        class_use(state, g, slot_map[il, e], il, e, now)
                    else:
                        lru_use(state, g, slot_map[il, e])
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
                s = class_victim(state, g, il, now, experts) if classlru else lru_victim(state, g)
                old = key_of[base + s]
                if old >= 0:
                    slot_map[old // experts, old % experts] = -1
                key_of[base + s] = il * experts + e
                slot_map[il, e] = s
                if classlru:
                    class_use(state, g, s, il, e, now)
                else:
                    lru_use(state, g, s)
                fill_e[n_fill] = e
                fill_s[n_fill] = s
                n_fill += 1
            counts[0, step, il] = n_hit
            counts[1, step, il] = n_fill
            i = 0
            while i < n_fill:  # upload runs: consecutive experts to consecutive slots
                r = 1
                while (i + r < n_fill and fill_e[i + r] == fill_e[i] + r
                       and fill_s[i + r] == fill_s[i] + r):
                    r += 1
                counts[2, step, il] += 1
                i += r


# b11669's LRU. state: (base [G + 1], key_of [slots], prev, next [slots] (local), head,
# tail [G], slot_map [L, E]); one list per group, every slot in it from the start.

@njit(cache=True, nogil=True)
def lru_use(state, g, s):
    """A hit or fill: local slot s of group g moves to the tail of its list (most recently
    used)."""
    base_all, _, prev, nxt, head, tail, _ = state
    base = base_all[g]
    if s == tail[g]:
        return
    p, n = prev[base + s], nxt[base + s]
    if p >= 0:
        nxt[base + p] = n
    else:
        head[g] = n
    prev[base + n] = p
    prev[base + s] = tail[g]
    nxt[base + s] = -1
    nxt[base + tail[g]] = s
    tail[g] = s


@njit(cache=True, nogil=True)
def lru_victim(state, g):
    """The head slot: the least recently used (the fetch's hits and fills went to the tail)."""
    return state[4][g]


# b12170's ClassLRU. state: (base [G + 1], key_of, prev, next (local), head, tail [G, 8],
# list_of [slots], filled [G], crf [L, E] float32, last_use [L, E], clock [L + G],
# slot_map [L, E], clock_of [L], own [1] bool: a key aged by its own layer's clock).

@njit(cache=True, nogil=True, inline="always")
def class_begin(state, il, n_tokens):
    """Layer il's clock advances by the ubatch's tokens; returns it (`now`)."""
    clock, clock_of = state[10], state[12]
    clock[clock_of[il]] += n_tokens
    return clock[clock_of[il]]


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
def class_use(state, g, s, il, e, now):
    """A use of expert e of layer il, in local slot s of group g, at clock `now`: its CRF
    decays to now and gains 1, and the slot moves to the tail of its class's list."""
    base_all, _, prev, nxt, head, tail, list_of, _, crf, last_use, _, _, _, _ = state
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
def class_victim(state, g, il, now, experts):
    """An empty slot, else the largest age / 2^class among each class list's least recently
    used slot not used by this fetch."""
    base_all, key_of, _, nxt, head, _, _, filled, _, last_use, clock, _, clock_of, own = state
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
        age = (clock[clock_of[layer]] if own[0] else now) - last_use[layer, e]
        score = age / 2.0 ** c
        if score > best_score:
            best, best_score = s, score
    return best
