"""From an inventory, a hardware spec, traces and a budget to a solved placement plan.

This module is the bridge between the byte-level world (inventory, hardware, plan) and the
array world of `solvers/`: it turns them into a `solvers.Problem`, runs the chosen solver
and the baselines at the same budget, and writes the predictions into the plan.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from placer.checkpoint.flops import expert_flops
from placer.checkpoint.inventory import Inventory
from placer.errors import PlacerError
from placer.hardware.spec import HardwareSpec
from placer.plan.cache import (
    Split,
    cache_params,
    check_cache_options,
    no_cache_reason,
    solve_cache,
)
from placer.plan.options import SOLVERS, SolveOptions, check_options, check_steps_memory
from placer.plan.placement import Plan, build_plan, plan_policy
from placer.plan.prefetch import off, solve_prefetch
from placer.plan.traffic import Traffic, load_traffic
from placer.units import format_bytes
from solvers import homes
from solvers.cost import replay
from solvers.cpu import ExpertCurve, Host
from solvers.judge.replay import Line, Replayed, make_steps, replay_with_intervals
from solvers.problem import Cards, Placement, Problem, SolveResult, Steps
from solvers.staging import slot_unit, staging_bytes
from solvers.static import baselines, greedy, ilp, robust
from solvers.static.ilp import Progress, no_progress
from traces.storing.profile import TokenSteps


def host_of(spec: HardwareSpec, hidden_size: int) -> Host | None:
    """The spec's host CPU as the solver's cpu execution model needs it (None without a
    [host] table): activations are hidden_size bf16 values per token each way, over the
    slowest card's host link; its measured experts as curves; its offload_min_batch."""
    if spec.host is None:
        return None
    return Host(memory_bandwidth=spec.host.memory_bandwidth, flops=spec.host.flops,
                sync_s=spec.host.sync_s, activation_bytes=2.0 * hidden_size,
                h2d_bandwidth=min(c.h2d_bandwidth for c in spec.cards),
                curves=tuple(ExpertCurve(t.expert_bytes, t.tokens, t.seconds)
                             for t in spec.host.expert),
                offload_min_batch=spec.host.offload_min_batch)


@dataclass(frozen=True)
class Execution:
    """How cold experts run, with what the cpu model needs (placer.plan.placement records it)."""

    mode: str
    host: Host | None
    expert_flops: np.ndarray | None

    @property
    def fields(self) -> dict:
        """The solvers.Problem fields of this execution."""
        return {"execution": self.mode, "host": self.host, "expert_flops": self.expert_flops}


def execution_of(mode: str, spec: HardwareSpec, hidden_size: int | None,
                 flops: np.ndarray) -> Execution:
    """Check `mode` (stage or cpu, as check_options and the plan check ensure) against the spec
    and model: cpu execution needs a [host] table."""
    if mode == "stage":
        return Execution(mode, None, None)
    if spec.host is None:
        raise PlacerError(f"hardware spec {spec.name!r} has no [host] table: --execution cpu "
                          "needs the host CPU's memory_bandwidth, flops and sync_us (placer "
                          "probe --host measures them)")
    if not hidden_size:
        raise PlacerError("--execution cpu needs the model's hidden_size (config.json)")
    return Execution(mode, host_of(spec, hidden_size), flops)


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
    """[L, E] expert-parallel home card of each expert, by `ep` (one of EPS: check_options)."""
    num_cards = len(spec.cards)
    layers, experts = len(inv.moe_layers), inv.experts_per_layer
    if ep == "contiguous":
        return homes.contiguous_homes(layers, experts, num_cards)
    load = sum((t.profile.frequency() for t in traffic if t.profile is not None),
               np.zeros((layers, experts)))
    return homes.balanced_homes(load, inv.expert_bytes(), num_cards)


def card_budgets(inv: Inventory, spec: HardwareSpec, home: np.ndarray, opts: SolveOptions,
                 execution: str = "stage") -> tuple[np.ndarray, np.ndarray]:
    """([C] budget bytes, [C] staging bytes) per card, or a PlacerError when infeasible.

    The staging bytes are the reserve for one fetch at the largest --concurrency
    (solvers/staging.py); budget - staging is the card's expert capacity, what the plan's
    pinned pages and cache slots hold together and what every baseline is judged at
    (placer/plan/capacity.py). --offload X gives a capacity of (1 - X) x the card's homed
    expert bytes (floored), the reserve on top; --budget and the free VRAM include it.
    Cold experts computed by the CPU are never staged: no reserve then."""
    sizes = inv.expert_bytes()
    num_cards = len(spec.cards)
    staging = (staging_bytes(sizes, home, num_cards, max(opts.concurrency), inv.top_k)
               if execution == "stage" else np.zeros(num_cards, dtype=np.int64))
    homed = homed_bytes(inv, home, num_cards)
    free = np.array([c.free_bytes for c in spec.cards], dtype=np.int64)
    if opts.offload is not None:  # in (0, 1): check_options
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
    return budget, staging


