"""Solver quality and speed on a DeepSeek-V3-shaped placement problem.

    .venv/bin/python benchmarks/bench_solvers.py [--quick] [--time-limit 60]

The problem: 58 MoE layers x 256 experts, top-8, routing from `synthetic.deepseek_like`
(Zipf-like popularity, topic clusters); experts of MXFP4 DeepSeek-V3 size (3 x 7168 x 2048
weights at 4 bits plus one scale byte per 32 weights: 23,396,352 bytes); 8 cards of the
8 x RTX 5090 D preset (53 GB/s, 10 us per transfer, two sockets of 4 cards at 150 GB/s);
contiguous homes; each card may keep 70% of the expert bytes it homes (30% offloaded);
sampled decode steps at batch 1 and batch 8, weighted equally.

Prints, each figure saying what it measured:
1. ILP (SCIP from the greedy hint; at full size the bound is PDLP's LP dual, evaluated
   exactly, and the LP solution rounded and repaired gives candidates, see solvers/static/ilp.py):
   wall seconds, objective (expected stall per step), proven lower bound and relative gap
   (target gap <= 1% within the time limit);
2. greedy: wall seconds (target < 2 s) and its objective over the ILP objective (target
   <= 1.03, as the issue states it) and, for information, over the ILP bound;
3. layer offload (llama.cpp-style) and uniform: objective over the ILP bound;
4. determinism: two ILP runs with one seed give the identical placement;
5. why the gap target is missed: on the --quick problem, where SCIP branches within
   --time-limit, its proven bound over the problem's LP relaxation (GLOP). The integer
   optimum lies at least that far above the LP, so no bound from the LP alone (all a
   full-size run affords) certifies a gap below it;
6. --robust (solvers/static/robust.py) over this traffic and a second one at batch 1 and 8: seconds,
   mean regret, its bound and gap, each scenario's stall beside the plain ILP's.
Each target prints PASS or MISS; the exit status is 0 either way.
`--quick` shrinks the problem (a smoke run in well under 30 s, not figures to quote).
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
from ortools.linear_solver.python import model_builder as mb

from solvers import cost, homes
from solvers.patterns import problem_patterns
from solvers.problem import Cards, Problem, SolveResult
from solvers.static import baselines, greedy, ilp, robust
from solvers.static.milp_model import milp_data, model_of

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from synthetic import deepseek_like, steps_from_tokens  # noqa: E402  (tests/synthetic.py)

# MXFP4 DeepSeek-V3 routed expert: gate, up, down of 7168 x 2048 at 4 bits + E8M0 scales / 32.
EXPERT_BYTES = 3 * 7168 * 2048 // 2 + 3 * 7168 * 2048 // 32
QUICK = dict(layers=8, experts=64, top_k=4, cards=4, tokens=2048)


def make_problem(layers: int, experts: int, top_k: int, cards: int, steps: int,
                 tokens: int, seed: int) -> Problem:
    selected, seq_ids = deepseek_like(layers, experts, top_k, num_tokens=tokens,
                                      num_seqs=min(256, tokens // 8), seed=seed)
    step_sets = [steps_from_tokens(selected, seq_ids, experts, batch, steps, seed + batch,
                                   name=f"synthetic-b{batch}", weight=0.5,
                                   base_step_s=base)
                 for batch, base in ((1, 9e-3), (8, 28e-3))]
    eb = np.full((layers, experts), EXPERT_BYTES, dtype=np.int64)
    home = homes.contiguous_homes(layers, experts, cards)
    homed = np.bincount(home.ravel(), weights=eb.ravel(), minlength=cards)
    capacity = np.floor(0.7 * homed).astype(np.int64)
    link_of = np.arange(cards) * 2 // cards if cards > 1 else np.zeros(1, dtype=np.int64)
    hw = Cards(bandwidth=np.full(cards, 53e9), latency=np.full(cards, 10e-6),
               link_of=link_of.astype(np.int64),
               link_bandwidth=np.full(int(link_of.max()) + 1, 150e9))
    return Problem(eb, home, capacity, hw, step_sets, None)


def lp_relaxation(problem: Problem) -> float:
    """The optimum of the MILP's LP relaxation (integrality dropped), in seconds per step."""
    data = milp_data(problem, problem_patterns(problem))
    solver = mb.Solver("glop")
    if solver.solve(model_of(data, integral=False).model) != mb.SolveStatus.OPTIMAL:
        raise RuntimeError("GLOP did not solve the LP relaxation")
    return (solver.objective_value + data.offset) * data.time_scale


def integrality_gap(problem: Problem, r: SolveResult) -> None:
    """Figure 5 of the module docstring: `r` is the ILP's result on the --quick `problem`."""
    lp = lp_relaxation(problem)
    layers, experts = problem.expert_bytes.shape
    print(f"LP relaxation ({layers} x {experts}, {problem.cards.num_cards} cards, "
          f"{problem.steps[0].selected.shape[0]} steps per batch): LP optimum {lp * 1e3:.4f} ms; "
          f"SCIP in {r.seconds:.0f} s: objective "
          f"{r.objective * 1e3:.4f} ms, proven bound {r.bound * 1e3:.4f} ms = "
          f"{r.bound / lp - 1:.2%} above the LP (the integer optimum is at least that far above "
          f"it; the objective is {r.objective / lp - 1:.2%} above)")


