"""Replaying decode steps through a card's cache, as the runtime would serve them.

Order matters for a cache, so the replay walks the traffic the way the runtime does: step by
step (a forward), MoE layer by layer, and per layer one fetch per card of the selected cold
experts it homes, in ascending expert id, each through the policy's compiled `fetch`. The
whole walk runs compiled (numba): 200k decode tokens x 24 layers of gpt-oss-20b's routing in
about a second (`benchmarks/bench_cache.py`).

Cold experts are those with cold bytes (not fully resident: pinned experts never reach the
cache). A hit costs nothing; a miss stages the expert's cold bytes, one copy, as
`solvers.cost` counts it, so the cost of cached traffic is the cost model's on the missed
experts: `missed = selected & cold & ~hits`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from solvers.cache.kernels import replay_requests
from solvers.cache.policy import CachePolicy


@dataclass(frozen=True)
class Requests:
    """Selections as the caches see them: keys [N] int32 (layer * E + expert) of the experts each
    step selected at each MoE layer, grouped by (step, layer) in the order served, ascending
    within a group, group g = step * L + layer spanning offsets[g] .. offsets[g + 1] - 1.
    As long as selections are sparse (top-k of E), walking them beats scanning [S, L, E].
    tokens: the tokens of each step (one count for all, or [S]): what the token clock of the
    policies with decaying memory advances by (solvers/cache/kernels.py)."""

    keys: np.ndarray
    offsets: np.ndarray
    shape: tuple[int, int, int]
    tokens: int | np.ndarray = 1

    def times(self, start: int) -> np.ndarray:
        """[S] int64: the token time of each step, the walk starting after token time
        `start`."""
        per_step = np.broadcast_to(np.asarray(self.tokens, dtype=np.int64), self.shape[:1])
        return start + np.cumsum(per_step, dtype=np.int64)

    @classmethod
    def of(cls, selected: np.ndarray, tokens: int | np.ndarray = 1) -> Requests:
        """The requests of [S, L, E] bool selections, `tokens` tokens in each step."""
        steps, layers, experts = selected.shape
        group, expert = np.nonzero(selected.reshape(steps * layers, experts))
        keys = (group % layers) * experts + expert
        offsets = np.zeros(steps * layers + 1, dtype=np.int64)
        np.cumsum(np.bincount(group, minlength=steps * layers), out=offsets[1:])
        return cls(keys.astype(np.int32), offsets, (steps, layers, experts), tokens)

    @classmethod
    def of_tokens(cls, tokens: np.ndarray, experts: int, chunk: int = 1 << 20) -> Requests:
        """The requests of decode steps given as their tokens, [S, B, L, k] expert ids (-1:
        none), without the [S, L, E] mask (`chunk` (step, layer) groups at a time): the
        same as `of(step_mask(tokens, experts), B)` in a fraction of the memory."""
        steps, batch, layers, k = tokens.shape
        groups = np.asarray(tokens).transpose(0, 2, 1, 3).reshape(steps * layers, batch * k)
        keys, counts = [], np.zeros(steps * layers, dtype=np.int64)
        for start in range(0, len(groups), chunk):
            part = np.sort(groups[start:start + chunk], axis=1)
            keep = part >= 0
            keep[:, 1:] &= part[:, 1:] != part[:, :-1]
            counts[start:start + len(part)] = keep.sum(axis=1)
            base = (np.arange(start, start + len(part), dtype=np.int32) % layers) * experts
            keys.append(part[keep].astype(np.int32)
                        + np.repeat(base, counts[start:start + len(part)]))
        offsets = np.zeros(steps * layers + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        return cls(np.concatenate(keys) if keys else np.zeros(0, np.int32), offsets,
                   (steps, layers, experts), batch)

    def relabeled(self, home: np.ndarray, seed: int) -> Requests:
        """The same steps with each layer's experts renamed by a seeded permutation within
        each card's experts (home: [L, E] card of each): traffic that reuses experts exactly
        as this does and loads each card as much, but prefers none of the same experts (what
        a placement fitted on this traffic meets on traffic unlike it). Keys stay ascending
        within each (step, layer) group."""
        steps, layers, experts = self.shape
        rng = np.random.default_rng(seed)
        rename = np.tile(np.arange(experts), (layers, 1))
        for layer in range(layers):
            for card in np.unique(home[layer]):
                mine = np.flatnonzero(home[layer] == card)
                rename[layer, mine] = rng.permutation(mine)
        rename = (rename + np.arange(layers)[:, None] * experts).astype(np.int32).ravel()
        width = layers * experts
        ordered = np.repeat(np.arange(steps * layers, dtype=np.int64) * width,
                            np.diff(self.offsets))
        ordered += rename[self.keys]
        ordered.sort()
        return Requests((ordered % width).astype(np.int32), self.offsets, self.shape,
                        self.tokens)

    def hits(self, policy: CachePolicy, cacheable: np.ndarray, home: np.ndarray) -> np.ndarray:
        """[N] bool: which requests `policy`'s caches hold when they come (state carries)."""
        out = np.zeros(len(self.keys), dtype=np.bool_)
        self._walk(policy, cacheable, home, out, np.zeros(0, dtype=np.int64))
        return out

    def misses(self, policy: CachePolicy, cacheable: np.ndarray, home: np.ndarray
               ) -> np.ndarray:
        """[L, E] misses of each cacheable expert under `policy` (counted in the walk)."""
        _, layers, experts = self.shape
        cacheable = np.ascontiguousarray(cacheable, dtype=np.bool_).ravel()
        out = np.zeros(layers * experts, dtype=np.int64)
        if not self._walk(policy, cacheable, home, np.zeros(0, dtype=np.bool_), out):
            out = np.bincount(self.keys[cacheable[self.keys]], minlength=layers * experts)
        return out.reshape(layers, experts)

    def _walk(self, policy: CachePolicy, cacheable: np.ndarray, home: np.ndarray,
              hits: np.ndarray, misses: np.ndarray) -> bool:
        """The compiled walk (solvers/cache/kernels.py) into hits [N] and misses [L * E]
        (either empty: not filled); False, nothing walked, where there are no requests or
        no slots (every request misses). Either way the policy's token clock ends at this
        walk's last step."""
        times = self.times(policy.now)
        if not (len(self.keys) and policy.slots.any()):
            if len(times):
                policy.state[0][2] = times[-1]
            return False
        replay_requests(policy.state, policy.score, self.keys, self.offsets, times,
                        np.ascontiguousarray(cacheable, dtype=np.bool_).ravel(),
                        np.ascontiguousarray(home, dtype=np.int64).ravel(),
                        len(policy.slots), self.shape[2], hits, np.zeros(0, dtype=np.int64),
                        misses)
        return True


