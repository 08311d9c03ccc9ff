"""From an inventory, a hardware spec, traces and a budget to a solved placement plan.

This module is the bridge between the byte-level world (inventory, hardware, plan) and the
array world of `solvers/`: it turns them into a `solvers.Problem`, runs the chosen solver
and the baselines at the same budget, and writes the predictions into the plan.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from placer.errors import PlacerError
from placer.hardware import HardwareSpec
from placer.inventory import Inventory
from placer.plan import Plan, build_plan
from placer.solve_options import SOLVERS, SolveOptions
from placer.units import format_bytes
from solvers import baselines, greedy, homes, ilp, robust
from solvers.cost import step_stats
from solvers.problem import Cards, Placement, Problem, SolveResult, Steps
from solvers.staging import staging_bytes
from traces.dataset import check_compatible, check_shape
from traces.profile import Profile, load_profile, sample_steps


@dataclass(frozen=True)
class Traffic:
    """One calibration or evaluation traffic set: its profile and sampled steps per batch."""

    name: str
    path: Path | None
    profile: Profile | None
    steps: dict[int, np.ndarray] = field(default_factory=dict)  # B -> [S, L, E] bool


def load_traffic(trace_dir: Path, inv: Inventory, batches: tuple[int, ...], num_steps: int,
                 seed: int, seq_ids: set[int] | None = None) -> Traffic:
    """Check `trace_dir` against the model and sample its decode steps at every batch."""
    trace_dir = Path(trace_dir)
    if inv.estimated:  # a config-only inventory has no real fingerprint: check shapes only
        check_shape(trace_dir, len(inv.moe_layers), inv.experts_per_layer)
    else:
        check_compatible(trace_dir, inv.fingerprint, inv.moe_layers, inv.experts_per_layer)
    profile = load_profile(trace_dir, seq_ids=seq_ids)
    steps = {b: sample_steps(profile if not profile.per_token else trace_dir, b, num_steps,
                             seed, seq_ids=seq_ids) for b in batches}
    return Traffic(profile.name or trace_dir.name, trace_dir, profile, steps)


def cards_of(spec: HardwareSpec) -> Cards:
    """The transfer hardware of a spec as solver arrays (cards in no link get no shared bound)."""
    groups = spec.groups()
    link_of = np.zeros(len(spec.cards), dtype=np.int64)
    link_bw = []
    for g, members in enumerate(groups):
        link_of[list(members)] = g
        link_bw.append(spec.links[g].bandwidth if g < len(spec.links) else np.inf)
    return Cards(bandwidth=np.array([c.h2d_bandwidth for c in spec.cards]),
                 latency=np.array([c.latency_s for c in spec.cards]),
                 link_of=link_of, link_bandwidth=np.array(link_bw, dtype=np.float64))


def choose_homes(inv: Inventory, spec: HardwareSpec, ep: str, traffic: list[Traffic]
                 ) -> np.ndarray:
    """[L, E] expert-parallel home card of each expert."""
    num_cards = len(spec.cards)
    layers, experts = len(inv.moe_layers), inv.experts_per_layer
    if ep == "contiguous":
        return homes.contiguous_homes(layers, experts, num_cards)
    if ep == "balanced":
        load = sum((t.profile.frequency() for t in traffic if t.profile is not None),
                   np.zeros((layers, experts)))
        return homes.balanced_homes(load, inv.expert_bytes(), num_cards)
    raise PlacerError(f"--ep must be contiguous or balanced, not {ep!r}")


def card_budgets(inv: Inventory, spec: HardwareSpec, home: np.ndarray, opts: SolveOptions
                 ) -> tuple[np.ndarray, np.ndarray]:
    """([C] budget bytes, [C] staging bytes) per card, or a PlacerError when infeasible."""
    sizes = inv.expert_bytes()
    num_cards = len(spec.cards)
    staging = staging_bytes(sizes, home, num_cards, max(opts.concurrency), inv.top_k)
    homed = np.bincount(home.ravel(), weights=sizes.ravel(), minlength=num_cards).astype(np.int64)
    free = np.array([c.free_bytes for c in spec.cards], dtype=np.int64)
    if opts.budget is not None and opts.offload is not None:
        raise PlacerError("give --budget or --offload, not both")
    if opts.offload is not None:
        if not 0.0 < opts.offload < 1.0:
            raise PlacerError(f"--offload must be a share in (0, 1), not {opts.offload}")
        budget = np.floor((1.0 - opts.offload) * homed).astype(np.int64) + staging
    elif opts.budget is not None:
        budget = np.full(num_cards, opts.budget, dtype=np.int64)
    else:
        budget = free
    for c in range(num_cards):
        if budget[c] < staging[c]:
            raise PlacerError(
                f"card {c}: budget {format_bytes(budget[c])} cannot hold its staging buffer of "
                f"{format_bytes(staging[c])} (concurrency {max(opts.concurrency)} x top-k "
                f"{inv.top_k} experts of up to {format_bytes(int(sizes.max()))})")
        if budget[c] > free[c]:
            raise PlacerError(
                f"card {c}: budget {format_bytes(budget[c])} exceeds its free VRAM "
                f"{format_bytes(free[c])} (vram minus reserved dense, KV and activations)")
    if np.all(budget - staging >= homed):
        raise PlacerError(
            f"the budget holds every expert ({format_bytes(int(homed.max()))} per card at most): "
            f"nothing needs to stay on the host, so there is no placement to solve")
    return budget, staging


def make_problem(inv: Inventory, spec: HardwareSpec, home: np.ndarray, capacity: np.ndarray,
                 traffic: list[Traffic], opts: SolveOptions) -> Problem:
    """The solver's problem over the given traffic (steps weighted per concurrency)."""
    weights = opts.weights or tuple(1.0 / len(opts.concurrency) for _ in opts.concurrency)
    if len(weights) != len(opts.concurrency):
        raise PlacerError("--weights needs one weight per --concurrency value")
    steps = [Steps(t.name, b, t.steps[b], w / len(traffic), spec.base_step_s(b))
             for t in traffic for b, w in zip(opts.concurrency, weights, strict=True)]
    return Problem(inv.expert_bytes(), home, capacity, cards_of(spec), steps, opts.page_size)


