"""llama.cpp's ClassLRU, per layer: a miss evicts the slot with the largest age / 2^class,
class = floor(log2(CRF)) as of its last use, CRF = its uses decayed with a 128-token half-life
and kept across evictions.

llama.cpp b12170 (ggml-org/llama.cpp #31233, `src/llama-moe-cache.cpp` at
c4fb579695320929b6a453f4f3a56951bda332ee: the header comment and fields of `moe_cache_lru`)
replaced its per-group LRU with one LRU list per frequency class. The rules, as read and as
`solvers/llamacpp/classlru.py` replays them over llama.cpp's groups of layers (its docstring
and docs/llamacpp.md, "ClassLRU's sources", list what could not be read and the reading
chosen; its constants, n_class and crf_half_life, live in solvers/llamacpp/walk.py, which
compiles them in):

- per key, kept across evictions: CRF (a C float) and the clock at its last use; a use (hit or
  fill, once per distinct expert of a fetch) sets CRF = CRF * 2^(-(now - last use) / 128) + 1;
- 8 classes: class = min(7, floor(log2(CRF))) as of the last use;
- victim: a free slot, else among the slots no key of this fetch holds, the largest
  age / 2^class (age = now - last use), ties to the lowest class, then the least recently
  used (the head of its class's list);
- a fetch updates its hits first, then its misses in ascending expert id.

Here the cache is per card and layer (each layer its own partition, a group of one layer), or
one pool per card (`pooled`: a group of all of its layers). The clock is the token clock
(solvers/cache/kernels.py): the tokens served, the step's tokens included, the same for every
layer of a step. llama.cpp keeps one clock per layer, advanced by the ubatch's real token count
at each fetch of that layer that goes through the cache; where every step fetches every layer
(decode, one card, nothing pinned) the two are the same, and the per-layer classlru and
llama.cpp's replay with one layer per group give the same hits (tests/test_cache_classlru.py).
They part where a card's layer has no cold expert in a step (placer's clock still counts its
tokens, llama.cpp's layer has no fetch on that card's cache to part from) and, pooled, where
llama.cpp ages a later layer's key by its own clock, which has not yet ticked this ubatch.
"""

from __future__ import annotations

import numpy as np

from solvers.cache.kernels import CLASSLRU_SCORE
from solvers.cache.partition import PartitionedCache
from solvers.llamacpp.walk import CRF_HALF_LIFE, N_CLASS


class ClassLRU(PartitionedCache):
    """Age over frequency class within each layer's slots."""

    name = "classlru"
    score = CLASSLRU_SCORE
    keeps = 1  # the CRF of each key
    half_life = CRF_HALF_LIFE  # tokens (llama.cpp's crf_half_life)
    top_class = N_CLASS - 1    # llama.cpp's n_class - 1

    def params(self) -> np.ndarray:
        return np.array([self.half_life, float(self.top_class)])
