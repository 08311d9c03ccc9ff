"""What a user asks of `placer solve` (kept apart from the solver imports, which are heavy)."""

from __future__ import annotations

from dataclasses import dataclass

from placer.checkpoint.step import free_memory
from placer.errors import PlacerError
from placer.hardware.spec_values import MAX_BYTES  # a budget or page past it is a typo
from placer.units import format_bytes
from solvers.cache_table import POLICY_NAMES  # plain data: no numba (solvers/cache_table.py)
from traces.options import check_rules

SOLVERS = ("ilp", "greedy", "layer", "uniform")
EXECUTIONS = ("stage", "cpu")
EPS = ("contiguous", "balanced")  # expert-parallel homes (placer.plan.solve.choose_homes)
DEFAULT_STEPS = 256  # decode steps sampled per profile and concurrency from imported counts
STEP_CELL_BYTES = 8  # a sampled step's [L, E] selection and [B, L, k] token ids, as the
#                      solvers and the replay widen them (float64, int64): its memory
# solvers.cache.kernels.FEATURES: the learned policy's features, in the order of its weights
LEARNED_FEATURES = ("age", "decayed_4", "decayed_16", "decayed_64", "calibration", "transition",
                    "bias")


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
    cache_policy: str = "auto"     # solvers/cache_table.py's, or auto: chosen with the split
    folds: int = 4                 # auto: folds over calibration sequences


def check_options(opts: SolveOptions) -> None:
    """A PlacerError naming the first option out of range."""
    if opts.solver not in SOLVERS:
        raise PlacerError(f"--solver must be one of {', '.join(SOLVERS)}, not {opts.solver!r}")
    if opts.execution not in EXECUTIONS:
        raise PlacerError(f"--execution must be one of {', '.join(EXECUTIONS)}, "
                          f"not {opts.execution!r}")
    if opts.ep not in EPS:
        raise PlacerError(f"--ep must be contiguous or balanced, not {opts.ep!r}")
    if opts.robust and opts.solver not in ("ilp", "greedy"):
        raise PlacerError(f"--robust solves its own MILP: it cannot be combined with --solver "
                          f"{opts.solver} (a fixed baseline)")
    check_rules({"seed": opts.seed, "time_limit": opts.time_limit, "steps": opts.num_steps,
                 "cache": opts.cache, "folds": opts.folds, "concurrency": opts.concurrency,
                 "weights": opts.weights, "offload": opts.offload}, "solve",
                error=PlacerError)
    if opts.budget is not None and opts.offload is not None:
        raise PlacerError("give --budget or --offload, not both")
    for flag, value, low in (("--budget", opts.budget, 0), ("--page-size", opts.page_size, 1)):
        if value is not None and not low <= value <= MAX_BYTES:
            raise PlacerError(f"{flag} must be {low}..2**60 bytes, not {value}")
    if opts.cache_policy != "auto" and opts.cache_policy not in POLICY_NAMES:
        raise PlacerError(f"--cache-policy must be auto or one of {', '.join(POLICY_NAMES)}, "
                          f"not {opts.cache_policy!r}")



def check_steps_memory(steps: int | None, batches: tuple[int, ...], layers: int,
                       experts: int, top_k: int, sets: int = 1) -> None:
    """PlacerError where `--steps` sampled decode steps, held at once for each of `sets`
    (trace set, concurrency) pairs at the concurrency `batches` (each step STEP_CELL_BYTES
    per layer for each expert and each token's top-k), need more memory than this host has
    available (placer.checkpoint.step.free_memory): the count is bounded by what it
    allocates, before anything is sampled."""
    if steps is None:
        return
    per_step = max(layers * STEP_CELL_BYTES * (experts + b * top_k) for b in batches)
    need = steps * per_step * max(1, sets)
    free = free_memory()
    if need > free:
        raise PlacerError(f"--steps {steps}: that many sampled decode steps of {layers} MoE "
                          f"layers x {experts} experts (top-{top_k}, B up to {max(batches)}"
                          f"{f', {sets} sets at once' if sets > 1 else ''}) need about "
                          f"{format_bytes(need)}, more than the {format_bytes(free)} this "
                          f"host has available; sample fewer")
