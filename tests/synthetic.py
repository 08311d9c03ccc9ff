"""Synthetic DeepSeek-like routing traffic for tests and benchmarks.

Each layer has a Zipf-like expert popularity (a random permutation of ranks per layer,
exponent drawn in [1.0, 1.2]). Tokens belong to latent topics: a topic boosts a cluster of
experts in every layer, so experts of a cluster are selected together and layers are
correlated. A sequence keeps one main topic and drifts to another topic on some tokens.
"""

from __future__ import annotations

import numpy as np

from solvers.errors import SolverError
from solvers.problem import Steps
from solvers.steps import gumbel_top_k


def deepseek_like(
    num_layers: int = 58,
    num_experts: int = 256,
    top_k: int = 8,
    num_tokens: int = 8192,
    num_seqs: int = 256,
    seed: int = 0,
    sample_seed: int | None = None,
    num_topics: int = 16,
    topic_boost: float = 2.0,
    topic_stay: float = 0.7,
) -> tuple[np.ndarray, np.ndarray]:
    """Generate routing of `num_tokens` tokens spread evenly over `num_seqs` sequences.

    `seed` fixes the routing model (popularity, topics); `sample_seed` (default: seed) fixes
    the tokens, so two calls with one seed and two sample seeds give independent samples of
    the same traffic. Returns (selected [T, L, k] int expert ids, distinct per row;
    seq_ids [T] int in [0, num_seqs)).
    """
    if not 1 <= top_k <= num_experts:
        raise SolverError(f"top_k must be in [1, {num_experts}], got {top_k}")
    if not 1 <= num_seqs <= num_tokens:
        raise SolverError(f"need 1 <= num_seqs <= num_tokens, got {num_seqs} and {num_tokens}")
    model = np.random.default_rng(seed)
    exponent = model.uniform(1.0, 1.2, size=num_layers)
    rank = np.stack([model.permutation(num_experts) for _ in range(num_layers)])  # [L, E]
    base = -exponent[:, None] * np.log1p(rank)  # [L, E] log-popularity
    cluster = 2 * top_k
    logits = np.repeat(base[None], num_topics, axis=0)  # [K, L, E]
    logits += 0.5 * model.standard_normal(logits.shape)
    for topic in range(num_topics):
        for layer in range(num_layers):
            members = model.choice(num_experts, size=min(cluster, num_experts), replace=False)
            logits[topic, layer, members] += topic_boost

    tokens = np.random.default_rng(seed if sample_seed is None else sample_seed)
    seq_ids = np.sort(np.arange(num_tokens) % num_seqs)
    main_topic = tokens.integers(num_topics, size=num_seqs)
    drift = tokens.random(num_tokens) >= topic_stay
    topic = np.where(drift, tokens.integers(num_topics, size=num_tokens), main_topic[seq_ids])
    selected = np.empty((num_tokens, num_layers, top_k), dtype=np.int64)
    for layer in range(num_layers):
        selected[:, layer, :] = gumbel_top_k(logits[topic, layer, :], top_k, tokens)
    return selected, seq_ids


def steps_from_tokens(
    selected: np.ndarray,
    seq_ids: np.ndarray,
    num_experts: int,
    batch: int,
    num_steps: int,
    seed: int,
    name: str = "synthetic",
    weight: float = 1.0,
    base_step_s: float = 0.0,
) -> Steps:
    """Sample decode steps of `batch` concurrent sequences: each step takes one random token
    from each of `batch` distinct random sequences.

    selected: [T, L, k] int expert ids per token; seq_ids: [T] int. Returns Steps with
    selected [num_steps, L, num_experts] bool.
    """
    selected = np.asarray(selected)
    seq_ids = np.asarray(seq_ids)
    if selected.ndim != 3 or seq_ids.shape != selected.shape[:1]:
        raise SolverError("selected must be [T, L, k] and seq_ids [T]")
    seqs, start, count = np.unique(seq_ids, return_index=True, return_counts=True)
    order = np.argsort(seq_ids, kind="stable")
    if not 1 <= batch <= seqs.size:
        raise SolverError(f"batch must be in [1, {seqs.size}] (distinct sequences), got {batch}")
    rng = np.random.default_rng(seed)
    chosen = np.argsort(rng.random((num_steps, seqs.size)), axis=1)[:, :batch]  # [S, B]
    offset = np.floor(rng.random((num_steps, batch)) * count[chosen]).astype(np.int64)
    tok = order[start[chosen] + offset]  # [S, B]
    num_layers, top_k = selected.shape[1:]
    mask = np.zeros((num_steps, num_layers, num_experts), dtype=bool)
    picks = selected[tok]  # [S, B, L, k]
    s_idx = np.broadcast_to(np.arange(num_steps)[:, None, None, None], picks.shape)
    l_idx = np.broadcast_to(np.arange(num_layers)[None, None, :, None], picks.shape)
    mask[s_idx.ravel(), l_idx.ravel(), picks.ravel()] = True
    return Steps(name=name, batch=batch, selected=mask, weight=weight, base_step_s=base_step_s)
