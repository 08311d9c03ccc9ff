"""The calibration curve: held-out hit rate and stall against how much calibration traffic a
plan sees (`placer evaluate --curve`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from placer.errors import PlacerError
from placer.plan.placement import Plan
from placer.plan.solve import figures
from placer.predict.evaluate import REPLAY_SELECTIONS, plan_problem, replay_steps
from solvers.judge.replay import make_steps
from solvers.problem import Steps
from solvers.static import baselines, greedy
from traces.storing.profile import load_profile, split_sequences
from traces.storing.sample import replay_sample, sample_note


def calibration_curve(plan: Plan, folds: int = 4, fractions: tuple[float, ...] = (
        0.125, 0.25, 0.5, 1.0), batch: int | None = None, seed: int | None = None,
        num_steps: int | None = None) -> tuple[list[dict], str | None]:
    """Held-out hit rate and stall against how much calibration traffic a plan sees.

    k-fold over the sequences of the plan's first calibration trace set: for each fold, a
    greedy plan (same homes and budgets as `plan`) is solved on `fraction` of the other
    folds' sequences and replayed on the held-out fold, beside the uniform baseline and the
    oracle (greedy solved on the held-out fold itself). Every token of a fold is replayed
    (and trained on) unless `num_steps` asks for that many sampled steps; past evaluate's
    REPLAY_SELECTIONS the folds are cut from a seeded sample of whole sequences, as
    evaluate's replay is, and the note (else None) says so. Figures are means over folds,
    with 95% intervals over folds.
    """
    if plan.engine is not None:
        raise PlacerError(f"--curve replays greedy placements for placer's runtime; this plan "
                          f"was solved with --engine {plan.engine.get('name')}")
    if folds < 2:
        raise PlacerError(f"--folds must be >= 2, got {folds}")
    if not plan.calibration or not plan.calibration[0].get("per_token"):
        raise PlacerError("--curve needs a plan solved on per-token traces (placer collect)")
    trace_dir = Path(plan.calibration[0]["traces"])
    b = batch or int((plan.budget.get("concurrency") or [1])[0])
    seed = plan.solver.get("seed", 0) if seed is None else seed
    base = plan.hardware.base_step_s(b)
    top_k = int(plan.model["top_k"])
    profile = load_profile(trace_dir)
    splits = split_sequences(trace_dir, folds, seed)
    sample = (replay_sample(trace_dir, seed, max_selections=REPLAY_SELECTIONS)
              if num_steps is None else None)
    if sample is not None:
        kept = set(sample.seq_ids)
        splits = [s & kept for s in splits]
    rng = np.random.default_rng(seed)
    rows: dict[float, list[dict]] = {f: [] for f in fractions}
    lines: dict[str, list[dict]] = {"uniform": [], "oracle": []}

    def steps_of(name: str, seq_ids: set[int]) -> Steps:
        steps, _ = replay_steps(trace_dir, profile, b, num_steps, seed, seq_ids=seq_ids)
        return make_steps(name, steps, plan.experts_per_layer, 1.0, base)

    for i, held_out in enumerate(splits):
        problem = plan_problem(plan, [steps_of("held-out", held_out)])
        lines["uniform"].append(figures(problem, baselines.uniform(
            problem, top_k=top_k, seed=seed).placement, problem.steps[0]))
        lines["oracle"].append(figures(problem, greedy.solve(problem, seed=seed).placement,
                                       problem.steps[0]))
        train_pool = sorted(set().union(*(s for j, s in enumerate(splits) if j != i)))
        for f in fractions:
            take = max(b, int(round(f * len(train_pool))))
            chosen = set(rng.choice(train_pool, size=min(take, len(train_pool)),
                                    replace=False).tolist())
            solved = greedy.solve(plan_problem(plan, [steps_of("train", chosen)]), seed=seed)
            row = figures(problem, solved.placement, problem.steps[0])
            row["tokens"] = load_profile(trace_dir, seq_ids=chosen).tokens
            rows[f].append(row)
    out = []
    for f in fractions:
        out.append({"line": "placement", "fraction": f, **_mean(rows[f])})
    for name, values in lines.items():
        out.append({"line": name, "fraction": None, **_mean(values)})
    return out, None if sample is None else f"--curve: {sample_note(trace_dir, sample.json())}"


def _mean(rows: list[dict]) -> dict:
    """Each figure's mean over folds with its 95% interval over folds (Student's t: the folds
    are the independent held-out samples; `<figure>_ci95`)."""
    from scipy.stats import t as student

    out = {}
    for key in rows[0]:
        values = np.array([r[key] for r in rows], dtype=np.float64)
        mean = float(values.mean())
        half = (float(student.ppf(0.975, values.size - 1) * values.std(ddof=1)
                      / np.sqrt(values.size)) if values.size > 1 else float("nan"))
        out[key], out[f"{key}_ci95"] = mean, [mean - half, mean + half]
    return out