def cache_hits(policy: CachePolicy, selected: np.ndarray, cold_bytes: np.ndarray,
               home: np.ndarray, tokens: int | np.ndarray = 1) -> np.ndarray:
    """[S, L, E] bool: which selected cold experts the caches hold when their fetch comes.

    selected: [S, L, E] bool, the experts each step's tokens selected (union over its tokens)
    at each MoE layer, in the order served; cold_bytes: [L, E] bytes of each expert that are
    not resident (0: fully resident, never cached); home: [L, E] card of each expert;
    tokens: of each step (one count for all, or [S]). The policy's state carries over from
    call to call, so long traffic can go in chunks."""
    selected = np.asarray(selected, dtype=np.bool_)
    requests = Requests.of(selected, tokens)
    out = np.zeros(selected.shape, dtype=np.bool_)
    hit = requests.hits(policy, np.asarray(cold_bytes) > 0, home)
    flat = out.reshape(-1)
    steps_layers = np.repeat(np.arange(len(requests.offsets) - 1),
                             np.diff(requests.offsets))
    flat[steps_layers // selected.shape[1] * selected[0].size
         + requests.keys] = hit
    return out


@dataclass(frozen=True)
class StagingCounts:
    """Per step s, MoE layer l (ordinal) and card c: bytes staged, copies, cache hits."""

    bytes: np.ndarray   # [S, L, C] int64
    copies: np.ndarray  # [S, L, C] int64
    hits: np.ndarray    # [S, L, C] int64


def staging_counts(selected: np.ndarray, hits: np.ndarray, cold_bytes: np.ndarray,
                   home: np.ndarray, num_cards: int) -> StagingCounts:
    """What the runtime stages for `selected` given which of them hit (see cache_hits)."""
    cold_bytes = np.asarray(cold_bytes, dtype=np.int64)
    onehot = np.eye(num_cards, dtype=np.int64)[np.asarray(home)]  # [L, E, C]
    cold = np.asarray(selected, dtype=bool) & (cold_bytes > 0)
    missed = (cold & ~hits).astype(np.int64)
    return StagingCounts(np.einsum("sle,le,lec->slc", missed, cold_bytes, onehot),
                         np.einsum("sle,lec->slc", missed, onehot),
                         np.einsum("sle,lec->slc", (cold & hits).astype(np.int64), onehot))