def robust_at_scale(problem: Problem, shape: dict, steps: int, limit: float, seed: int) -> None:
    """Figure 6: --robust over this traffic and a second one (another routing seed), each at
    batch 1 and 8: wall seconds, mean regret, bound and gap; each scenario's stall beside
    the plain ILP's on the two profiles together."""
    other = make_problem(steps=steps, seed=seed + 7, **shape)
    scenarios = [replace(p, steps=[st]) for p in (problem, other) for st in p.steps]
    together = replace(problem, steps=[replace(st, weight=st.weight / 2)
                                       for st in problem.steps + other.steps])
    plain = ilp.solve(together, time_limit=limit, seed=seed)
    r = robust.solve(scenarios, time_limit=limit, seed=seed).result
    stalls = ", ".join(f"{cost.objective(s, r.placement) * 1e3:.3f} ms (plain "
                       f"{cost.objective(s, plain.placement) * 1e3:.3f})" for s in scenarios)
    print(f"robust (2 profiles x batch 1, 8): {r.seconds:.1f} s wall (time limit {limit:g} s), "
          f"mean regret {r.objective:.4f}, bound {r.bound:.4f}, gap {r.gap:.2%}; stall per "
          f"scenario {stalls}")


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run")
    parser.add_argument("--time-limit", type=float, default=None,
                        help="ILP seconds (default 60, --quick 5)")
    parser.add_argument("--steps", type=int, default=None,
                        help="sampled steps per batch (default 300, --quick 60)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.quick:
        shape = QUICK
        steps, limit = args.steps or 60, args.time_limit or 5.0
    else:
        shape = dict(layers=58, experts=256, top_k=8, cards=8, tokens=8192)
        steps, limit = args.steps or 300, args.time_limit or 60.0

    start = time.perf_counter()
    problem = make_problem(steps=steps, seed=args.seed, **shape)
    print(f"problem: {shape['layers']} MoE layers x {shape['experts']} experts, "
          f"top-{shape['top_k']}, {shape['cards']} cards, {EXPERT_BYTES:,} bytes per expert, "
          f"capacity 70% of homed bytes per card, {steps} sampled steps at each of batch 1 "
          f"and 8 (built in {time.perf_counter() - start:.1f} s)")

    g = greedy.solve(problem, seed=args.seed)
    a = ilp.solve(problem, time_limit=limit, seed=args.seed)
    b = ilp.solve(problem, time_limit=limit, seed=args.seed)
    layer = baselines.layer_offload(problem)
    uni = baselines.uniform(problem, top_k=shape["top_k"], seed=args.seed)
    for r in (g, a, layer, uni):
        assert r.placement.fits(problem), r.solver

    ms = 1e3
    print(f"ILP: {a.seconds:.1f} s wall (time limit {limit:g} s, includes the greedy hint), "
          f"status {a.status}; objective {a.objective * ms:.4f} ms expected stall per step, "
          f"bound {a.bound * ms:.4f} ms, gap {a.gap:.2%} "
          f"[target gap <= 1%: {verdict(a.gap <= 0.01)}]")
    print(f"greedy: {g.seconds:.2f} s wall [target < 2 s: {verdict(g.seconds < 2.0)}]; "
          f"objective {g.objective * ms:.4f} ms = {g.objective / a.objective:.4f} x ILP "
          f"objective [target <= 1.03: {verdict(g.objective <= 1.03 * a.objective)}] = "
          f"{g.objective / a.bound:.4f} x ILP bound; "
          f"ILP improves on it by {1 - a.objective / g.objective:.2%}")
    print(f"layer offload: objective {layer.objective * ms:.4f} ms = "
          f"{layer.objective / a.bound:.3f} x ILP bound ({layer.objective / a.objective:.3f} x "
          f"ILP objective)")
    print(f"uniform: objective {uni.objective * ms:.4f} ms = {uni.objective / a.bound:.3f} x "
          f"ILP bound")
    same = np.array_equal(a.placement.resident_pages, b.placement.resident_pages)
    print(f"determinism: two ILP runs with seed {args.seed} give "
          f"{'identical' if same else 'different'} placements (objectives "
          f"{a.objective * ms:.6f} and {b.objective * ms:.6f} ms; second run {b.seconds:.1f} s) "
          f"[target identical: {verdict(same)}]")
    if args.quick:
        integrality_gap(problem, a)
    else:
        small = make_problem(steps=60, seed=args.seed, **QUICK)
        integrality_gap(small, ilp.solve(small, time_limit=limit, seed=args.seed))
    robust_at_scale(problem, shape, steps, limit, args.seed)


if __name__ == "__main__":
    main()
