"""The placement problem, a placement, and a solver's result.

Shapes: L MoE layers, E routed experts per layer, C cards, G shared host links,
S sampled decode steps of one traffic profile.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from solvers.cpu import Host
from solvers.errors import SolverError

EXECUTIONS = ("stage", "cpu")


@dataclass(frozen=True)
class Cards:
    """Host-to-device transfer hardware of the cards.

    bandwidth:      [C] float, host->device bytes/s of each card.
    latency:        [C] float, seconds per transfer (one per staged expert).
    link_of:        [C] int, index of the shared host link (socket / PCIe switch) of each card.
    link_bandwidth: [G] float, bytes/s of each shared link; bounds the SUM of its cards'
                    cold bytes per layer.
    """

    bandwidth: np.ndarray
    latency: np.ndarray
    link_of: np.ndarray
    link_bandwidth: np.ndarray

    @property
    def num_cards(self) -> int:
        return int(np.asarray(self.bandwidth).shape[0])

    @property
    def num_links(self) -> int:
        return int(np.asarray(self.link_bandwidth).shape[0])


@dataclass(frozen=True)
class Steps:
    """Sampled decode steps of one traffic profile at one concurrency B.

    selected: [S, L, E] bool, expert e of MoE layer l selected by >= 1 of the B tokens of step s.
    weight:   weight of this (profile, B) in the objective.
    base_step_s: step time with no staging, for tokens/s = B / (base + stall).
    tokens:   [S, B, L, k] int expert ids of each step's tokens (-1: none), or None. The `cpu`
              execution model needs them at B > 1 (how many tokens run a cold expert, and
              which tokens wait for the host); at B = 1 a step is one token and `selected`
              says it all.
    """

    name: str
    batch: int
    selected: np.ndarray
    weight: float = 1.0
    base_step_s: float = 0.0
    tokens: np.ndarray | None = None

    def token_ids(self) -> np.ndarray:
        """[S, B, L, k] int expert ids of each step's tokens (-1: none): `tokens`, or at B = 1
        the selected experts of each step as its one token."""
        if self.tokens is not None:
            return np.asarray(self.tokens)
        if self.batch != 1:
            raise SolverError(f"steps {self.name!r}: the tokens of each step are needed at "
                              f"B = {self.batch} (cpu execution counts tokens per expert)")
        sel = np.asarray(self.selected)
        width = max(1, int(sel.sum(axis=2).max(initial=0)))
        order = np.argsort(~sel, axis=2, kind="stable")[:, :, :width]
        ids = np.where(np.take_along_axis(sel, order, axis=2), order, -1)
        return ids[:, None].astype(np.int64)


@dataclass(frozen=True)
class Problem:
    """Which expert pages stay resident on their home card.

    expert_bytes: [L, E] int64 bytes of each routed expert.
    home:         [L, E] int, card that computes (and stages) each expert.
    capacity:     [C] int64 bytes each card may keep resident (budget already minus staging).
    cards:        transfer hardware.
    steps:        calibration traffic; objective = sum_k weight_k * mean_s stall(steps_k[s]).
    page_bytes:   None: one page per expert; else experts are cut into pages of this size
                  (the last page shorter). Residency is a prefix of pages.
    execution:    how a cold selected expert runs: "stage" (its cold bytes are copied to its
                  home card, which computes it: solvers/cost.py) or "cpu" (the host CPU
                  computes it from host RAM: solvers/cpu.py; whole experts only).
    host:         the host CPU, for execution "cpu".
    expert_flops: [L, E] float FLOPs of one token through each expert (2 x weight
                  elements), for execution "cpu".
    """

    expert_bytes: np.ndarray
    home: np.ndarray
    capacity: np.ndarray
    cards: Cards
    steps: list[Steps] = field(default_factory=list)
    page_bytes: int | None = None
    execution: str = "stage"
    host: Host | None = None
    expert_flops: np.ndarray | None = None

    @property
    def num_layers(self) -> int:
        return int(self.expert_bytes.shape[0])

    @property
    def num_experts(self) -> int:
        return int(self.expert_bytes.shape[1])

    @property
    def num_cards(self) -> int:
        return self.cards.num_cards

    def num_pages(self) -> np.ndarray:
        """[L, E] int64 pages of each expert (1 each without paging)."""
        eb = np.asarray(self.expert_bytes, dtype=np.int64)
        if self.page_bytes is None:
            return np.ones_like(eb)
        return -(-eb // int(self.page_bytes))

    def card_bytes(self) -> np.ndarray:
        """[C] int64 total expert bytes homed on each card."""
        return np.bincount(
            np.asarray(self.home).ravel(),
            weights=np.asarray(self.expert_bytes, dtype=np.float64).ravel(),
            minlength=self.num_cards,
        ).astype(np.int64)


@dataclass(frozen=True)
class Placement:
    """resident_pages: [L, E] int, number of leading pages of each expert kept resident."""

    resident_pages: np.ndarray

    def resident_bytes(self, problem: Problem) -> np.ndarray:
        """[L, E] int64 resident bytes of each expert."""
        eb = np.asarray(problem.expert_bytes, dtype=np.int64)
        r = np.asarray(self.resident_pages, dtype=np.int64)
        if problem.page_bytes is None:
            return eb * r
        return np.minimum(r * int(problem.page_bytes), eb)

    def cold_bytes(self, problem: Problem) -> np.ndarray:
        """[L, E] int64 bytes of each expert left in host memory."""
        return np.asarray(problem.expert_bytes, dtype=np.int64) - self.resident_bytes(problem)

    def card_resident_bytes(self, problem: Problem) -> np.ndarray:
        """[C] int64 resident expert bytes of each card."""
        return np.bincount(
            np.asarray(problem.home).ravel(),
            weights=self.resident_bytes(problem).astype(np.float64).ravel(),
            minlength=problem.num_cards,
        ).astype(np.int64)

    def fits(self, problem: Problem) -> bool:
        """True when no card keeps more than its capacity resident."""
        return bool(np.all(self.card_resident_bytes(problem) <= problem.capacity))


@dataclass(frozen=True)
class SolveResult:
    """A solver's placement with its objective (seconds of weighted expected stall per step;
    robust: worst ratio to layer offload), a proven lower bound (nan when none), the relative
    gap (objective - bound) / objective (0 when optimal, nan without bound), wall seconds and
    status "optimal" | "feasible" | "heuristic"."""

    placement: Placement
    solver: str
    objective: float
    bound: float
    gap: float
    seconds: float
    status: str


def relative_gap(objective: float, bound: float) -> float:
    """(objective - bound) / objective, 0 when both are 0, nan when there is no bound."""
    if not np.isfinite(bound):
        return float("nan")
    if objective <= 0.0:
        return 0.0
    return max(0.0, (objective - bound) / objective)


def validate(problem: Problem, need_steps: bool = True) -> None:
    """Raise SolverError with a one-line reason when the problem is malformed or infeasible."""
    eb = np.asarray(problem.expert_bytes)
    if eb.ndim != 2 or eb.size == 0:
        raise SolverError(f"expert_bytes must be a non-empty [L, E] array, got shape {eb.shape}")
    if not np.issubdtype(eb.dtype, np.integer) or np.any(eb <= 0):
        raise SolverError("expert_bytes must be positive integers")
    home = np.asarray(problem.home)
    if home.shape != eb.shape or not np.issubdtype(home.dtype, np.integer):
        raise SolverError(f"home must be an int array of shape {eb.shape}, got {home.shape}")
    cards = problem.cards
    num_cards = cards.num_cards
    for name in ("bandwidth", "latency", "link_of"):
        if np.asarray(getattr(cards, name)).shape != (num_cards,):
            raise SolverError(f"cards.{name} must have shape [{num_cards}]")
    if num_cards == 0:
        raise SolverError("at least one card is needed")
    if home.min() < 0 or home.max() >= num_cards:
        raise SolverError(f"home must hold card indices in [0, {num_cards})")
    if np.any(np.asarray(cards.bandwidth) <= 0) or np.any(np.asarray(cards.latency) < 0):
        raise SolverError("card bandwidth must be positive and latency non-negative")
    link_of = np.asarray(cards.link_of)
    lbw = np.asarray(cards.link_bandwidth)
    if lbw.ndim != 1 or lbw.size == 0 or np.any(lbw <= 0):
        raise SolverError("link_bandwidth must be a non-empty [G] array of positive values")
    if (not np.issubdtype(link_of.dtype, np.integer) or link_of.min() < 0
            or link_of.max() >= lbw.size):
        raise SolverError(f"cards.link_of must hold link indices in [0, {lbw.size})")
    cap = np.asarray(problem.capacity)
    if cap.shape != (num_cards,):
        raise SolverError(f"capacity must have shape [{num_cards}], got {cap.shape}")
    if np.any(cap < 0):
        bad = int(np.argmin(cap))
        raise SolverError(
            f"infeasible: card {bad} has negative capacity {int(cap[bad])} bytes "
            "(staging buffer and reserved bytes exceed its memory)"
        )
    if problem.page_bytes is not None and int(problem.page_bytes) <= 0:
        raise SolverError(f"page_bytes must be positive, got {problem.page_bytes}")
    if problem.execution not in EXECUTIONS:
        raise SolverError(f"execution must be one of {', '.join(EXECUTIONS)}, "
                          f"got {problem.execution!r}")
    if problem.execution == "cpu":
        if problem.host is None:
            raise SolverError("cpu execution needs the host's figures (the spec's [host] table)")
        problem.host.check()
        if problem.page_bytes is not None:
            raise SolverError("cpu execution computes whole experts on the host: pages are "
                              "for staging (drop --page-size)")
        flops = problem.expert_flops
        if (flops is None or np.asarray(flops).shape != eb.shape
                or not np.all(np.isfinite(flops)) or np.any(np.asarray(flops) < 0)):
            raise SolverError(f"cpu execution needs expert_flops, a finite non-negative "
                              f"{list(eb.shape)} array")
    if need_steps and not problem.steps:
        raise SolverError("the problem has no calibration steps")
    for st in problem.steps:
        sel = np.asarray(st.selected)
        if sel.dtype != np.bool_ or sel.ndim != 3 or sel.shape[1:] != eb.shape or sel.shape[0] == 0:
            raise SolverError(
                f"steps {st.name!r}: selected must be a bool [S, {eb.shape[0]}, {eb.shape[1]}] "
                f"array with S >= 1, got {sel.dtype} {sel.shape}"
            )
        if not np.isfinite(st.weight) or st.weight < 0:
            raise SolverError(f"steps {st.name!r}: weight must be finite and non-negative")
        if st.tokens is not None:
            tok = np.asarray(st.tokens)
            if (tok.ndim != 4 or tok.shape[0] != sel.shape[0] or tok.shape[2] != eb.shape[0]
                    or not np.issubdtype(tok.dtype, np.integer) or tok.max(initial=-1)
                    >= eb.shape[1] or tok.min(initial=-1) < -1):
                raise SolverError(f"steps {st.name!r}: tokens must be an int [S, B, "
                                  f"{eb.shape[0]}, k] array of expert ids or -1, got "
                                  f"{tok.dtype} {tok.shape}")


def check_placement(problem: Problem, placement: Placement) -> None:
    """Raise SolverError when a placement has the wrong shape or page counts out of range."""
    r = np.asarray(placement.resident_pages)
    if r.shape != problem.expert_bytes.shape:
        raise SolverError(
            f"placement shape {r.shape} != problem shape {problem.expert_bytes.shape}")
    if np.any(r < 0) or np.any(r > problem.num_pages()):
        raise SolverError("placement resident_pages out of range [0, num_pages]")
