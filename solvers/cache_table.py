"""The cache policies placer runs, one row each: the one place their names live.

`--cache-policy`'s values and its `--help`, the options check, the plan check, the
candidates `--cache-policy auto` judges (solvers/cache/choice.py) and the kernel's victim rule
of each (solvers/cache/kernels.py) all come from POLICY_TABLE; solvers/cache/__init__.py maps
each row's name to the class that runs it (`POLICIES`, in this order). Plain data, no numpy or
numba (solvers/cache/ compiles with numba on import): the CLI's `--help` and the checks read
it without loading the caches.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PolicyRow:
    """One policy.

    name:   `--cache-policy`'s value, a plan card's `cache_policy`, the class's `name`.
    score:  the victim rule `replay_requests` applies (solvers/cache/kernels.py compiles these
            ids in, and numba's disk cache checks only that file for changes: change an id
            here and touch kernels.py).
    help:   what `placer solve --help` says of it.
    auto:   whether `--cache-policy auto` judges it (solvers/cache/choice.py CHOICES).
    fitted: its parameters are fitted on the calibration folds with the plan and shipped in
            the plan's `cache_params`: it cannot price a split before they are, so the split
            is chosen under DEFAULT_POLICY and the policy then fitted to it and judged on the
            held-out folds (solvers/cache/choice.py), whether auto or asked for by name.
    """

    name: str
    score: int
    help: str
    auto: bool = True
    fitted: bool = False


POLICY_TABLE = (
    PolicyRow("lru", 0, "least recently used (llama.cpp PR #27861)"),
    PolicyRow("lfru", 1, "fewest hits since admission over accesses since the last one (vLLM "
                         "PR #37190)"),
    PolicyRow("lfuda", 2, "BigRig 0.9.1's LFU with dynamic aging"),
    PolicyRow("classlru", 3, "llama.cpp b12170's ClassLRU"),
    PolicyRow("learned", 4, "a linear score whose weights are fitted on the calibration folds "
                            "and stored in the plan (the split is chosen under lfru, as auto "
                            "chooses it, and learned per layer or pooled then serves it, "
                            "whichever its held-out folds favour)", fitted=True),
)
POLICY_NAMES = tuple(row.name for row in POLICY_TABLE)
AUTO_POLICIES = tuple(row.name for row in POLICY_TABLE if row.auto)
DEFAULT_POLICY = "lfru"  # prices the split (auto, a fitted policy); a plan's caches without one

AUTO_HELP = ("auto: each policy, per layer and pooled, serves the chosen split (and the plain "
             "cache) on its held-out folds, and the least stall serves unless (a guard) it "
             "stalls more than the better of plain lru and lfuda on the same folds with "
             "experts renamed, beyond their interval, or, not being one of them, it is under "
             "5% below them on its own folds or the renamed folds leave room for a loss over "
             "5%: that engine serves then")


def policy_row(name: str) -> PolicyRow:
    """The row of policy `name` (a ValueError naming the policies where there is none)."""
    for row in POLICY_TABLE:
        if row.name == name:
            return row
    raise ValueError(f"unknown cache policy {name!r}; choose from {', '.join(POLICY_NAMES)}")


def cache_policy_help() -> str:
    """`placer solve --cache-policy`'s help: the values, what auto does, each row's line."""
    names = " | ".join(row.name for row in POLICY_TABLE)
    lines = "; ".join(f"{row.name}: {row.help}" for row in POLICY_TABLE)
    return f"Which staged expert a full cache evicts: auto | {names}. {AUTO_HELP}. {lines}."
