"""What a user asks of `placer solve` (kept apart from the solver imports, which are heavy)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from placer.errors import PlacerError
from placer.hardware.spec import MAX_BYTES  # a budget or page past it is a typo

SOLVERS = ("ilp", "greedy", "layer", "uniform")
EXECUTIONS = ("stage", "cpu")
DEFAULT_STEPS = 256  # decode steps sampled per profile and concurrency from imported counts
# solvers.cache.POLICIES, named here without importing numba
CACHE_POLICIES = ("classlru", "learned", "lfru", "lfuda", "lru")
# solvers.cache.kernels.FEATURES: the learned policy's features, in the order of its weights
LEARNED_FEATURES = ("age", "decayed_4", "decayed_16", "decayed_64", "calibration", "bias")
MAX_CACHE_SLOTS = 1 << 24


@dataclass(frozen=True)
class SolveOptions:
    solver: str = "greedy"
    budget: int | None = None      # bytes per card for expert pages + staging buffer
    offload: float | None = None   # share of each card's homed expert bytes kept on the host
    concurrency: tuple[int, ...] = (1,)
    weights: tuple[float, ...] | None = None
    ep: str = "contiguous"
    page_size: int | None = None
    robust: bool = False
    time_limit: float = 60.0
    seed: int = 0
    num_steps: int | None = None   # None: every calibration token (counts: DEFAULT_STEPS)
    execution: str = "stage"       # how a cold expert runs: staged to its card, or on the CPU
    cache: int | None = None       # cache slots per card; None: the best split (auto)
    cache_policy: str = "lfru"     # a policy of solvers.cache
    folds: int = 4                 # auto: folds over calibration sequences


def check_options(opts: SolveOptions) -> None:
    """A PlacerError naming the first option out of range."""
    if opts.solver not in SOLVERS:
        raise PlacerError(f"--solver must be one of {', '.join(SOLVERS)}, not {opts.solver!r}")
    if opts.execution not in EXECUTIONS:
        raise PlacerError(f"--execution must be one of {', '.join(EXECUTIONS)}, "
                          f"not {opts.execution!r}")
    if opts.robust and opts.solver not in ("ilp", "greedy"):
        raise PlacerError(f"--robust solves its own MILP: it cannot be combined with --solver "
                          f"{opts.solver} (a fixed baseline)")
    if not 0 <= opts.seed < 2**63:
        raise PlacerError(f"--seed must be in [0, 2**63), not {opts.seed}")
    if not (math.isfinite(opts.time_limit) and opts.time_limit > 0):
        raise PlacerError(f"--time-limit must be a positive number of seconds, not "
                          f"{opts.time_limit}")
    for flag, value, low in (("--budget", opts.budget, 0), ("--page-size", opts.page_size, 1)):
        if value is not None and not low <= value <= MAX_BYTES:
            raise PlacerError(f"{flag} must be {low}..2**60 bytes, not {value}")
    if opts.num_steps is not None and opts.num_steps < 1:
        raise PlacerError(f"--steps must be >= 1 (or left out: every calibration token), not "
                          f"{opts.num_steps}")
    if opts.cache is not None and not 0 <= opts.cache <= MAX_CACHE_SLOTS:
        raise PlacerError(f"--cache must be auto or a slot count in 0..{MAX_CACHE_SLOTS}, not "
                          f"{opts.cache}")
    if opts.cache_policy not in CACHE_POLICIES:
        raise PlacerError(f"--cache-policy must be one of {', '.join(CACHE_POLICIES)}, not "
                          f"{opts.cache_policy!r}")
    if opts.cache_policy == "learned":  # until solve fits its weights on the calibration
        raise PlacerError("--cache-policy learned needs weights fitted on the calibration, "
                          "which solve does not fit yet: choose another policy")
    if opts.folds < 2:
        raise PlacerError(f"folds must be >= 2, not {opts.folds}")
    if any(b < 1 for b in opts.concurrency):
        raise PlacerError(f"--concurrency values must be >= 1, not {list(opts.concurrency)}")
    if opts.weights is not None:
        if any(not math.isfinite(w) or w < 0 for w in opts.weights) or sum(opts.weights) <= 0:
            raise PlacerError(f"--weights must be finite, non-negative and not all 0, not "
                              f"{list(opts.weights)}")