def homed_bytes(inv: Inventory, home: np.ndarray, num_cards: int) -> np.ndarray:
    """[C] expert bytes homed on each card."""
    return np.bincount(home.ravel(), weights=inv.expert_bytes().ravel(),
                       minlength=num_cards).astype(np.int64)


def fits_whole(inv: Inventory, home: np.ndarray, capacity: np.ndarray, num_cards: int
               ) -> bool:
    """Whether every card's capacity (budget less staging) holds all the experts it homes:
    then nothing need stay on the host."""
    return bool(np.all(capacity >= homed_bytes(inv, home, num_cards)))


def check_placement(inv: Inventory, spec: HardwareSpec, opts: SolveOptions, traces: int
                    ) -> Execution:
    """Every refusal of solve_plan that needs no traffic (placer.plan.engine.check_solve), for
    `traces` trace sets; the execution the options and spec give. The budget is checked
    against the cards where the homes do not depend on traffic (--ep contiguous)."""
    check_options(opts)
    check_steps_memory(opts.num_steps, opts.concurrency, len(inv.moe_layers),
                       inv.experts_per_layer, inv.top_k, traces * len(opts.concurrency))
    if opts.solver in ("ilp", "greedy") and not traces:
        raise PlacerError(f"--solver {opts.solver} learns from traffic: give --traces DIR "
                          f"(or use --solver layer / uniform)")
    execution = execution_of(opts.execution, spec, inv.config.get("hidden_size"),
                             expert_flops(inv))
    if execution.mode == "cpu" and opts.page_size is not None:
        raise PlacerError("--execution cpu computes whole experts on the host: --page-size "
                          "is for staging")
    if opts.ep == "contiguous":
        home = homes.contiguous_homes(len(inv.moe_layers), inv.experts_per_layer,
                                      len(spec.cards))
        card_budgets(inv, spec, home, opts, execution.mode)
    return execution


def resident_plan(inv: Inventory, spec: HardwareSpec, home: np.ndarray, budget: np.ndarray,
                  traffic: list[Traffic], opts: SolveOptions, execution: Execution) -> Plan:
    """The plan where every card's budget holds all its experts: each one resident, no
    staging buffer and no cache, every line of the prediction stall-free."""
    cards = len(spec.cards)
    staging = np.zeros(cards, dtype=np.int64)
    bare = Problem(inv.expert_bytes(), home, budget, cards_of(spec), [], opts.page_size,
                   **execution.fields)
    result = baselines.layer_offload(bare)  # at this capacity: no layer offloaded
    solver = {"name": "resident", "objective": 0.0, "bound": 0.0, "gap": 0.0,
              "seconds": result.seconds, "status": "everything fits", "seed": opts.seed,
              "time_limit": None, "steps": opts.num_steps,
              "objective_unit": "seconds of expected stall per decode step (none: every "
                                "expert resident)"}
    plan = build_plan(inv, spec, home=home, resident_pages=result.placement.resident_pages,
                      page_size=opts.page_size, budget_bytes=budget, staging_bytes=staging,
                      budget=_budget_json(opts), ep=opts.ep, solver=solver,
                      execution=execution.mode)
    plan.cache = {"mode": "off", "reason": "every expert fits the cards' budgets: nothing is "
                                           "staged, so no cache"}
    plan.prefetch = off("every expert fits the cards' budgets: nothing is staged")
    plan.calibration = [calibration_json(t) for t in traffic]
    lines = {"placement": Line(result.placement), "layer": Line(result.placement),
             "uniform": Line(result.placement)}
    plan.predicted = [predicted_row(t, b, t.steps[b], replay_with_intervals(
        bare, lines, t.steps[b], spec.base_step_s(b), seed=opts.seed))
        for t in traffic for b in opts.concurrency]
    return plan


def predicted_row(t: Traffic, b: int, steps: TokenSteps, replayed: Replayed) -> dict:
    """One row of a plan's prediction on calibration traffic: its figures and its ratio to
    layer offload, and where only a prefix of the steps was replayed, how many."""
    return {"profile": t.name, "concurrency": b, **replayed.figures,
            **replayed.ratio("ratio_to_layer", "layer"),
            **({"judged_steps": [len(steps), len(t.steps[b])]}
               if steps is not t.steps[b] else {})}


