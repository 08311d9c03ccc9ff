"""The `learned` cache policy's weights: a linear eviction score fitted on calibration folds.

The score of a cached expert v of layer row l at token time t (the runtime's,
solvers/cache/kernels.py, FEATURES in this order; the victim is the lowest score among the
partition's slots that no key of the fetch holds, ties: the lowest key):

    w[l] . (age, log2(decayed_4 + 1/64), log2(decayed_16 + 1/64), log2(decayed_64 + 1/64),
            calibration, transition, 1)

age = t - the token time of v's last use; decayed_h = sum over v's past uses u of
2^(-(t - u) / h) (h = 4, 16, 64 tokens; a use: v in a fetch, once per step), both kept across
eviction (1/64: kernels.DECAY_FLOOR); calibration = log2(share + 1/1024), share = the
calibration tokens that selected v over all calibration tokens (its frequency, computed on
the calibration traffic and stored in the plan beside the weights); transition =
log2(mean over the fetch's keys k of T[l, k, v] + 1/64), T (`transition_matrix`, in the plan
too) the calibration's probability that a step selecting k in layer l is followed by one
selecting v there; w[l]: the weights of v's layer, one set per layer.

How the weights are fitted, on the calibration folds only (never on held-out traffic):
imitation of Belady's MIN with the policy's own states (DAgger): replay each fold through
the policy (first LRU: weights (-1, 0, ...)), and at sampled evictions record every
candidate's features, its layer and the distance to its next use in that fold; fit a pairwise
ranking per layer (logistic, each pair of one eviction weighed by how far apart their log
next-use distances lie: the expert needed later should score lower; a layer with fewer than
LAYER_ROWS rows takes the ranking fitted on every layer's rows); replay with the new weights,
add their evictions, refit; ROUNDS times. Each fold is replayed with the calibration share
and T of the other folds, as held-out traffic sees shares it did not make. Beyond
TRANSITION_KEYS entries of T there is none: the feature is 0, its weight too.
Deterministic (a seeded pair sample, L-BFGS from zero); the replays cover at most
FIT_REQUESTS requests per round (a prefix of each fold) and record at most RECORD_ROWS
candidates, so a fit costs seconds at DeepSeek-V3 scale.

What each part is worth, on gpt-oss mmlu_dev (benchmarks/routing_cache.py 6e: B = 1, 264
slots, calibration half fitted, held-out half replayed), misses below lfru's: every feature
linear, one set of weights and no transition 11.3%; the decayed counts as logarithms 11.9%;
one set per layer 12.3%; and the transition 15.8% (docs/cache-split.md has the table).
Without the features that name experts (`identity=False`: age and the decayed counts only,
a score renaming cannot change) 11.95% (227,312 misses, 1.94x Belady's); it is not a row of
the choice (solvers/cache/choice.py says why).
Neither a direct search of the weights minimizing the folds' replayed misses nor more
per-key features (a 256-token half-life, log2(1 + age), hits since admission) earned over
0.1 point held out.

`walk` is a plain reference replay of the same rules, written here apart from the runtime's
kernel (it records the evictions the fit needs, which the kernel does not); tests check the
two agree.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit
from scipy.optimize import minimize

from solvers.cache.kernels import (
    DECAY_FLOOR,
    FEATURES,
    HALF_LIVES,
    SHARE_FLOOR,
    TRANSITION_FLOOR,
)
from solvers.cache.learned import shares
from solvers.cache.replay import Requests

ROUNDS = 2
FIT_REQUESTS = 4_000_000    # requests replayed per round, at most (a prefix of each fold)
RECORD_ROWS = 1_200_000     # candidates recorded per round, at most
PAIRS = 100_000             # pairs the shared ranking is fitted on
PAIRS_PER_ROW = 4           # ... and at most this many per candidate recorded (small traffic:
                            # more pairs would only repeat the same ones, at a cost)
LAYER_PAIRS = 20_000        # pairs each layer's ranking is fitted on, at most
PAIR_BUDGET = 480_000       # pairs of all layers' rankings, at most (DeepSeek-V3: 8k a layer)
LAYER_ROWS = 2_000          # rows a layer needs for weights of its own (else: the shared fit)
TRANSITION_KEYS = 1 << 20    # layers x experts^2 at most for the transition feature
TRANSITION_CHUNK = 1 << 22   # steps x layers x experts of a chunk of the transition count
LRU_WEIGHTS = (-1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)


@njit(cache=True, nogil=True)
def walk(keys, offsets, times, part_of, quota, experts, weights, calibration, transition,
         record_every, nxt, rec_x, rec_dec, rec_dist, rec_layer):
    """Replay fetches through per-partition caches under the linear score; (misses, rows).

    Fetch g is keys[offsets[g]:offsets[g + 1]] (distinct, ascending, one partition
    part_of[key], at token time times[g]); partition p has quota[p] slots; a key's layer row
    is key // experts, and weights [L, 7] its layer's weights (transition [L, E, E]). Every
    record_every-th eviction (0: none) writes each candidate's features into rec_x [R, 7],
    the eviction's ordinal among those recorded into rec_dec, the requests until its next use
    (nxt: the next request index of each request's key, len(keys) if none) into rec_dist and
    its layer row into rec_layer, while rows are left."""
    num_keys = len(part_of)
    width = 1
    for p in range(len(quota)):
        width = max(width, quota[p])
    slot_key = np.full((len(quota), width), -1, dtype=np.int64)
    count = np.zeros(len(quota), dtype=np.int64)
    cached = np.zeros(num_keys, dtype=np.bool_)
    fetching = np.zeros(num_keys, dtype=np.bool_)
    last = np.zeros(num_keys, dtype=np.int64)
    last_request = np.zeros(num_keys, dtype=np.int64)
    nh = len(HALF_LIVES)
    halves = np.array(HALF_LIVES)
    decayed = np.zeros((num_keys, nh))
    nf = weights.shape[1]
    feats = np.zeros(nf)
    feats[nf - 1] = 1.0
    misses, evictions, recorded, rows = 0, 0, 0, 0
    for g in range(len(offsets) - 1):
        lo, hi = offsets[g], offsets[g + 1]
        if lo == hi:
            continue
        p = part_of[keys[lo]]
        now = times[g]
        for a in range(lo, hi):
            fetching[keys[a]] = True
        for a in range(lo, hi):
            k = keys[a]
            if not cached[k]:
                misses += 1
                if count[p] < quota[p]:
                    slot_key[p, count[p]] = k
                    count[p] += 1
                    cached[k] = True
                elif quota[p] > 0:
                    take = (record_every > 0 and evictions % record_every == 0
                            and rows + quota[p] <= len(rec_dec))
                    evictions += 1
                    best, victim = np.inf, -1
                    for s in range(quota[p]):
                        c = slot_key[p, s]
                        if fetching[c]:
                            continue
                        feats[0] = now - last[c]
                        for h in range(nh):
                            feats[1 + h] = np.log2(decayed[c, h] * np.exp2(
                                -(now - last[c]) / halves[h]) + DECAY_FLOOR)
                        feats[1 + nh] = calibration[c]
                        if len(transition) == 0:  # none: the feature is 0
                            moved = 1.0 - TRANSITION_FLOOR
                        elif c // experts == keys[lo] // experts:
                            moved = 0.0
                            for b in range(lo, hi):
                                moved += transition[c // experts, keys[b] % experts,
                                                    c % experts]
                            moved /= hi - lo
                        else:
                            moved = 2.0 ** calibration[c] - SHARE_FLOOR
                        feats[2 + nh] = np.log2(moved + TRANSITION_FLOOR)
                        v = 0.0
                        for f in range(nf):
                            v += weights[c // experts, f] * feats[f]
                        if v < best or (v == best and c < slot_key[p, victim]):
                            best, victim = v, s
                        if take:
                            rec_x[rows] = feats
                            rec_dec[rows] = recorded
                            rec_dist[rows] = nxt[last_request[c]] - a
                            rec_layer[rows] = c // experts
                            rows += 1
                    if take:
                        recorded += 1
                    if victim >= 0:
                        cached[slot_key[p, victim]] = False
                        slot_key[p, victim] = k
                        cached[k] = True
            for h in range(nh):
                decayed[k, h] = decayed[k, h] * np.exp2(-(now - last[k]) / halves[h]) + 1.0
            last[k] = now
            last_request[k] = a
        for a in range(lo, hi):
            fetching[keys[a]] = False
    return misses, rows


@dataclass(frozen=True)
class Fetches:
    """Requests as `walk` takes them: one fetch per (step, layer, card) of cacheable keys."""

    keys: np.ndarray     # [N] int64
    offsets: np.ndarray  # [G + 1]
    times: np.ndarray    # [G] token time of each fetch

    @classmethod
    def of(cls, requests: Requests, cacheable: np.ndarray, home: np.ndarray,
           limit: int | None = None) -> Fetches:
        """The fetches of `requests`, only their first steps up to `limit` requests where
        given. Token time: the tokens of every step up to and including a fetch's."""
        steps, layers, _ = requests.shape
        keys = requests.keys.astype(np.int64)
        groups = np.repeat(np.arange(steps * layers), np.diff(requests.offsets))
        if limit is not None and len(keys) > limit:
            cut = int(np.searchsorted(requests.offsets, limit, side="right")) // layers * layers
            keys, groups = keys[:requests.offsets[cut]], groups[:requests.offsets[cut]]
        keep = np.ravel(cacheable)[keys]
        keys, groups = keys[keep], groups[keep]
        cards = int(np.max(home)) + 1
        fetch = groups * cards + np.ravel(home)[keys]
        order = np.argsort(fetch, kind="stable")
        keys, fetch = keys[order], fetch[order]
        start = np.flatnonzero(np.r_[True, fetch[1:] != fetch[:-1]]) if len(fetch) else \
            np.zeros(0, np.int64)
        clock = np.cumsum(np.broadcast_to(np.asarray(getattr(requests, "tokens", 1),
                                                     dtype=np.int64), (steps,)))
        times = clock[fetch[start] // cards // layers] if len(start) else start
        return cls(keys, np.r_[start, len(keys)].astype(np.int64), times.astype(np.int64))

    def next_use(self) -> np.ndarray:
        """[N + 1] the index of each request's key's next request (N where none)."""
        n = len(self.keys)
        order = np.lexsort((np.arange(n), self.keys))
        out = np.full(n + 1, n, dtype=np.int64)
        same = self.keys[order[1:]] == self.keys[order[:-1]]
        out[order[:-1][same]] = order[1:][same]
        return out


def partitions(home: np.ndarray, quotas: np.ndarray, pooled: bool
               ) -> tuple[np.ndarray, np.ndarray]:
    """(part_of [L * E], quota [P]): per (card, layer), or with `pooled` one per card."""
    layers, experts = home.shape
    if pooled:
        return np.ravel(home).astype(np.int64), quotas.sum(axis=1).astype(np.int64)
    part = np.ravel(home * layers + np.arange(layers)[:, None]).astype(np.int64)
    return part, np.ravel(quotas).astype(np.int64)


def calibration_feature(requests: list[Requests]) -> np.ndarray:
    """[L * E] log2(share + SHARE_FLOOR): each key's selections over all tokens of `requests`
    (steps x tokens per step)."""
    _, layers, experts = requests[0].shape
    counts = sum(np.bincount(r.keys, minlength=layers * experts) for r in requests)
    tokens = sum(_tokens(r) for r in requests)
    return np.log2(counts / max(tokens, 1) + SHARE_FLOOR)


def transition_matrix(requests: list[Requests]) -> np.ndarray | None:
    """[L, E, E] T[l, k, v]: of the steps that select k in layer l and have a next step (in
    the same Requests), the share whose next step selects v in layer l; None beyond
    TRANSITION_KEYS entries (the plan would carry too many)."""
    _, layers, experts = requests[0].shape
    if layers * experts * experts > TRANSITION_KEYS:
        return None
    pairs = np.zeros((layers, experts, experts))
    before = np.zeros((layers, experts))
    chunk = max(2, TRANSITION_CHUNK // (layers * experts))
    for r in requests:
        steps = r.shape[0]
        for lo in range(0, max(steps - 1, 0), chunk - 1):  # chunks overlap by one step
            hi = min(steps, lo + chunk)
            mask = np.zeros((hi - lo) * layers * experts, dtype=np.float32)
            a, b = r.offsets[lo * layers], r.offsets[hi * layers]
            group = np.repeat(np.arange(lo * layers, hi * layers), np.diff(
                r.offsets[lo * layers:hi * layers + 1])) - lo * layers
            mask[group * experts + r.keys[a:b] % experts] = 1.0
            mask = mask.reshape(hi - lo, layers, experts)
            pairs += np.einsum("sli,slj->lij", mask[:-1], mask[1:])
            before += mask[:-1].sum(axis=0)
    return pairs / np.maximum(before, 1.0)[:, :, None]


def _tokens(requests: Requests) -> int:
    """Tokens of all steps of `requests` (one per step unless the Requests carry a batch)."""
    return int(np.sum(np.broadcast_to(np.asarray(getattr(requests, "tokens", 1)),
                                      (requests.shape[0],))))


def layer_weights(weights: np.ndarray, layers: int) -> np.ndarray:
    """[L, 7] the weights of each layer row: shared weights [7] repeated, or [L, 7] as given."""
    return np.ascontiguousarray(np.broadcast_to(np.asarray(weights, dtype=np.float64),
                                                (layers, len(FEATURES))))


def replay_misses(requests: Requests, cacheable: np.ndarray, home: np.ndarray,
                  quotas: np.ndarray, weights: np.ndarray, calibration: np.ndarray,
                  pooled: bool = False, transition: np.ndarray | None = None) -> int:
    """Misses of the learned score (weights [7] or [L, 7]; transition [L, E, E] or None, as
    the policy takes them) over `requests` (cold caches), by the reference walk."""
    layers, experts = np.shape(home)
    fetches = Fetches.of(requests, cacheable, home)
    part_of, quota = partitions(home, quotas, pooled)
    empty = np.zeros(0, dtype=np.int64)
    moves = shares(calibration, layers) if transition is None else np.asarray(transition)
    misses, _ = walk(fetches.keys, fetches.offsets, fetches.times, part_of, quota, experts,
                     layer_weights(weights, layers), np.ravel(calibration),
                     np.ascontiguousarray(moves, dtype=np.float64), 0, empty,
                     np.zeros((0, len(FEATURES))), empty, empty, empty)
    return int(misses)


@dataclass(frozen=True)
class LearnedFit:
    """weights: [L, 7] each layer row's weights in FEATURES order; calibration: [L, E] the
    calibration feature; transition: [L, E, E] T of the calibration (None beyond
    TRANSITION_KEYS); misses: the calibration folds' misses of each round's policy (round 0:
    LRU); rows: candidate rows the rankings were fitted on."""

    weights: np.ndarray
    calibration: np.ndarray
    transition: np.ndarray | None
    misses: list[int]
    rows: int

    @property
    def options(self) -> dict:
        """make_policy's keyword arguments of the learned policy with these weights."""
        return {"weights": self.weights, "calibration": self.calibration,
                "transition": self.transition}


def fit_learned(folds: list[Requests], cacheable: np.ndarray, home: np.ndarray,
                quotas: np.ndarray, pooled: bool = False, rounds: int = ROUNDS,
                seed: int = 0, units: list[int] | None = None,
                limit: int = FIT_REQUESTS, identity: bool = True) -> LearnedFit:
    """The learned score's weights, one set per layer, for quotas [C, L] slots (cacheable
    [L, E]: not pinned), fitted on `folds` (the calibration's, never held-out traffic): see
    the module docstring. units: which sequences each fold holds (folds of one unit share
    them: the same sequences at another concurrency); a fold's calibration share is the
    other units'. limit: requests replayed per round, at most (a prefix of each fold).
    identity False: without the features that name experts (calibration and transition: their
    weights 0, the plan's calibration feature 0 and no T), a score renaming cannot change."""
    units = list(range(len(folds))) if units is None else list(units)
    home = np.asarray(home, dtype=np.int64)
    layers, experts = home.shape
    part_of, quota = partitions(home, np.asarray(quotas), pooled)
    others = [[f for j, f in enumerate(folds) if units[j] != units[i]] or [folds[i]]
              for i in range(len(folds))]
    # without T (beyond TRANSITION_KEYS, or identity False) the feature is 0 and its weight
    # too: the kernel then skips it; without identity the calibration feature is 0 as well
    share = [calibration_feature(o) if identity else np.zeros(layers * experts)
             for o in others]
    moves = [transition_matrix(o) if identity else None for o in others]
    moves = [np.zeros((0, 0, 0)) if m is None else m for m in moves]
    total = sum(len(f.keys) for f in folds)
    fetches = [Fetches.of(f, cacheable, home, limit * len(f.keys) // max(total, 1) + 1)
               for f in folds]
    nexts = [f.next_use() for f in fetches]
    per_row = max(1, int(quota.max(initial=1)))
    weights = layer_weights(LRU_WEIGHTS, layers)
    xs, decs, dists, rows_layer, misses, offset = [], [], [], [], [], 0
    for r in range(rounds + 1):
        done = 0
        for i, f in enumerate(fetches):  # the last round only counts its misses
            room = 0 if r == rounds else \
                RECORD_ROWS * len(f.keys) // max(1, sum(len(g.keys) for g in fetches))
            every = max(1, int(len(f.keys) * per_row // max(room, 1))) if room else 0
            x = np.zeros((room, len(FEATURES)))
            dec = np.zeros(room, dtype=np.int64)
            dist = np.zeros(room, dtype=np.int64)
            at = np.zeros(room, dtype=np.int64)
            m, rows = walk(f.keys, f.offsets, f.times, part_of, quota, experts, weights,
                           share[i], moves[i], every, nexts[i], x, dec, dist, at)
            done += m
            if rows:
                xs.append(x[:rows])
                decs.append(dec[:rows] + offset)
                dists.append(dist[:rows])
                rows_layer.append(at[:rows])
                offset += int(dec[rows - 1]) + 1
        misses.append(int(done))
        if len(misses) > rounds or not xs:
            break
        weights = per_layer_fit(np.concatenate(xs), np.concatenate(decs),
                                np.concatenate(dists), np.concatenate(rows_layer), layers, seed)
    if not identity:
        return LearnedFit(weights, np.zeros(home.shape), None, misses,
                          sum(len(x) for x in xs))
    return LearnedFit(weights, calibration_feature(folds).reshape(home.shape),
                      transition_matrix(folds), misses, sum(len(x) for x in xs))


def per_layer_fit(x: np.ndarray, dec: np.ndarray, dist: np.ndarray, layer: np.ndarray,
                  layers: int, seed: int = 0) -> np.ndarray:
    """[L, 6] a ranking fit per layer row on its own evictions' rows (layer [R]); a layer with
    fewer than LAYER_ROWS rows takes the fit of every layer's rows. (Layers differ: the
    per-layer weights miss 0.6% less than shared ones on gpt-oss mmlu_dev, on the calibration
    folds and held out alike.)"""
    shared = rank_fit(x, dec, dist, seed)
    out = np.tile(shared, (layers, 1))
    pairs = min(LAYER_PAIRS, PAIR_BUDGET // max(layers, 1))
    order = np.argsort(layer, kind="stable")  # each layer's rows, in their recorded order
    bounds = np.searchsorted(layer[order], np.arange(layers + 1))
    for row in range(layers):
        mine = order[bounds[row]:bounds[row + 1]]
        if len(mine) >= LAYER_ROWS:
            out[row] = rank_fit(x[mine], dec[mine], dist[mine], seed, pairs=pairs)
    return out


def rank_fit(x: np.ndarray, dec: np.ndarray, dist: np.ndarray, seed: int = 0,
             l2: float = 1e-3, pairs: int = PAIRS) -> np.ndarray:
    """[6] weights ranking each eviction's candidates by their next use, the furthest lowest:
    logistic over pairs of one eviction (`pairs` at most, PAIRS_PER_ROW per row; seeded),
    each weighed by the difference of their log2 next-use distances; the largest |weight|
    scaled to 1, the bias 0."""
    features = x[:, :-1]
    mu, sd = features.mean(axis=0), features.std(axis=0)
    sd = np.where(sd > 0, sd, 1.0)
    z = (features - mu) / sd
    rng = np.random.default_rng(seed)
    pairs = min(pairs, PAIRS_PER_ROW * len(z))
    i = rng.integers(0, len(z), 3 * pairs)
    j = np.clip(i + rng.integers(-16, 17, len(i)), 0, len(z) - 1)
    far = np.log2(np.maximum(dist, 1).astype(np.float64))
    ok = (dec[i] == dec[j]) & (far[i] != far[j])
    i, j = i[ok][:pairs], j[ok][:pairs]
    out = np.zeros(x.shape[1])
    if not len(i):
        out[0] = -1.0
        return out
    sign = np.where(far[i] > far[j], 1.0, -1.0)  # +1: i is needed later, should score lower
    weight = np.abs(far[i] - far[j])
    weight /= weight.sum()
    diff = (z[j] - z[i]) * sign[:, None]  # margin: score(kept) - score(evicted)

    def loss(w: np.ndarray) -> tuple[float, np.ndarray]:
        m = diff @ w
        grad = -(weight / (1.0 + np.exp(m))) @ diff
        return float(weight @ np.logaddexp(0.0, -m) + l2 * w @ w), grad + 2 * l2 * w

    w = minimize(loss, np.zeros(z.shape[1]), jac=True, method="L-BFGS-B").x / sd
    out[:-1] = w / max(np.abs(w).max(), 1e-12)
    return out
