"""llama.cpp's expert cache at work: what `--moe-cache-mib` did with a token sequence.

`run_cache` runs a GGUF with every layer on the GPU backend but its experts in host memory
(`-ngl all -ot exps=CPU`) and a cache of `cache_bytes` (`--moe-cache-mib N` is N x 2^20;
the C API takes bytes), one sequence after another in one context (the cache persists
across sequences, as in a server). Where no GPU is present, Vulkan's Mesa software device
(`lavapipe`) is one. It returns, for each ubatch (a sequence's prompt, then each decode
token), the experts each token selected at each MoE layer, every fetch the cache made
(observed in the graph, see worker.py: its distinct experts and which were hits), and what
the cache logged: its slots per group and its totals when the context was freed
(`llama_moe_cache: ubatch <= 8: hits = H, misses = M, hit rate = R%, uploaded = U MiB`,
ggml-org/llama.cpp 4b060f27 `src/llama-moe-cache.cpp` `log_stats` and the constructor).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from traces.errors import TraceError
from traces.llamacpp.runner import EngineOptions, LlamaCpp

TOTALS = re.compile(r"llama_moe_cache: (ubatch <= 8|ubatch  > 8): hits = (\d+), "
                    r"misses = (\d+), hit rate = [\d.]+%, uploaded = ([\d.]+) MiB")
SLOTS = re.compile(r"(\d+) layers, (\w+): +(\d+) slots \(")


@dataclass(frozen=True)
class CacheRun:
    """ubatches: [S] arrays [B_s, L, k] int (router order) of each ubatch's tokens;
    fetches: the cache's fetches in order, {"layer", "experts", "hits", "slots", "tokens"};
    totals: {"ubatch <= 8" | "ubatch  > 8": (hits, misses, uploaded MiB)} as logged;
    slots: [(layers, type, slots)] per group as logged; alignment: the GPU buffer alignment."""

    ubatches: list[np.ndarray]
    layers: list[int]
    fetches: list[dict]
    totals: dict[str, tuple[int, int, float]]
    slots: list[tuple[int, str, int]]
    alignment: int

    def padded(self) -> np.ndarray:
        """The ubatches as one [S, B, L, k] array, -1 past a ubatch's tokens."""
        width = max(len(u) for u in self.ubatches)
        out = np.full((len(self.ubatches), width, *self.ubatches[0].shape[1:]), -1,
                      dtype=np.int64)
        for s, u in enumerate(self.ubatches):
            out[s, :len(u)] = u
        return out


def run_cache(gguf: str, sequences: list[tuple[list[int], int]], cache_bytes: int, top_k: int,
              threads: int = 2) -> CacheRun:
    """Run `sequences` ((prompt token ids, tokens to generate) each) through llama.cpp with
    a cache of `cache_bytes`; TraceError when llama.cpp cannot or logs no cache."""
    options = EngineOptions(gguf, threads=threads, n_gpu_layers=-1, host_experts=True,
                            moe_cache_bytes=cache_bytes, n_expert_used=top_k,
                            n_ctx=max(len(p) + n for p, n in sequences) + 8,
                            n_batch=max(len(p) for p, _ in sequences))
    ubatches, fetches = [], []
    with LlamaCpp(options) as llama:
        for prompt, new in sequences:
            run = llama.run(prompt, new)
            ubatches.append(run.experts[:run.prompt])
            ubatches += [run.experts[t:t + 1] for t in range(run.prompt, len(run.tokens))]
            fetches += run.fetches
        closed = llama.close()
    text = "".join(closed["log"])
    slots = [(int(n), t, int(s)) for n, t, s in SLOTS.findall(text)]
    if not slots:
        raise TraceError(f"llama.cpp logged no MoE cache for {gguf}: {text.strip()!r}")
    totals = {m[0]: (int(m[1]), int(m[2]), float(m[3])) for m in TOTALS.findall(text)}
    return CacheRun(ubatches, run.layers, fetches, totals, slots, int(closed["alignment"]))
