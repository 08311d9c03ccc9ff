"""The compiled kernels of the cache policies and of their replay, in one module.

numba caches each compiled function on disk and checks only its own source file for changes,
so a kernel calling one in another module could run stale code after an edit: every kernel
that calls another lives here. A policy is a `score` for `partition_fetch` (not a function
passed in: a call through a function pointer is not inlined, and cost a third of the
replay's time). The policies (solvers/cache/lru.py, lfru.py) and the replay
(solvers/cache/replay.py) say what they do.
"""

from __future__ import annotations

import numpy as np
from numba import njit

LRU_SCORE, LFRU_SCORE = 0, 1

# state: (experts [1], offset [C, L], quota [C, L], count [C, L], slot_key [C, W],
#         key_slot [C, K], last [C, W], freq [C, W], seen [C, W], clock [C], fetches [C])


@njit(cache=True, nogil=True)
def partition_fetch(state, c, keys, n, hit, slot, score):
    experts, offset, quota, count, slot_key, key_slot, last, freq, seen, clock, fetches = state
    layer = keys[0] // experts[0]
    base, cap = offset[c, layer], quota[c, layer]
    fetches[c] += 1
    now = fetches[c]
    for i in range(n):
        s = key_slot[c, keys[i]]
        if s >= 0:
            seen[c, s] = now
    for i in range(n):
        clock[c] += 1
        s = key_slot[c, keys[i]]
        hit[i] = s >= 0
        slot[i] = s
        if s >= 0:
            freq[c, s] += 1
            last[c, s] = clock[c]
            continue
        if count[c, layer] < cap:
            s = base + count[c, layer]
            count[c, layer] += 1
        else:
            s = -1
            best = np.inf
            for t in range(base, base + cap):
                if seen[c, t] == now:
                    continue
                value = (last[c, t] if score == LRU_SCORE
                         else freq[c, t] / (clock[c] - last[c, t] + 1))
                if value < best or (value == best and slot_key[c, t] < slot_key[c, s]):
                    best = value
                    s = t
            if s < 0:
                continue
            key_slot[c, slot_key[c, s]] = -1
        slot_key[c, s] = keys[i]
        key_slot[c, keys[i]] = s
        last[c, s] = clock[c]
        freq[c, s] = 1
        seen[c, s] = now
        slot[i] = s


@njit(cache=True, nogil=True)
def replay_requests(state, score, keys, offsets, cacheable, home, num_cards, experts, hits):
    """Walk the requests (keys [N] of group g = step * L + layer at offsets[g] ..
    offsets[g + 1] - 1, ascending) through the caches, one fetch per card with cacheable
    keys; hits[a] is whether request a hit. cacheable, home: [L * E] per key."""
    buf = np.empty((num_cards, experts), dtype=np.int64)
    at = np.empty((num_cards, experts), dtype=np.int64)
    counts = np.zeros(num_cards, dtype=np.int64)
    hit = np.zeros(experts, dtype=np.bool_)
    slot = np.zeros(experts, dtype=np.int64)
    for g in range(len(offsets) - 1):
        counts[:] = 0
        for a in range(offsets[g], offsets[g + 1]):
            k = keys[a]
            if cacheable[k]:
                c = home[k]
                buf[c, counts[c]] = k
                at[c, counts[c]] = a
                counts[c] += 1
        for c in range(num_cards):
            n = counts[c]
            if n == 0:
                continue
            partition_fetch(state, c, buf[c], n, hit, slot, score)
            for i in range(n):
                hits[at[c, i]] = hit[i]
