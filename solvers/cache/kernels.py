"""The compiled kernel of the cache policies and of their replay: one walk of fetches.

The runtime's lookup (solvers/cache/policy.py) is a walk of one fetch, the replay
(solvers/cache/replay.py) a walk of recorded steps, so both run the same code. numba caches
each compiled function on disk and checks only its own source file for changes: a kernel
that calls another would live here too. A policy is a `score` for `replay_requests` (not a
function passed in: a call through a function pointer is not inlined, and cost a third of
the replay's time). The policies (solvers/cache/lru.py, lfru.py) and the replay
(solvers/cache/replay.py) say what they do.
"""

from __future__ import annotations

import numpy as np
from numba import njit

LRU_SCORE, LFRU_SCORE = 0, 1

# state: (experts [1], offset [C, L], quota [C, L], count [C, L], slot_key [C, W],
#         key_slot [C, K], last [C, W], freq [C, W], seen [C, W], clock [C], fetches [C])


@njit(cache=True, nogil=True)
def replay_requests(state, score, keys, offsets, cacheable, home, num_cards, experts, hits,
                    slots, misses):
    """Walk the requests (keys [N] of group g = step * L + layer at offsets[g] ..
    offsets[g + 1] - 1, ascending) through the caches, one fetch per card with cacheable
    keys (cacheable, home: [L * E] per key). Each output is filled unless it is empty:
    hits [N] bool, whether request a hit; slots [N] int64, the slot that served or took it
    (-1: staged, not cached); misses [L * E] int64, += the misses of each key.

    One loop for every fetch, the policy inline: a fetch as a function of its own, called
    per card and layer, cost three times the walk (numba's reference counting of a dozen
    array arguments per call, ~90 ns where the fetch itself is ~30)."""
    _, offset, quota, count, slot_key, key_slot, last, freq, seen, clock, fetches = state
    buf = np.empty((num_cards, experts), dtype=np.int64)
    at = np.empty((num_cards, experts), dtype=np.int64)
    counts = np.zeros(num_cards, dtype=np.int64)
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
            # one fetch: the n keys buf[c, :n] of one layer on card c
            layer = buf[c, 0] // experts
            base, cap = offset[c, layer], quota[c, layer]
            fetches[c] += 1
            now = fetches[c]
            for i in range(n):
                s = key_slot[c, buf[c, i]]
                if s >= 0:
                    seen[c, s] = now
            for i in range(n):
                clock[c] += 1
                k = buf[c, i]
                s = key_slot[c, k]
                if len(hits):
                    hits[at[c, i]] = s >= 0
                if s >= 0:
                    freq[c, s] += 1
                    last[c, s] = clock[c]
                    if len(slots):
                        slots[at[c, i]] = s
                    continue
                if len(misses):
                    misses[k] += 1
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
                    if s >= 0:
                        key_slot[c, slot_key[c, s]] = -1
                if len(slots):
                    slots[at[c, i]] = s
                if s < 0:
                    continue
                slot_key[c, s] = k
                key_slot[c, k] = s
                last[c, s] = clock[c]
                freq[c, s] = 1
                seen[c, s] = now