def make_problem(inv: Inventory, spec: HardwareSpec, home: np.ndarray, capacity: np.ndarray,
                 traffic: list[Traffic], opts: SolveOptions, execution: Execution) -> Problem:
    """The solver's problem over the given traffic (steps weighted per concurrency)."""
    weights = opts.weights or tuple(1.0 / len(opts.concurrency) for _ in opts.concurrency)
    if len(weights) != len(opts.concurrency):
        raise PlacerError("--weights needs one weight per --concurrency value")
    steps = [make_steps(t.name, t.steps[b], inv.experts_per_layer, w / len(traffic),
                        spec.base_step_s(b))
             for t in traffic for b, w in zip(opts.concurrency, weights, strict=True)]
    return Problem(inv.expert_bytes(), home, capacity, cards_of(spec), steps, opts.page_size,
                   **execution.fields)


def robust_scenarios(inv: Inventory, spec: HardwareSpec, home: np.ndarray,
                     capacity: np.ndarray, traffic: list[Traffic], opts: SolveOptions,
                     execution: Execution) -> list[Problem]:
    """One problem per (profile, concurrency), named "PROFILE B=b": robust mode bounds the
    ratio to layer offload at every concurrency, as `placer evaluate` judges it, not only
    their weighted mix."""
    return [Problem(inv.expert_bytes(), home, capacity, cards_of(spec),
                    [make_steps(f"{t.name} B={b}", t.steps[b], inv.experts_per_layer, 1.0,
                                spec.base_step_s(b))], opts.page_size, **execution.fields)
            for t in traffic for b in opts.concurrency]


def run_solver(name: str, problem: Problem, opts: SolveOptions, top_k: int,
               progress: Progress = no_progress) -> SolveResult:
    """Solve `problem` with solver `name` (ilp, greedy, layer, uniform); the ILP tells
    `progress` its stages."""
    if name == "greedy":
        return greedy.solve(problem, seed=opts.seed)
    if name == "ilp":
        return ilp.solve(problem, time_limit=opts.time_limit, seed=opts.seed,
                         progress=progress)
    if name == "layer":
        return baselines.layer_offload(problem)
    if name == "uniform":
        return baselines.uniform(problem, top_k=top_k, seed=opts.seed)
    raise PlacerError(f"unknown solver {name!r}; choose from {', '.join(SOLVERS)}")


def figures(problem: Problem, placement: Placement, steps: Steps) -> dict[str, float]:
    """What a placement costs on the given steps: hit rate, staged bytes and transfers per
    token (cpu execution: bytes and experts the host computes), stall per step (ms) and
    predicted tokens/s."""
    s = replay(problem, placement, steps).summary(steps.batch, steps.base_step_s)
    return {"hit_rate": s["hit_rate"], "staged_bytes_per_token": s["staged_bytes_per_token"],
            "transfers_per_token": s["transfers_per_token"],
            "stall_ms_per_step": s["stall_s_per_step"] * 1e3, "tokens_per_s": s["tokens_per_s"]}


