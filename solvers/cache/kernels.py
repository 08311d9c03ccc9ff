"""The compiled kernel of the cache policies and of their replay: one walk of fetches.

The runtime's lookup (solvers/cache/policy.py) is a walk of one fetch, the replay
(solvers/cache/replay.py) a walk of recorded steps, so both run the same code. numba caches
each compiled function on disk and checks only its own source file for changes: a kernel
that calls another would live here too. A policy is a `score` for `replay_requests` (not a
function passed in: a call through a function pointer is not inlined, and cost a third of
the replay's time). The policies (solvers/cache/lru.py, lfru.py, lfuda.py, classlru.py,
learned.py) and the replay (solvers/cache/replay.py) say what they do.

Two clocks. The card's access clock ticks once per access (each key of each fetch, ascending):
`last` is a slot's last access on it (lru's order, lfru's recency, lfuda's tie-break). The
token clock is the count of tokens served: each walked step s has a token time `times[s]`, the
tokens of every step up to and including it (1, 2, 3, .. at B = 1; B, 2B, .. for decode steps
of B sequences; a prefill forward of P tokens advances it by P), the same for all layers of a
step. The policies whose memory decays (classlru, learned) measure ages and half-lives on it.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from solvers.cache_table import policy_row

# each policy's victim rule: its row's score (solvers/cache_table.py; compiled in below)
LRU_SCORE, LFRU_SCORE, LFUDA_SCORE, CLASSLRU_SCORE, LEARNED_SCORE = (
    policy_row(name).score for name in ("lru", "lfru", "lfuda", "classlru", "learned"))

# learned's features, in the order of its weights (solvers/cache/learned.py)
HALF_LIVES = (4.0, 16.0, 64.0)  # tokens, of its decayed selection counts (each 4x the last:
# the walk takes one exp2 per key, for 64, and the others as its 4th and 16th powers)
FEATURES = ("age", "decayed_4", "decayed_16", "decayed_64", "calibration", "transition", "bias")
NUM_FEATURES = len(FEATURES)
# the score reads each decayed count d as log2(d + DECAY_FLOOR): an expert's uses matter by
# their ratio, not their difference (0.6 points of misses below lfru on gpt-oss mmlu_dev,
# docs/cache-split.md), and a count decayed to nothing stays finite
DECAY_FLOOR = 1.0 / 64
# calibration = log2(share + SHARE_FLOOR), share: the calibration tokens that selected a key
SHARE_FLOOR = 1.0 / 1024
# transition = log2(mean over the fetch's keys k of T[l, k, v] + TRANSITION_FLOOR), T[l, k, v]
# = P(v selected at the next step | k selected at this one), layer l's (calibration's); a
# candidate of another layer than the fetch's (pooled) has its share in place of the mean;
# a layer whose weight on it is 0 skips it (and the policy may then carry no T)
TRANSITION_FLOOR = 1.0 / 64

# state, 11 arrays (each array argument costs the runtime's lookup a fraction of a
# microsecond to unbox, so they are stacked): (head [4]: experts per layer, pooled, now (the
# token time of the last step walked), the token time of the scores learned keeps in freq
# (pooled: below); parts [3, C, P]: offset, quota, count of each partition; age [C, P];
# slot [3, C, W]: slot_key, last, seen; freq [C, W]; key_slot [C, K];
# card [2, C]: clock, fetches; kept [C, K', F]; used [C, K']; params [n] (learned: [L * 7],
# the weights of each layer row in turn); calibration [K'] (learned: [K + L * E * E], the
# calibration feature of each key, then T [L, E, E] flat),
# P = L partitions or 1 (pooled); K' = K where the policy keeps per-key memory, else 0.


@njit(cache=True, nogil=True, inline="always")
def learned_terms(v, w, c, n, t, experts, fetch, used, kept, params, calibration):
    """learned's score of key v on card c but its bias (weights from params[w]), at token
    time t, for a fetch of the n keys fetch[c, :n], summed in the order the score adds its
    terms."""
    dt = float(t - used[c, v])
    slow = 2.0 ** (-dt / HALF_LIVES[2])
    mid = slow * slow * slow * slow
    if params[w + 5] == 0.0:  # no transition: T is not read
        moved = 0.0
    elif v // experts == fetch[c, 0] // experts:
        row = used.shape[1] + (v // experts * experts * experts + v % experts)
        moved = 0.0
        for j in range(n):
            moved += calibration[row + fetch[c, j] % experts * experts]
        moved /= n
    else:
        moved = 2.0 ** calibration[v] - SHARE_FLOOR
    return (params[w] * dt + params[w + 1] * np.log2(kept[c, v, 0] * (mid * mid * mid * mid)
                                                     + DECAY_FLOOR)
            + params[w + 2] * np.log2(kept[c, v, 1] * mid + DECAY_FLOOR)
            + params[w + 3] * np.log2(kept[c, v, 2] * slow + DECAY_FLOOR)
            + params[w + 4] * calibration[v]
            + params[w + 5] * np.log2(moved + TRANSITION_FLOOR))


@njit(cache=True, nogil=True)
def replay_requests(state, score, keys, offsets, times, cacheable, home, num_cards, experts,
                    hits, slots, misses):
    """Walk the requests (keys [N] of group g = step * L + layer at offsets[g] ..
    offsets[g + 1] - 1, ascending) through the caches, one fetch per card with cacheable
    keys (cacheable, home: [L * E] per key), step s at token time times[s]. Each output is
    filled unless it is empty: hits [N] bool, whether request a hit; slots [N] int64, the slot
    that served or took it (-1: staged, not cached); misses [L * E] int64, += the misses of
    each key.

    One loop for every fetch, the policy inline: a fetch as a function of its own, called
    per card and layer, cost three times the walk (numba's reference counting of a dozen
    array arguments per call, ~90 ns where the fetch itself is ~30).

    learned, pooled: a miss scans every slot of the card, and a slot's score changes only
    with the token time, its key's use, and (its transition) the fetch's layer. So the score
    of a slot holding another layer's key is kept in freq until the token time moves on
    (head[3]) or the key is used or leaves; the scan reads it, bit for bit the sum it would
    take again, and takes one exp2 and three log2 per slot per token time instead of per
    miss (DeepSeek-V3's shape, 256 slots per card, 20k tokens at B = 1: 23.2 s to 9.8 s)."""
    head, parts, age, slot, freq, key_slot, card, kept, used, params, calibration = state
    offset, quota, count = parts[0], parts[1], parts[2]
    slot_key, last, seen = slot[0], slot[1], slot[2]
    clock, fetches = card[0], card[1]
    pooled = head[1] == 1
    layers = key_slot.shape[1] // experts
    buf = np.empty((num_cards, experts), dtype=np.int64)
    at = np.empty((num_cards, experts), dtype=np.int64)
    counts = np.zeros(num_cards, dtype=np.int64)
    step, layer = 0, 0
    t = head[2]
    keep = score == LEARNED_SCORE and pooled  # learned's scores kept in freq (docstring)
    for g in range(len(offsets) - 1):
        t = times[step]
        if keep and t != head[3]:
            freq[:, :] = np.nan
            head[3] = t
        layer += 1
        if layer == layers:
            step, layer = step + 1, 0
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
            p = 0 if pooled else buf[c, 0] // experts
            low = buf[c, 0] // experts * experts  # the fetch layer's first key
            base, cap = offset[c, p], quota[c, p]
            fetches[c] += 1
            fetch = fetches[c]
            for i in range(n):
                s = key_slot[c, buf[c, i]]
                if s >= 0:
                    seen[c, s] = fetch
            if score <= LFRU_SCORE:
                # lru and lfru keep no memory beyond the slot: their own loop, as it was
                # before the policies with memory (whose branches cost lru's walk 10-15%)
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
                    if count[c, p] < cap:
                        s = base + count[c, p]
                        count[c, p] += 1
                    else:
                        s = -1
                        best = np.inf
                        for u in range(base, base + cap):
                            if seen[c, u] == fetch:
                                continue
                            value = (last[c, u] if score == LRU_SCORE
                                     else freq[c, u] / (clock[c] - last[c, u] + 1))
                            if value < best or (value == best
                                                and slot_key[c, u] < slot_key[c, s]):
                                best = value
                                s = u
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
                    seen[c, s] = fetch
                continue
            # lfuda, classlru, learned; classlru updates the fetch's hits first, then its
            # misses (llama.cpp's plan())
            for i in range(n * (2 if score == CLASSLRU_SCORE else 1)):
                j = i if i < n else i - n
                k = buf[c, j]
                s = key_slot[c, k]
                if score == CLASSLRU_SCORE and (s >= 0) != (i < n):
                    continue
                clock[c] += 1
                a = at[c, j]
                if len(hits):
                    hits[a] = s >= 0
                # the key's own memory, which outlives its slot: every use counts
                if score == LFUDA_SCORE:
                    kept[c, k, 0] = min(kept[c, k, 0] + 1.0, params[0])
                elif score == CLASSLRU_SCORE:
                    # llama.cpp's CRF, stored as a C float
                    kept[c, k, 0] = np.float64(np.float32(
                        kept[c, k, 0] * 2.0 ** (-(t - used[c, k]) / params[0]) + 1.0))
                    used[c, k] = t
                elif score == LEARNED_SCORE:
                    slow = 2.0 ** (-(t - used[c, k]) / HALF_LIVES[2])
                    mid = slow * slow * slow * slow
                    kept[c, k, 0] = kept[c, k, 0] * (mid * mid * mid * mid) + 1.0
                    kept[c, k, 1] = kept[c, k, 1] * mid + 1.0
                    kept[c, k, 2] = kept[c, k, 2] * slow + 1.0
                    used[c, k] = t
                if s >= 0:
                    last[c, s] = clock[c]
                    if score == LFUDA_SCORE:
                        freq[c, s] = age[c, p] + kept[c, k, 0]
                    elif score == CLASSLRU_SCORE:  # 2^class, class as of this use
                        freq[c, s] = 2.0 ** min(np.floor(np.log2(kept[c, k, 0])), params[1])
                    elif keep:
                        freq[c, s] = np.nan
                    if len(slots):
                        slots[a] = s
                    continue
                if len(misses):
                    misses[k] += 1
                if count[c, p] < cap:
                    s = base + count[c, p]
                    count[c, p] += 1
                else:
                    s = -1
                    best, rank, tie = np.inf, 0.0, 0
                    for u in range(base, base + cap):
                        if seen[c, u] == fetch:
                            continue
                        first, second = 0.0, 0  # ties: the lowest of these, then of the key
                        if score == LFUDA_SCORE:
                            value = freq[c, u]
                            first = float(last[c, u])
                        elif score == CLASSLRU_SCORE:
                            # the largest age / 2^class, class as of the last use; ties: the
                            # lowest class, then the least recently used (its list's head)
                            first = freq[c, u]  # 2^class
                            second = last[c, u]
                            value = -((t - used[c, slot_key[c, u]]) / first)
                        else:
                            v = slot_key[c, u]
                            other = keep and (v < low or v >= low + experts)
                            if other and not np.isnan(freq[c, u]):
                                value = freq[c, u]  # kept at this token time (docstring)
                            else:
                                w = (v // experts) * NUM_FEATURES  # v's layer's weights
                                value = learned_terms(v, w, c, n, t, experts, buf, used,
                                                      kept, params, calibration) + params[w + 6]
                                if other:
                                    freq[c, u] = value
                        if value < best or (value == best and (first < rank or (
                                first == rank and (second < tie or (
                                    second == tie and slot_key[c, u] < slot_key[c, s]))))):
                            best, rank, tie = value, first, second
                            s = u
                    if s >= 0:
                        victim = slot_key[c, s]
                        key_slot[c, victim] = -1
                        if score == LFUDA_SCORE:
                            age[c, p] = max(age[c, p], freq[c, s])
                            kept[c, victim, 0] *= params[1]
                if len(slots):
                    slots[a] = s
                if s < 0:
                    continue
                slot_key[c, s] = k
                key_slot[c, k] = s
                last[c, s] = clock[c]
                if score == LFUDA_SCORE:
                    freq[c, s] = age[c, p] + kept[c, k, 0]
                elif score == CLASSLRU_SCORE:
                    freq[c, s] = 2.0 ** min(np.floor(np.log2(kept[c, k, 0])), params[1])
                elif keep:
                    freq[c, s] = np.nan
                seen[c, s] = fetch
    head[2] = t
