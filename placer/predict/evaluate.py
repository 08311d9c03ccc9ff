"""Replay held-out traffic against a plan before it is deployed.

For each trace set and concurrency B, decode steps are replayed against the plan's placement
with the cost model the solver optimizes (`solvers.cost`), and against the baselines at the
same expert VRAM (placer/plan/capacity.py: the budget less the staging reserve, what the
plan's pins and slots hold): layer offload, uniform (no profile) and the oracle (solved on
this very traffic, all of it: the limit). By default every held-out token is replayed
(`traces.storing.profile.every_token_steps`: at B = 1 each token once, exactly; at B > 1 continuous
batching of B distinct sequences over `groupings` seeded orders); `num_steps` samples that
many steps instead, and imported count matrices, which have no tokens, are always sampled
(with a note). A trace set too large to replay whole (over REPLAY_SELECTIONS) is replayed
on a seeded sample of its whole sequences, and its drift's interval is over them:
`replay_samples` and a note say so.
Every figure carries a 95% bootstrap interval over sequences, paired across the lines of a
row (`solvers.judge.intervals`); the verdict against layer offload is read from the interval
of the stall ratio: better, worse or within noise, or too little traffic where fewer than
MIN_UNITS held-out sequences give no interval (with a note).

Memory: the replay walks the steps in chunks (solvers.judge.replay.CHUNK_CELLS mask cells); the
oracle's problem and the `cache_slots` replay (an LRU walks the steps in order) hold the
whole [S, L, E] mask. Drift is the Jensen-Shannon divergence between the plan's calibration
profile and the traffic, with a 95% bootstrap interval over the traffic's sequences
(`drift_of`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from placer.errors import PlacerError
from placer.plan.capacity import expert_capacity
from placer.plan.estimates import add_step_ranges, estimated_json
from placer.plan.options import DEFAULT_STEPS, EXECUTIONS, check_steps_memory
from placer.plan.placement import Plan, check_cache_slots, plan_policy, plan_quotas
from placer.plan.solve import cards_of, execution_of
from placer.predict.drift import calibration_counts, drift_of
from placer.predict.llamacpp import llamacpp_row
from placer.predict.prefetch import prefetch_section
from placer.progress import ItemsBar
from solvers.cache import even_quotas
from solvers.judge.intervals import MIN_UNITS, REPLICATES, TOO_LITTLE, verdict
from solvers.judge.replay import BELADY, Line, make_steps, replay_with_intervals
from solvers.problem import Placement, Problem, SolveResult, Steps
from solvers.staging import slot_unit
from solvers.static import baselines, ilp
from solvers.static.ilp import Progress, no_progress
from traces.options import check_rules
from traces.storing.dataset import check_compatible, check_shape
from traces.storing.profile import (
    Profile,
    TokenSteps,
    every_token_steps,
    load_profile,
    sampled_token_steps,
)
from traces.storing.sample import replay_sample, sample_note
from traces.storing.stats import dropped_prefill

CACHED_LINES = ("lru", "lfuda", "belady")  # stage execution only
# Selections a trace set's replay holds at most (a seeded sample of whole sequences past it):
# a tenth of solve's MAX_REPLAY_SELECTIONS, for the oracle is solved on every replayed step
# (its [S, L, E] mask and MILP) and the cache lines walk them all: on a DeepSeek-V3-shaped
# trace, 1e8 selections took evaluate past 21 GB and 2.5e7 past 11 GB (both stopped); 1e7 is
# about 21.5k tokens of it (docs/benchmarks.md), 64k of ESFT's DeepSeek-V2-Lite shape.
REPLAY_SELECTIONS = 10_000_000
BEHIND_LRU = "worse than lru"    # a trace verdict: above the plain cache beyond noise


@dataclass(frozen=True)
class EvalOptions:
    concurrency: tuple[int, ...] | None = None  # default: the plan's
    num_steps: int | None = None                # None: replay every held-out token
    seed: int | None = None                     # default: the plan's
    oracle_time_limit: float = 10.0
    cache_slots: int | None = None              # slots per card instead of the plan's
    groupings: int = 4                          # continuous-batching orders at B > 1
    replicates: int = REPLICATES                # bootstrap replicates of every interval
    execution: str | None = None                # stage, cpu or both; default: the plan's


def check_options(opts: EvalOptions, plan: Plan | None = None) -> None:
    """One PlacerError line for the first option out of range (with `plan`: --cache-slots
    beyond its experts, check_cache_slots; --steps beyond memory, check_steps_memory)."""
    check_rules({"concurrency": opts.concurrency, "steps": opts.num_steps, "seed": opts.seed,
                 "oracle_time_limit": opts.oracle_time_limit,
                 "cache_slots": opts.cache_slots}, "evaluate", error=PlacerError)
    if plan is not None:
        check_cache_slots(plan, opts.cache_slots)
        check_steps_memory(opts.num_steps, opts.concurrency or tuple(
            plan.budget.get("concurrency") or (1,)), len(plan.moe_layers),
            plan.experts_per_layer, int(plan.model["top_k"]))
    if opts.execution is not None and opts.execution not in (*EXECUTIONS, "both"):
        raise PlacerError(f"--execution must be one of {', '.join(EXECUTIONS)} or both, got "
                          f"{opts.execution!r}")
    if opts.groupings < 1 or opts.replicates < 1:
        raise PlacerError(f"groupings and replicates must be >= 1, got {opts.groupings} and "
                          f"{opts.replicates}")


def plan_problem(plan: Plan, steps: list[Steps], execution: str | None = None) -> Problem:
    """The plan's problem (sizes, homes, capacities, cards) over the given steps, under
    `execution` (default: the plan's own). The baselines are taken at the plan's expert
    capacity (placer.plan.capacity.expert_capacity) under either execution model."""
    mode = execution or plan.execution
    flops = plan.model.get("expert_flops")
    if mode == "cpu" and flops is None:
        raise PlacerError("this plan records no expert FLOPs (written by an older placer): "
                          "solve it again to predict cpu execution")
    run = execution_of(mode, plan.hardware, plan.model.get("hidden_size"),
                       None if flops is None else np.asarray(flops, dtype=np.float64))
    page_size = plan.page_size if mode == "stage" else None
    if mode == "cpu" and plan.page_size is not None and any(
            0 < e.resident_pages < len(e.pages) for e in plan.experts):
        raise PlacerError("this plan keeps some experts partly resident: cpu execution "
                          "computes whole experts (solve it with --execution cpu)")
    return Problem(plan.matrix("bytes"), plan.matrix("card"), expert_capacity(plan, mode),
                   cards_of(plan.hardware), steps, page_size, **run.fields)


def traffic_problem(plan: Plan, name: str, steps: TokenSteps, base_step_s: float,
                    execution: str | None = None) -> Problem:
    """The plan's problem over all of `steps` (what the oracle is solved on)."""
    return plan_problem(plan, [make_steps(name, steps, plan.experts_per_layer, 1.0,
                                          base_step_s)], execution)


def plan_placement(plan: Plan, execution: str | None = None) -> Placement:
    """The plan's resident pages; under cpu execution (whole experts: plan_problem refuses a
    partly resident one) 1 for a resident expert, 0 for a cold one."""
    pages = plan.matrix("resident_pages")
    if (execution or plan.execution) == "cpu":
        pages = (pages > 0).astype(np.int64)
    return Placement(pages)


def check_traces(plan: Plan, trace_dir: Path) -> None:
    """Refuse traces of another model (fingerprint) or of another shape (imported counts)."""
    if plan.model.get("estimated"):
        check_shape(trace_dir, len(plan.moe_layers), plan.experts_per_layer)
    else:
        check_compatible(trace_dir, plan.model["fingerprint"], plan.moe_layers,
                         plan.experts_per_layer)


def oracle(problem: Problem, time_limit: float, seed: int, progress: Progress = no_progress
           ) -> SolveResult:
    """The best placement for this very traffic: the ILP (greedy-hinted), within a limit."""
    return ilp.solve(problem, time_limit=time_limit, seed=seed, progress=progress)


def replay_steps(trace_dir: Path, profile: Profile, batch: int, num_steps: int | None,
                 seed: int, *, groupings: int = 4, fallback_steps: int = DEFAULT_STEPS,
                 seq_ids: set[int] | None = None) -> tuple[TokenSteps, str | None]:
    """The steps to replay at concurrency `batch`, and a note when they had to be sampled:
    every token (per-token traces, `num_steps` None), else `num_steps` (or, for imported
    counts without it, `fallback_steps`) sampled steps."""
    if profile.per_token and num_steps is None:
        return every_token_steps(trace_dir, batch, groupings=groupings, seed=seed,
                                 seq_ids=seq_ids), None
    if profile.per_token:
        return sampled_token_steps(trace_dir, batch, num_steps, seed, seq_ids=seq_ids), None
    n = num_steps or fallback_steps
    note = (f"{trace_dir}: imported counts have no tokens; {n} steps sampled from their "
            f"frequencies at B={batch}, interval over sampled steps")
    return sampled_token_steps(profile, batch, n, seed), note


def evaluate(plan: Plan, trace_dirs: list[Path], opts: EvalOptions,
             progress: bool = False) -> dict:
    """The evaluation report (the `--json` form): results, drift and verdicts; with
    `progress`, a bar on stderr over the (traffic, concurrency) rows. A row's `oracle_gap` is
    the oracle ILP's relative MIP gap, (objective - bound) / objective (0 when proven optimal),
    a solver figure and not a statistical estimate: it has no interval."""
    check_options(opts, plan)
    if not trace_dirs:
        raise PlacerError("give at least one --traces DIR to evaluate on")
    batches = opts.concurrency or tuple(plan.budget.get("concurrency") or (1,))
    seed = plan.solver.get("seed", 0) if opts.seed is None else opts.seed
    fallback = int(plan.solver.get("steps") or DEFAULT_STEPS)
    calib = calibration_counts(plan)
    results, drift, verdicts, per_layer, notes = [], [], [], [], []
    prefetch, samples = [], []
    for trace_dir in trace_dirs:
        check_traces(plan, trace_dir)
        notes += [n for n in [dropped_prefill(trace_dir)] if n]
    if plan.engine is not None and opts.execution is not None:
        raise PlacerError("--execution: a plan solved with --engine llamacpp runs as llama.cpp "
                          "does (host layers on the CPU or through its cache); leave it out")
    modes = executions(plan, opts.execution)
    with ItemsBar("evaluate", len(trace_dirs) * len(batches) * len(modes), progress) as bar:
        for trace_dir in trace_dirs:
            profile = load_profile(trace_dir)
            name = str(trace_dir)
            sample = (replay_sample(trace_dir, seed, max_selections=REPLAY_SELECTIONS)
                      if profile.per_token and opts.num_steps is None else None)
            kept = None if sample is None else set(sample.seq_ids)
            if sample is not None:
                samples.append({"traces": name, **sample.json()})
                notes.append(sample_note(name, sample.json()))
            rows = []
            for b in batches:
                steps, note = replay_steps(trace_dir, profile, b, opts.num_steps, seed,
                                           groupings=opts.groupings, fallback_steps=fallback,
                                           seq_ids=kept)
                notes += [note] if note else []
                for mode in modes:
                    item = f"{trace_dir.name} B={b} {mode}"
                    bar.show(item)
                    row, staged = (
                        (llamacpp_row(plan, name, steps, seed, opts.replicates), {})
                        if plan.engine is not None else
                        evaluate_row(
                            plan, name, steps, plan_placement(plan, mode), opts, seed, mode,
                            lambda stage, item=item: bar.show(f"{item}: oracle ILP, {stage}")))
                    rows.append(row)
                    notes += [too_little_note(row)] if row["verdict"] == TOO_LITTLE else []
                    per_layer.append({"traces": name, "concurrency": b, "execution": mode,
                                      "staged_bytes_per_token": staged})
                    bar.advance()
            results += rows
            if calib is not None:
                entry, note = drift_of(calib, trace_dir, profile, opts.replicates, seed,
                                       kept)
                drift.append(entry)
                notes += [note] if note else []
            verdicts.append(trace_verdict(name, rows))
            section, note = prefetch_section(plan, trace_dir, opts.cache_slots)
            prefetch += [section] if section else []
            notes += [note] if note else []
    add_step_ranges(results, plan.hardware)
    return {"plan_fingerprint": plan.model["fingerprint"],
            "estimated": estimated_json(plan.hardware),
            "replay": ("every held-out token" if not samples else
                       "every held-out token of a seeded sample of whole sequences")
            if opts.num_steps is None else f"{opts.num_steps} sampled decode steps",
            "replay_samples": samples,
            "steps": opts.num_steps, "groupings": opts.groupings, "seed": seed,
            "replicates": opts.replicates, "notes": notes, "results": results, "drift": drift,
            "verdicts": verdicts, "per_layer": per_layer, "prefetch": prefetch}


def executions(plan: Plan, asked: str | None) -> tuple[str, ...]:
    """The execution models to replay: the plan's own, the one asked, or both."""
    if asked is None:
        return (plan.execution,)
    return EXECUTIONS if asked == "both" else (asked,)


def evaluate_row(plan: Plan, name: str, steps: TokenSteps, placement: Placement,
                 opts: EvalOptions, seed: int, execution: str,
                 progress: Progress = no_progress) -> tuple[dict, dict[str, list[float]]]:
    """One (traffic, B, execution) row with intervals, and each line's staged bytes (cpu
    execution: bytes the host computes) per token by layer; the oracle's ILP tells
    `progress` its stages."""
    batch = steps.batch
    base = plan.hardware.base_step_s(batch)
    best = oracle(traffic_problem(plan, name, steps, base, execution), opts.oracle_time_limit,
                  seed, progress)
    problem = plan_problem(plan, [], execution)
    lines: dict[str, Line] = {
        "placement": Line(placement),
        "layer": Line(baselines.layer_offload(problem).placement),
        "uniform": Line(baselines.uniform(problem, top_k=int(plan.model["top_k"]),
                                          seed=seed).placement),
        "oracle": Line(best.placement)}
    if execution == "stage":
        lines.update(cache_lines(plan, problem, placement, opts.cache_slots))
    replayed = replay_with_intervals(problem, lines, steps, base, opts.replicates, seed)
    units = replayed.units
    row: dict = {"traces": name, "concurrency": batch, "execution": execution,
                 "steps": len(steps), "tokens": int(units.tokens().sum()),
                 "interval_units": units.count, "interval_over": units.over,
                 "cache": {k: {"policy": v.cache, "slots": v.slots,
                               "pooled": bool((v.options or {}).get("pooled", False))}
                           for k, v in lines.items() if v.cache is not None},
                 **replayed.figures, "oracle_gap": best.gap,
                 **replayed.ratio("ratio_to_layer", "layer"),
                 **replayed.ratio("ratio_to_oracle", "oracle")}
    for other in CACHED_LINES:
        if other in lines:
            row.update(replayed.ratio(f"ratio_to_{other}", other))
    row["verdict"] = verdict(row["ratio_to_layer_ci95"])
    if "lru" in lines:  # the bar a plan must clear beside layer offload
        better = min(("lru", "lfuda", "oracle"),
                     key=lambda k: replayed.figures[k]["stall_ms_per_step"])
        row.update({"better_baseline": better,
                    **replayed.ratio("ratio_to_better_baseline", better),
                    "cache_verdict": verdict(row["ratio_to_lru_ci95"])})
    scale = 1.0 / (len(steps) * batch)
    return row, {line: (replayed.staged[line] * scale).tolist() for line in lines}


def plan_line(plan: Plan, placement: Placement, cache_slots: int | None = None) -> Line:
    """The plan as deployed: `placement` and, where the plan has cache slots (or
    `cache_slots` on every card), its caches as its cards run them (`plan_policy`: the
    policy, pooled, a fitted policy's parameters). Every replay of a plan's own line
    (evaluate, bench's prediction) is this one."""
    quotas = plan_quotas(plan, cache_slots)
    if not quotas.any():
        return Line(placement)
    policy = plan_policy(plan)
    return Line(placement, policy.name, quotas, policy.options)


def cache_lines(plan: Plan, problem: Problem, placement: Placement, cache_slots: int | None
                ) -> dict[str, Line]:
    """The plan as deployed (`plan_line`: its pinned pages and cache slots per layer, or
    `cache_slots` on every card, under its own policy and cache_params), the plan's expert
    capacity (what its pins and slots hold, expert_capacity) as per-layer LRU caches with
    nothing pinned (what an engine's expert cache does with the same
    VRAM: llama.cpp PR #27861, vLLM PR #37190), and the same as per-layer LFUDA caches (BigRig
    0.9.1's engine cache), and Belady's MIN with the plan's slots and pinned set (the limit of
    any policy for that split, solvers/cache/belady.py)."""
    quotas = plan_quotas(plan, cache_slots)
    unit = slot_unit(problem.expert_bytes, problem.home, problem.num_cards)
    whole = expert_capacity(plan) // np.maximum(unit, 1)
    bare = Placement(np.zeros_like(placement.resident_pages))
    out = {"lru": Line(bare, "lru", even_quotas(whole, problem.num_layers)),
           "lfuda": Line(bare, "lfuda", even_quotas(whole, problem.num_layers)),
           "belady": Line(placement, BELADY, quotas)}
    if quotas.any():
        out["placement"] = plan_line(plan, placement, cache_slots)
    return out


def too_little_note(row: dict) -> str:
    """Why a row has no interval and no verdict."""
    return (f"{row['traces']} B={row['concurrency']}: {row['interval_units']} held-out "
            f"{row['interval_over']}, fewer than {MIN_UNITS}: no interval can be estimated "
            f"(every _ci95 is null) and the verdict is {TOO_LITTLE}")


def trace_verdict(name: str, rows: list[dict]) -> dict:
    """One traffic set over all its concurrencies: worse if any row's stall ratio to layer
    offload is worse beyond noise, too little traffic if any row has too few sequences for an
    interval, better if every row's is better, else within noise; and worse than lru where a
    row's stall is above the plain cache's (lru) beyond its interval, even when better than
    layer offload. `ok` (for scripts) is "not worse, as far as the traffic tells": false for
    worse, worse than lru and too little traffic."""
    worst = max(r["ratio_to_layer"] for r in rows)
    out = {"traces": name, "worst_ratio_to_layer": worst}
    worse = [r for r in rows if r["verdict"] == "worse"]
    if worse:
        r = max(worse, key=lambda r: r["ratio_to_layer"])
        return {**out, "verdict": "worse", "ok": False,
                "message": f"WARNING: {name}: this placement is predicted WORSE than layer "
                           f"offload on this traffic (stall {r['ratio_to_layer']:.3f}x layer "
                           f"offload's at B={r['concurrency']} with {r['execution']} execution, "
                           f"95% interval {_span(r['ratio_to_layer_ci95'])})"}
    behind = [r for r in rows if r.get("cache_verdict") == "worse"]
    if behind:
        r = max(behind, key=lambda r: r["ratio_to_lru"])
        return {**out, "verdict": BEHIND_LRU, "ok": False,
                "message": f"WARNING: {name}: this placement is predicted WORSE than a plain "
                           f"cache (the same VRAM as per-layer LRU slots, nothing pinned) on "
                           f"this traffic (stall {r['ratio_to_lru']:.3f}x lru's at "
                           f"B={r['concurrency']}, 95% interval {_span(r['ratio_to_lru_ci95'])})"
                           f": solve it with --cache auto on traffic like this one"}
    few = [r for r in rows if r["verdict"] == TOO_LITTLE]
    if few:
        return {**out, "verdict": TOO_LITTLE, "ok": False,
                "message": f"{TOO_LITTLE}: {name}: {few[0]['interval_units']} held-out "
                           f"{few[0]['interval_over']} at B={few[0]['concurrency']}, fewer than "
                           f"{MIN_UNITS}: neither better nor worse than layer offload can be "
                           f"told (stall {few[0]['ratio_to_layer']:.3f}x layer offload's, "
                           "no interval)"}
    if all(r["verdict"] == "better" for r in rows):
        return {**out, "verdict": "better", "ok": True,
                "message": f"better: {name}: better than layer offload at every concurrency "
                           f"(stall at most {worst:.3f}x layer offload's, every 95% interval "
                           f"below 1)"}
    r = next(r for r in rows if r["verdict"] == "within noise")
    return {**out, "verdict": "within noise", "ok": True,
            "message": f"within noise: {name}: not told apart from layer offload at "
                       f"B={r['concurrency']} with {r['execution']} execution (stall "
                       f"{r['ratio_to_layer']:.3f}x layer offload's, 95% interval "
                       f"{_span(r['ratio_to_layer_ci95'])} holds 1)"}


def _span(ci: list[float]) -> str:
    return f"[{ci[0]:.3f}, {ci[1]:.3f}]"