def solve_plan(inv: Inventory, spec: HardwareSpec, trace_dirs: list[Path], opts: SolveOptions,
               progress: Progress = no_progress) -> Plan:
    """Solve a placement for `inv` on `spec` from the traces in `trace_dirs`: pinned experts
    and per-layer cache slots together (`opts.cache`: None picks the best candidate of the
    split, static by `opts.solver` among them; N slots per card; 0 none), or with no cache,
    the static placement of `opts.solver`. `progress(stage)` is told each stage as it starts
    (the split's replays and the solvers' own stages included)."""
    execution = check_placement(inv, spec, opts, len(trace_dirs))
    progress("reading traces")
    traffic = [load_traffic(d, inv, opts.concurrency, opts.num_steps, opts.seed)
               for d in trace_dirs]
    home = choose_homes(inv, spec, opts.ep, traffic)
    budget, staging = card_budgets(inv, spec, home, opts, execution.mode)
    if fits_whole(inv, home, budget - staging, len(spec.cards)):
        return resident_plan(inv, spec, home, budget, traffic, opts, execution)
    reason = no_cache_reason(inv, opts, home, traffic)
    check_cache_options(opts, reason)
    if (opts.robust and len(trace_dirs) * len(set(opts.concurrency)) < 2
            and (reason is not None or opts.cache == 0)):
        raise PlacerError("--robust without a cache split needs at least two scenarios to be "
                          "robust across: two --traces sets, or one at several --concurrency "
                          "values (e.g. 1,8)")
    bare = Problem(inv.expert_bytes(), home, budget - staging, cards_of(spec), [],
                   opts.page_size, **execution.fields)
    prefetch = off("the plan stages no experts into cache slots")
    if reason is None and opts.cache != 0:
        split, info = solve_cache(inv, spec, home, budget, traffic, opts, progress)
        progress("prefetch: replaying the split's candidates")
        split, prefetch = solve_prefetch(inv, spec, home, traffic, split, info, opts)
        if split.kind == "static":  # the split's best candidate: placed by --solver
            thinned, note = thin(traffic, STATIC_STEPS)
            info["notes"] += [note] if note else []
            plan, lines = _static_plan(inv, spec, home, budget, staging, traffic, opts,
                                       make_problem(inv, spec, home, budget - staging, thinned,
                                                    opts, execution), execution, progress)
        else:
            plan, lines = _cached_plan(inv, spec, home, budget, split, info, opts)
        plan.solver["note"] = split_note(opts, split.kind == "static")
        plan.cache = info
    else:
        plan, lines = _static_plan(inv, spec, home, budget, staging, traffic, opts,
                                   make_problem(inv, spec, home, budget - staging, traffic,
                                                opts, execution), execution, progress)
        plan.cache = {"mode": "off", "reason": reason if opts.cache != 0 else "--cache 0"}
    plan.prefetch = prefetch
    plan.calibration = [calibration_json(t) for t in traffic]
    baselines_at = {name: run_solver(name, bare, opts, inv.top_k).placement
                    for name in ("layer", "uniform")}
    plan.predicted = []
    progress("predicting on the calibration traffic")
    rows = [(t, b, first_steps(t.steps[b], PREDICT_KEYS)) for t in traffic
            for b in opts.concurrency]

    def predict(row: tuple[Traffic, int, TokenSteps]) -> Replayed:
        t, b, steps = row
        return replay_with_intervals(bare, {**lines, **baselines_at}, steps,
                                     spec.base_step_s(b), seed=opts.seed)

    # one row per core: the compiled token shares and most of numpy release the GIL
    with ThreadPoolExecutor(max(1, min(len(rows), os.cpu_count() or 1))) as pool:
        for (t, b, steps), replayed in zip(rows, pool.map(predict, rows), strict=True):
            plan.predicted.append(predicted_row(t, b, steps, replayed))
    if opts.robust and plan.robust is None:  # a cached split: its ratios as predicted
        ratios = {f"{r['profile']} B={r['concurrency']}": r["ratio_to_layer"]
                  for r in plan.predicted}
        plan.robust = {"ratios": ratios, "worst_ratio": max(ratios.values())}
    return plan


def first_steps(steps: TokenSteps, most: float) -> TokenSteps:
    """`steps`, or where its selections number over `most`, its first steps holding about
    `most` of them: the prediction on calibration traffic is in sample, so a prefix of it
    serves as well as the whole (its intervals are over the sequences it holds) and bounds
    the seconds a learned pooled cache's walk takes on a large trace."""
    selections = int(np.count_nonzero(steps.tokens >= 0))
    if selections <= most:
        return steps
    keep = max(1, int(len(steps) * most / selections))
    return TokenSteps(steps.tokens[:keep], steps.seqs[:keep])


