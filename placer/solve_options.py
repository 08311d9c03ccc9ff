"""What a user asks of `placer solve` (kept apart from the solver imports, which are heavy)."""

from __future__ import annotations

from dataclasses import dataclass

SOLVERS = ("ilp", "greedy", "layer", "uniform")
DEFAULT_STEPS = 256  # decode steps sampled per profile and concurrency


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
    num_steps: int = DEFAULT_STEPS
