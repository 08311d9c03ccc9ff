"""Replay held-out traffic against a plan before it is deployed.

For each trace set and concurrency B, sampled decode steps (B tokens of B distinct sequences,
fixed seed) are replayed against the plan's placement with the same cost model the solver
optimizes (`solvers.cost`), and against the baselines at the same budget: layer offload,
uniform (no profile) and the oracle (solved on this very traffic: the limit). Drift is the
Jensen-Shannon divergence between the plan's calibration profile and the traffic.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from placer.errors import PlacerError
from placer.expert_cache import expected_staging
from placer.plan import Plan
from placer.solve import cards_of, figures
from solvers import baselines, greedy, ilp
from solvers.problem import Placement, Problem, SolveResult, Steps
from traces.dataset import check_compatible, check_shape
from traces.profile import load_profile, sample_steps, split_sequences


@dataclass(frozen=True)
class EvalOptions:
    concurrency: tuple[int, ...] | None = None  # default: the plan's
    num_steps: int | None = None                # default: the plan's
    seed: int | None = None                     # default: the plan's
    oracle_time_limit: float = 10.0
    cache_slots: int = 0                        # LRU slots per card, as `placer run` has


def plan_problem(plan: Plan, steps: list[Steps]) -> Problem:
    """The plan's problem (sizes, homes, capacities, cards) over the given steps."""
    return Problem(plan.matrix("bytes"), plan.matrix("card"),
                   np.array([c.capacity_bytes for c in plan.cards], dtype=np.int64),
                   cards_of(plan.hardware), steps, plan.page_size)


def plan_placement(plan: Plan) -> Placement:
    return Placement(plan.matrix("resident_pages"))


def check_traces(plan: Plan, trace_dir: Path) -> None:
    """Refuse traces of another model (fingerprint) or of another shape (imported counts)."""
    if plan.model.get("estimated"):
        check_shape(trace_dir, len(plan.moe_layers), plan.experts_per_layer)
    else:
        check_compatible(trace_dir, plan.model["fingerprint"], plan.moe_layers,
                         plan.experts_per_layer)