def robust_scenarios(inv: Inventory, spec: HardwareSpec, home: np.ndarray,
                     capacity: np.ndarray, traffic: list[Traffic], opts: SolveOptions
                     ) -> list[Problem]:
    """One problem per (profile, concurrency), named "PROFILE B=b": robust mode bounds the
    ratio to layer offload at every concurrency, as `placer evaluate` judges it, not only
    their weighted mix."""
    return [Problem(inv.expert_bytes(), home, capacity, cards_of(spec),
                    [Steps(f"{t.name} B={b}", b, t.steps[b], 1.0, spec.base_step_s(b))],
                    opts.page_size)
            for t in traffic for b in opts.concurrency]


def run_solver(name: str, problem: Problem, opts: SolveOptions, top_k: int) -> SolveResult:
    """Solve `problem` with solver `name` (ilp, greedy, layer, uniform)."""
    if name == "greedy":
        return greedy.solve(problem, seed=opts.seed)
    if name == "ilp":
        return ilp.solve(problem, time_limit=opts.time_limit, seed=opts.seed)
    if name == "layer":
        return baselines.layer_offload(problem)
    if name == "uniform":
        return baselines.uniform(problem, top_k=top_k, seed=opts.seed)
    raise PlacerError(f"unknown solver {name!r}; choose from {', '.join(SOLVERS)}")


def figures(problem: Problem, placement: Placement, selected: np.ndarray, batch: int,
            base_step_s: float) -> dict[str, float]:
    """What a placement costs on sampled steps: hit rate, staged bytes and transfers per
    token, stall per step (ms) and predicted tokens/s."""
    s = step_stats(problem, placement, selected).summary(batch, base_step_s)
    return {"hit_rate": s["hit_rate"], "staged_bytes_per_token": s["staged_bytes_per_token"],
            "transfers_per_token": s["transfers_per_token"],
            "stall_ms_per_step": s["stall_s_per_step"] * 1e3, "tokens_per_s": s["tokens_per_s"]}


def solve_plan(inv: Inventory, spec: HardwareSpec, trace_dirs: list[Path], opts: SolveOptions
               ) -> Plan:
    """Solve a placement for `inv` on `spec` from the traces in `trace_dirs`."""
    if opts.solver in ("ilp", "greedy") and not trace_dirs:
        raise PlacerError(f"--solver {opts.solver} learns from traffic: give --traces DIR "
                          f"(or use --solver layer / uniform)")
    if opts.robust and len(trace_dirs) < 2:
        raise PlacerError("--robust needs at least two --traces sets to be robust across")
    traffic = [load_traffic(d, inv, opts.concurrency, opts.num_steps, opts.seed)
               for d in trace_dirs]
    home = choose_homes(inv, spec, opts.ep, traffic)
    budget, staging = card_budgets(inv, spec, home, opts)
    capacity = budget - staging
    problem = make_problem(inv, spec, home, capacity, traffic, opts)
    robust_info = None
    if opts.robust:
        outcome = robust.solve(robust_scenarios(inv, spec, home, capacity, traffic, opts),
                               time_limit=opts.time_limit, seed=opts.seed)
        result, robust_info = outcome.result, {"ratios": dict(outcome.ratios),
                                               "worst_ratio": max(outcome.ratios.values())}
    else:
        result = run_solver(opts.solver, problem, opts, inv.top_k)
    baseline_results = {name: run_solver(name, problem, opts, inv.top_k)
                        for name in ("layer", "uniform")}
    plan = build_plan(
        inv, spec, home=home, resident_pages=result.placement.resident_pages,
        page_size=opts.page_size, budget_bytes=budget, staging_bytes=staging,
        budget={"mode": "offload" if opts.offload is not None else
                "budget" if opts.budget is not None else "free_vram",
                "value": opts.offload if opts.offload is not None else opts.budget,
                "concurrency": list(opts.concurrency),
                "weights": list(opts.weights) if opts.weights else None},
        ep=opts.ep, solver=solver_json(result, opts))
    plan.robust = robust_info
    plan.calibration = [calibration_json(t) for t in traffic]
    plan.predicted = [
        {"profile": t.name, "concurrency": b,
         **{name: figures(problem, r.placement, t.steps[b], b, spec.base_step_s(b))
            for name, r in (("placement", result), *baseline_results.items())}}
        for t in traffic for b in opts.concurrency]
    return plan


def solver_json(result: SolveResult, opts: SolveOptions) -> dict:
    return {"name": result.solver, "objective": result.objective, "bound": result.bound,
            "gap": result.gap, "seconds": result.seconds, "status": result.status,
            "seed": opts.seed, "time_limit": opts.time_limit, "steps": opts.num_steps,
            "objective_unit": "ratio to layer offload (worst profile and concurrency)"
            if opts.robust
            else "seconds of expected stall per decode step (weighted over concurrency)"}


def calibration_json(t: Traffic) -> dict:
    p = t.profile
    return {"name": t.name, "traces": str(t.path), "tokens": p.tokens, "sequences": p.sequences,
            "per_token": p.per_token, "fingerprint": p.fingerprint,
            "counts": p.counts.tolist()}
