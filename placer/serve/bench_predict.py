"""What `placer evaluate`'s cost model predicts for the decode steps a bench served, and the
intervals beside the measured figures.

The steps are the bench's own (the experts each token of each full decode step was routed
to), replayed against the placement the arm ran, through `placer evaluate`'s own replay
(`solvers.judge.replay.replay_lines`: what the runtime stages for them, through the cache policy
it runs when it has cache slots; the stall that costs, per layer the slowest card or shared
link), and tokens/s = C / (base step + stall) with the plan's hardware spec's base step at
C. The interval is evaluate's paired bootstrap with the
prompts as units (the same prompts in every arm, so an arm's ratio to the first is paired).
"""

from __future__ import annotations

import numpy as np
from scipy import stats

from placer.plan.estimates import step_range_field
from placer.plan.placement import Plan
from placer.predict.evaluate import cache_lines, plan_line, plan_placement, plan_problem
from solvers.judge.intervals import (
    REPLICATES,
    Estimate,
    Units,
    estimable,
    line_figures,
    replicate_weights,
    units_of,
    verdict,
)
from solvers.judge.replay import replay_lines
from traces.storing.profile import TokenSteps


def prompt_units(seqs: np.ndarray, num_prompts: int) -> Units:
    """Each prompt a unit (the same numbering in every arm); each step where a step's
    prompts are unknown."""
    if (seqs < 0).any():
        return units_of(np.full_like(seqs, -1))
    return Units(seqs, num_prompts, "prompts")


def predict_arm(plan: Plan, steps: TokenSteps, num_prompts: int, cache_slots: int | None,
                seed: int = 0, replicates: int = REPLICATES) -> dict:
    """The predicted figures of `steps` under `plan` (see module docstring); `estimate` is
    the tokens/s point and bootstrap replicates, for paired ratios."""
    batch = steps.batch
    problem = plan_problem(plan, [], "stage")
    line = plan_line(plan, plan_placement(plan, "stage"), cache_slots)
    units = prompt_units(steps.seqs, num_prompts)
    lru = cache_lines(plan, problem, line.placement, cache_slots)["lru"]
    sums, _ = replay_lines(problem, {"arm": line, "lru": lru}, steps, units)
    base = plan.hardware.base_step_s(batch)
    weights = replicate_weights(units.count, replicates, seed)
    figures, stall_estimate = line_figures(sums["arm"], units.tokens(), weights, batch, base)
    _, lru_stall = line_figures(sums["lru"], units.tokens(), weights, batch, base)
    to_lru = stall_estimate.ratio_to(lru_stall)
    return {"tokens_per_s": figures["tokens_per_s"],
            "tokens_per_s_ci95": figures["tokens_per_s_ci95"],
            "stall_ms_per_step": figures["stall_ms_per_step"],
            "stall_ms_per_step_ci95": figures["stall_ms_per_step_ci95"],
            "staged_bytes_per_token": figures["staged_bytes_per_token"],
            "staged_bytes_per_token_ci95": figures["staged_bytes_per_token_ci95"],
            "stall_ratio_to_lru": to_lru.point,
            "stall_ratio_to_lru_ci95": to_lru.ci95() if estimable(units) else None,
            "base_step_ms": base * 1e3, "interval_over": units.over,
            **step_range_field(plan.hardware, batch, figures["stall_ms_per_step"]),
            "estimate": Estimate(batch / (base + stall_estimate.point),
                                 batch / (base + stall_estimate.replicates))}


MIN_TRIALS = 3  # fewer trials give no interval worth printing: a note says so


def t_interval(values: list[float]) -> tuple[float, list[float] | None]:
    """The geometric mean of positive `values` (rates, times, ratios) and its 95% Student's t
    interval, taken on their logarithms and mapped back: for a rate, the interval of the log
    time per unit, inverted. Both ends stay positive however few and scattered the values are
    (two trials of 249 tok/s on average no longer give [-1015, 1514]). Null with fewer than
    MIN_TRIALS values: one degree of freedom is no interval (t = 12.7)."""
    logs = np.log(np.asarray(values, dtype=np.float64))
    mean = float(np.exp(logs.mean()))
    if len(values) < MIN_TRIALS:
        return mean, None
    half = float(stats.t.ppf(0.975, len(values) - 1) * stats.sem(logs))
    return mean, [float(np.exp(logs.mean() - half)), float(np.exp(logs.mean() + half))]


def cache_verdicts(rows: list[dict]) -> list[dict]:
    """Each arm against the plain cache (the same VRAM as per-layer LRU slots, nothing
    pinned): predicted, its stall ratio on the bench's own steps; measured, its tokens/s
    over a plain-cache arm's at the same concurrency where the bench has one (trial by
    trial, Student's t). `ok` false and a WARNING where either is behind beyond its
    interval."""
    out = []
    for row in rows:
        predicted = verdict(row["predicted_stall_ratio_to_lru_ci95"])
        plain = [r for r in rows if r["plain_cache"] and r is not row
                 and r["concurrency"] == row["concurrency"]]
        measured = None
        if plain:
            ratios = [a / b for a, b in zip(row["measured_tokens_per_s_trials"],
                                            plain[0]["measured_tokens_per_s_trials"],
                                            strict=True)]
            point, ci = t_interval(ratios)
            measured = {"plain_arm": plain[0]["placed"], "ratio": point, "ci95": ci,
                        "behind": ci is not None and ci[1] < 1.0}
        where = f"{row['placed']} C={row['concurrency']}"
        messages = []
        if predicted == "worse":
            low, high = row["predicted_stall_ratio_to_lru_ci95"]
            messages.append(f"WARNING: {where}: predicted stall "
                            f"{row['predicted_stall_ratio_to_lru']:.3f}x a plain cache's "
                            f"(lru, nothing pinned) on these steps, 95% interval "
                            f"[{low:.3f}, {high:.3f}]")
        if measured and measured["behind"]:
            messages.append(f"WARNING: {where}: measured {measured['ratio']:.3f}x the tokens/s "
                            f"of the plain-cache arm {measured['plain_arm']}, 95% interval "
                            f"[{measured['ci95'][0]:.3f}, {measured['ci95'][1]:.3f}]")
        out.append({"placed": row["placed"], "concurrency": row["concurrency"],
                    "predicted_vs_lru": predicted, "measured_vs_plain_cache": measured,
                    "ok": not messages, "messages": messages})
    return out



def ratio_to(row: dict, first: dict) -> dict:
    """`row`'s tokens/s over `first`'s at the same concurrency: measured (trial by trial,
    Student's t on the log ratios) and predicted (paired bootstrap)."""
    measured = [a / b for a, b in zip(row["measured_tokens_per_s_trials"],
                                      first["measured_tokens_per_s_trials"], strict=True)]
    point, ci = t_interval(measured)
    predicted = row["_predicted"].ratio_to(first["_predicted"])
    return {"measured_ratio_to_first": point, "measured_ratio_to_first_ci95": ci,
            "predicted_ratio_to_first": predicted.point,
            "predicted_ratio_to_first_ci95": predicted.ci95()}
