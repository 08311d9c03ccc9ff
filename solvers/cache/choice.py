"""Which cache policy serves a split: chosen on the split's own held-out folds.

The split (solvers/cache/split.py) is chosen under one policy (its cost table's). Its pins
and slots are then served, fold by fold, by each policy of CHOICES, per layer and pooled
(one pool of each card's slots that every layer shares): for each held-out unit the plan the
split judged there (chosen on the other units), its pins ranked as the split ranked them for
that fold, and its misses counted on the held-out fold itself. `learned`'s weights for a
fold are fitted on that fold's training entries only (solvers/cache/learn.py), never on the
fold it is judged on (per layer; the pooled learned policy runs the same weights). The
policy of least held-out objective (the split's: stall, or the regret under --robust) is
chosen; the plan's own weights are then fitted on every calibration fold.

Cost: one replay per policy, pooling and held-out entry, and one fit of the learned weights
per training set. Beyond POLICY_KEYS requests in all, each fold is judged on its first steps
only (a prefix, the same for every policy), and the figures are scaled to the split's: the
chosen policy's stall is the split's times its ratio to the split's policy on the prefix.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace

import numpy as np

from solvers.cache import make_policy
from solvers.cache.costs import CostTable, first, pins_of
from solvers.cache.learn import fit_learned
from solvers.cache.replay import Requests

CHOICES = ("lru", "lfru", "lfuda", "classlru", "learned")
POLICY_KEYS = 1.5e8   # requests the choice replays at most (beyond: a prefix of each fold)
FIT_KEYS = 2.4e7      # requests the held-out fits of the learned weights replay per round


@dataclass(frozen=True)
class PolicyChoice:
    """The chosen policy (`name`, `pooled`; learned: `weights` [L, 7] and `calibration` [L, E]),
    its held-out `stall_s` (and on renamed folds `unlike_stall_s`), `objective`, the share of
    each fold replayed (`judged`, 1: all of it) and every candidate's row."""

    name: str
    pooled: bool
    stall_s: float
    objective: float
    unlike_stall_s: float | None
    judged: float
    weights: np.ndarray | None = None
    calibration: np.ndarray | None = None
    transition: np.ndarray | None = None  # learned: [L, E, E] (solvers/cache/learn.py)
    rows: list[dict] = field(default_factory=list)


def entry_pins(table: CostTable, n: int, p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """[L, E] the pins of p[c, l] per (card, layer) for entry n, ranked as the split ranked
    them for that entry (on its training entries, under the layer's q slots)."""
    home = table.problem.home
    pinned = np.zeros(home.shape, dtype=bool)
    for slots in np.unique(q):
        pinned |= pins_of(table.rank(n, int(slots)), first(np.where(q == slots, p, 0),
                                                           home.shape[1]), home)
    return pinned


def prefix(requests: Requests, share: float) -> Requests:
    """The first steps of `requests` holding about `share` of its requests (at least one)."""
    steps, layers, experts = requests.shape
    if share >= 1.0:
        return requests
    cut = int(np.searchsorted(requests.offsets, share * len(requests.keys), side="right"))
    keep = max(1, cut // layers)
    tokens = requests.tokens if np.ndim(requests.tokens) == 0 else requests.tokens[:keep]
    return Requests(requests.keys[:requests.offsets[keep * layers]],
                    requests.offsets[:keep * layers + 1], (keep, layers, experts), tokens)


def choose_policy(table: CostTable, plans: list, weight: np.ndarray, share: np.ndarray,
                  renamed: np.ndarray, split_stall: float, seed: int = 0,
                  choices: tuple[str, ...] = CHOICES) -> PolicyChoice:
    """The policy of least held-out objective for the split whose per-unit plans `plans`
    ([(held-out entries [F] bool, plan with p, q [C, L])], as _nested judged them) are;
    weight, share, renamed: [F] the objective's and the stall's weights of each entry and
    whether it is a renamed twin; split_stall: the split's own held-out stall."""
    problem, home = table.problem, table.problem.home
    layers, experts = home.shape
    work = [(n, plan) for held, plan in plans for n in np.flatnonzero(held)]
    variants = [(name, pooled) for name in choices for pooled in (False, True)]
    total = len(variants) * sum(len(table.entries[n].requests.keys) for n, _ in work)
    judged = min(1.0, POLICY_KEYS / max(total, 1))
    pins = {n: entry_pins(table, n, plan.p, plan.q) for n, plan in work}
    plan_of = dict(work)
    trains = {table.entries[n].train: n for n, _ in work} if "learned" in choices else {}
    per_fit = int(FIT_KEYS // max(1, len(trains)))

    def fit(n: int) -> dict:
        got = fit_learned([table.entries[m].requests for m in table.entries[n].train],
                          ~pins[n], home, plan_of[n].q, seed=seed, limit=per_fit)
        return got.options

    def replay(job: tuple[int, str, bool]) -> float:
        n, name, pooled = job
        options = fitted[table.entries[n].train] if name == "learned" else {}
        cache = make_policy(name, plan_of[n].q, layers * experts, pooled=pooled, **options)
        misses = prefix(table.entries[n].requests, judged).misses(cache, ~pins[n], home)
        return float(table.seconds(n, misses).sum())

    with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        fitted = dict(zip(trains, pool.map(fit, trains.values()), strict=True))
        jobs = [(n, name, pooled) for n, _ in work for name, pooled in variants]
        stall = {v: np.zeros(len(table.entries)) for v in variants}
        for (n, name, pooled), s in zip(jobs, pool.map(replay, jobs), strict=True):
            stall[(name, pooled)][n] = s
    base = stall[(problem.policy, False)] if (problem.policy, False) in stall else None
    base_stall = float(share * ~renamed @ base) if base is not None else 0.0
    scale = split_stall / base_stall if base_stall > 0 and judged < 1.0 else 1.0
    rows = []
    for name, pooled in variants:
        s = stall[(name, pooled)]
        rows.append({"policy": name, "pooled": pooled, "objective": float(weight @ s) * scale,
                     "stall_s": float(share * ~renamed @ s) * scale,
                     "unlike_stall_s": float(share * renamed @ s) * scale if renamed.any()
                     else None})
    best = min(rows, key=lambda r: r["objective"])
    for row in rows:
        row["chosen"] = row is best
    return PolicyChoice(best["policy"], best["pooled"], best["stall_s"], best["objective"],
                        best["unlike_stall_s"], judged, rows=rows)


def with_weights(choice: PolicyChoice, table: CostTable, pinned: np.ndarray,
                 quotas: np.ndarray, seed: int = 0) -> PolicyChoice:
    """The choice with the learned weights of the final plan (pinned [L, E], quotas [C, L]),
    fitted on every calibration fold (each fold's calibration share from the folds of other
    sequences), where the learned policy was chosen. Fitted per layer, pooled or not, as the
    folds' weights were: the pooled learned policy is judged with them."""
    if choice.name != "learned":
        return choice
    calib = table.calibration
    fit = fit_learned([table.entries[n].requests for n in calib], ~pinned, table.problem.home,
                      quotas, seed=seed,
                      units=[table.entries[n].unit for n in calib])
    return replace(choice, weights=fit.weights, calibration=fit.calibration,
                   transition=fit.transition)