def js_divergence(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Jensen-Shannon divergence in bits between rows of p and q ([L, E] -> [L]).

    Rows are normalised to distributions first; an all-zero row counts as uniform."""
    def norm(x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=np.float64)
        s = x.sum(axis=1, keepdims=True)
        return np.where(s > 0, x / np.where(s > 0, s, 1), 1.0 / x.shape[1])

    p, q = norm(p), norm(q)
    m = 0.5 * (p + q)

    def kl(a: np.ndarray) -> np.ndarray:
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(a > 0, a * np.log2(a / m), 0.0).sum(axis=1)

    return 0.5 * kl(p) + 0.5 * kl(q)


def calibration_counts(plan: Plan) -> np.ndarray | None:
    """[L, E] selection counts the plan was solved on (all calibration profiles), or None."""
    if not plan.calibration:
        return None
    return sum(np.array(c["counts"], dtype=np.float64) for c in plan.calibration)


def oracle(problem: Problem, time_limit: float, seed: int) -> SolveResult:
    """The best placement for this very traffic: the ILP (greedy-hinted), within a limit."""
    return ilp.solve(problem, time_limit=time_limit, seed=seed)


def evaluate(plan: Plan, trace_dirs: list[Path], opts: EvalOptions) -> dict:
    """The evaluation report (the `--json` form): results, drift and verdicts."""
    if not trace_dirs:
        raise PlacerError("give at least one --traces DIR to evaluate on")
    batches = opts.concurrency or tuple(plan.budget.get("concurrency") or (1,))
    num_steps = opts.num_steps or int(plan.solver.get("steps") or 256)
    seed = plan.solver.get("seed", 0) if opts.seed is None else opts.seed
    placement = plan_placement(plan)
    calib = calibration_counts(plan)
    top_k = int(plan.model["top_k"])
    results, drift, verdicts, per_layer = [], [], [], []
    for trace_dir in trace_dirs:
        check_traces(plan, trace_dir)
        profile = load_profile(trace_dir)
        name = str(trace_dir)
        source = profile if not profile.per_token else trace_dir
        worst = 0.0
        for b in batches:
            selected = sample_steps(source, b, num_steps, seed)
            base = plan.hardware.base_step_s(b)
            problem = plan_problem(plan, [Steps(name, b, selected, 1.0, base)])
            rivals = {"layer": baselines.layer_offload(problem),
                      "uniform": baselines.uniform(problem, top_k=top_k, seed=seed),
                      "oracle": oracle(problem, opts.oracle_time_limit, seed)}
            row = {"traces": name, "concurrency": b,
                   "placement": figures(problem, placement, selected, b, base),
                   **{k: figures(problem, r.placement, selected, b, base)
                      for k, r in rivals.items()},
                   "oracle_gap": rivals["oracle"].gap}
            row["ratio_to_layer"] = _ratio(row["placement"], row["layer"])
            if opts.cache_slots:
                row["placement+cache"] = cache_figures(plan, selected, b, opts.cache_slots)
            worst = max(worst, row["ratio_to_layer"])
            results.append(row)
            per_layer.append(_per_layer(problem, selected, b, placement, rivals))
        if calib is not None:
            js = js_divergence(calib, profile.counts)
            drift.append({"traces": name, "js_mean_bits": float(js.mean()),
                          "js_per_layer_bits": js.tolist()})
        verdicts.append(_verdict(name, worst))
    return {"plan_fingerprint": plan.model["fingerprint"], "steps": num_steps, "seed": seed,
            "results": results, "drift": drift, "verdicts": verdicts, "per_layer": per_layer}


def cache_figures(plan: Plan, selected: np.ndarray, batch: int, slots: int) -> dict:
    """Static placement plus an LRU of `slots` staged experts per card, replayed over the
    sampled steps in order: what the runtime with `--cache-slots` stages (same counts)."""
    static, cached = (expected_staging(plan, selected, n) for n in (0, slots))
    steps = selected.shape[0]
    return {"cache_slots": slots,
            "staged_bytes_per_token": float(cached.bytes.sum()) / steps / batch,
            "copies_per_token": float(cached.copies.sum()) / steps / batch,
            "cache_hits_per_token": float(cached.hits.sum()) / steps / batch,
            "staged_bytes_saved": 1.0 - float(cached.bytes.sum()) / max(1, static.bytes.sum())}


def _ratio(placement: dict, layer: dict) -> float:
    """Stall of the placement over stall of layer offload (inf when layer offload has none)."""
    p, lay = placement["stall_ms_per_step"], layer["stall_ms_per_step"]
    if lay == 0:
        return 0.0 if p == 0 else float("inf")
    return p / lay


def _verdict(name: str, worst: float) -> dict:
    if worst > 1.0:
        return {"traces": name, "ok": False, "worst_ratio_to_layer": worst,
                "message": f"WARNING: {name}: this placement is predicted WORSE than layer "
                           f"offload on this traffic (stall {worst:.3f}x layer offload's)"}
    return {"traces": name, "ok": True, "worst_ratio_to_layer": worst,
            "message": f"ok: {name}: better than layer offload at every concurrency "
                       f"(stall at most {worst:.3f}x layer offload's)"}


def _per_layer(problem: Problem, selected: np.ndarray, batch: int, placement: Placement,
               rivals: dict[str, SolveResult]) -> dict:
    """Staged bytes per token per layer, for the plot."""
    from solvers.cost import step_stats

    rows = {"placement": placement, **{k: r.placement for k, r in rivals.items()}}
    return {"concurrency": batch,
            "staged_bytes_per_token": {
                k: (step_stats(problem, p, selected).staged_bytes.mean(axis=0) / batch).tolist()
                for k, p in rows.items()}}


def calibration_curve(plan: Plan, folds: int = 4, fractions: tuple[float, ...] = (
        0.125, 0.25, 0.5, 1.0), batch: int | None = None, seed: int | None = None,
        num_steps: int | None = None) -> list[dict]:
    """Held-out hit rate and stall against how much calibration traffic a plan sees.

    k-fold over the sequences of the plan's first calibration trace set: for each fold, a
    greedy plan (same homes and budgets as `plan`) is solved on `fraction` of the other
    folds' sequences and replayed on the held-out fold, beside the uniform baseline and the
    oracle (greedy solved on the held-out fold itself). Figures are means over folds.
    """
    if not plan.calibration or not plan.calibration[0].get("per_token"):
        raise PlacerError("--curve needs a plan solved on per-token traces (placer collect)")
    trace_dir = Path(plan.calibration[0]["traces"])
    b = batch or int((plan.budget.get("concurrency") or [1])[0])
    seed = plan.solver.get("seed", 0) if seed is None else seed
    num_steps = num_steps or int(plan.solver.get("steps") or 256)
    base = plan.hardware.base_step_s(b)
    top_k = int(plan.model["top_k"])
    splits = split_sequences(trace_dir, folds, seed)
    rng = np.random.default_rng(seed)
    rows: dict[float, list[dict]] = {f: [] for f in fractions}
    lines: dict[str, list[dict]] = {"uniform": [], "oracle": []}
    for i, held_out in enumerate(splits):
        test = sample_steps(trace_dir, b, num_steps, seed, seq_ids=held_out)
        problem = plan_problem(plan, [Steps("held-out", b, test, 1.0, base)])
        lines["uniform"].append(figures(problem, baselines.uniform(
            problem, top_k=top_k, seed=seed).placement, test, b, base))
        lines["oracle"].append(figures(problem, greedy.solve(problem, seed=seed).placement,
                                       test, b, base))
        train_pool = sorted(set().union(*(s for j, s in enumerate(splits) if j != i)))
        for f in fractions:
            take = max(b, int(round(f * len(train_pool))))
            chosen = set(rng.choice(train_pool, size=min(take, len(train_pool)),
                                    replace=False).tolist())
            train = sample_steps(trace_dir, b, num_steps, seed, seq_ids=chosen)
            solved = greedy.solve(plan_problem(plan, [Steps("train", b, train, 1.0, base)]),
                                  seed=seed)
            row = figures(problem, solved.placement, test, b, base)
            row["tokens"] = load_profile(trace_dir, seq_ids=chosen).tokens
            rows[f].append(row)
    out = []
    for f in fractions:
        out.append({"line": "placement", "fraction": f, **_mean(rows[f])})
    for name, values in lines.items():
        out.append({"line": name, "fraction": None, **_mean(values)})
    return out


def _mean(rows: list[dict]) -> dict:
    return {k: float(np.mean([r[k] for r in rows])) for k in rows[0]}