def thin(traffic: list[Traffic], most: int) -> tuple[list[Traffic], str | None]:
    """Each traffic's steps cut to at most `most` evenly spaced ones (the static candidate's
    solver holds an [S, L, E] mask of them), and a note where any was cut."""
    out, cut = [], []
    for t in traffic:
        steps = {}
        for b, s in t.steps.items():
            every = -(-len(s) // most)
            steps[b] = TokenSteps(s.tokens[::every], s.seqs[::every]) if every > 1 else s
            if every > 1:
                cut.append(f"{t.name} B={b}: {len(steps[b])} of {len(s)}")
        out.append(Traffic(t.name, t.path, t.profile, steps, t.sample))
    note = (f"the static placement was solved by the --solver on evenly spaced steps of the "
            f"calibration traffic ({'; '.join(cut)})") if cut else None
    return out, note


def split_note(opts: SolveOptions, static: bool) -> str:
    """What --solver and --time-limit did where the cache split ran: a split with cache slots
    is chosen by replays on held-out folds, which neither names nor bounds; a static
    candidate is placed by the solver, whose time limit bounds it alone. (No seconds: the
    plan is the same file for the same inputs; the solver line prints them.)"""
    split = "the cache split's replays (not time-limited)"
    if not static:
        return (f"--solver {opts.solver} and --time-limit {opts.time_limit:g} did not apply: "
                f"{split} chose pins and cache slots; --cache 0 asks for a static placement by "
                "--solver")
    solver = "--robust's MILP" if opts.robust else f"--solver {opts.solver}"
    if not opts.robust and opts.solver != "ilp":
        return (f"{split} chose a static placement, placed by {solver}; --time-limit does not "
                "apply to it")
    return (f"{split} chose a static placement, placed by {solver}; --time-limit "
            f"{opts.time_limit:g} bounded that solver, not the replays")


def _budget_json(opts: SolveOptions) -> dict:
    return {"mode": "offload" if opts.offload is not None else
            "budget" if opts.budget is not None else "free_vram",
            "value": opts.offload if opts.offload is not None else opts.budget,
            "concurrency": list(opts.concurrency),
            "weights": list(opts.weights) if opts.weights else None}


def _static_plan(inv: Inventory, spec: HardwareSpec, home: np.ndarray, budget: np.ndarray,
                 staging: np.ndarray, traffic: list[Traffic], opts: SolveOptions,
                 problem: Problem, execution: Execution, progress: Progress
                 ) -> tuple[Plan, dict[str, Line]]:
    """The static placement of `opts.solver` (or `--robust`), with no cache."""
    robust_info = None
    if opts.robust:
        outcome = robust.solve(robust_scenarios(inv, spec, home, budget - staging, traffic,
                                                opts, execution),
                               time_limit=opts.time_limit, seed=opts.seed, progress=progress)
        result, robust_info = outcome.result, {"ratios": dict(outcome.ratios),
                                               "worst_ratio": max(outcome.ratios.values())}
    else:
        progress(f"solver {opts.solver}")
        result = run_solver(opts.solver, problem, opts, inv.top_k, progress)
    plan = build_plan(inv, spec, home=home, resident_pages=result.placement.resident_pages,
                      page_size=opts.page_size, budget_bytes=budget, staging_bytes=staging,
                      budget=_budget_json(opts), ep=opts.ep, solver=solver_json(result, opts),
                      execution=execution.mode)
    plan.robust = robust_info
    return plan, {"placement": Line(result.placement)}


def _cached_plan(inv: Inventory, spec: HardwareSpec, home: np.ndarray, budget: np.ndarray,
                 split: Split, info: dict, opts: SolveOptions) -> tuple[Plan, dict[str, Line]]:
    """Pinned experts and per-layer cache slots, split by `placer.plan.cache`."""
    unit = slot_unit(inv.expert_bytes(), home, len(spec.cards))
    pins = split.pinned.astype(np.int64)
    solver = {"name": "split", "objective": split.objective, "bound": None, "gap": None,
              "seconds": info["seconds"], "status": "cross-validated" if info["folds"]
              else "in sample", "seed": opts.seed, "time_limit": None, "steps": None,
              "objective_unit": SPLIT_REGRET if opts.robust else SPLIT_STALL}
    plan = build_plan(inv, spec, home=home, resident_pages=pins, page_size=None,
                      budget_bytes=budget, staging_bytes=split.staging * unit,
                      budget=_budget_json(opts), ep=opts.ep, solver=solver, execution="stage",
                      quotas=split.quotas, cache_policy=info["policy"],
                      cache_params=cache_params(split))
    policy = plan_policy(plan)  # as evaluate and bench replay it
    return plan, {"placement": Line(Placement(pins), policy.name, split.quotas,
                                    policy.options)}


SPLIT_STALL = ("seconds of stall per decode step on held-out folds of the calibration "
               "sequences (weighted over profiles and concurrency)")
SPLIT_REGRET = ("ratio: the mean over profiles and concurrencies of the held-out stall over "
                "that traffic's plain-cache stall (1 = the plain cache)")
STATIC_STEPS = 4096  # steps per traffic and concurrency the static candidate is solved on
PREDICT_KEYS = 2.5e7  # selections each row of the calibration prediction replays at most


def solver_json(result: SolveResult, opts: SolveOptions) -> dict:
    return {"name": result.solver, "objective": result.objective, "bound": result.bound,
            "gap": result.gap, "seconds": result.seconds, "status": result.status,
            "seed": opts.seed, "time_limit": opts.time_limit, "steps": opts.num_steps,
            "objective_unit": "mean over profiles and concurrencies of stall / that profile's "
                              "own best (greedy) stall, each no worse than layer offload"
            if opts.robust
            else "seconds of expected stall per decode step (weighted over concurrency)"}


def calibration_json(t: Traffic) -> dict:
    p = t.profile
    return {"name": t.name, "traces": str(t.path), "tokens": p.tokens, "sequences": p.sequences,
            "per_token": p.per_token, "fingerprint": p.fingerprint,
            "counts": p.counts.tolist(),
            "replay_sample": None if t.sample is None else t.sample.json()}
