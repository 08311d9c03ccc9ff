"""`placer evaluate` of a plan solved with `--engine llamacpp`: its host layers and cache
replayed on held-out traffic (solvers/llamacpp/cost.py) against, at the same VRAM, `-ncmoe N`
alone (the "layer" line: the first MoE layers on the host, as few as fit) and its own host
layers without the cache ("nocache"), with paired 95% intervals over sequences. The cache
replayed is the plan's build's (its `llamacpp_build`; `evaluate --llamacpp-version`
replaces it before this runs)."""

from __future__ import annotations

import numpy as np

from placer.plan.llamacpp import engine_setup, plan_build, plan_machine
from placer.plan.placement import Plan
from solvers.judge.intervals import REPLICATES, verdict
from solvers.llamacpp.cost import Setup, judge
from solvers.llamacpp.search import fewest_host, setup_of
from traces.storing.profile import TokenSteps

EXECUTION = "llamacpp"


def llamacpp_lines(plan: Plan) -> list[Setup]:
    """The plan's setup, -ncmoe N alone and the plan's host layers without the cache."""
    machine = plan_machine(plan)
    order = np.arange(len(plan.moe_layers))
    mine = engine_setup(plan)
    return [mine, setup_of(machine, "layer", order, fewest_host(machine, order), 0.0),
            Setup("nocache", mine.host, pinned=mine.pinned)]


def llamacpp_row(plan: Plan, name: str, steps: TokenSteps, seed: int,
                 replicates: int = REPLICATES) -> dict:
    """One (traffic, B) row of evaluate's report for a llama.cpp plan."""
    machine = plan_machine(plan)
    batch = steps.batch
    judged = judge(machine, llamacpp_lines(plan), steps.tokens, steps.seqs,
                   plan.hardware.base_step_s(batch), replicates, seed)
    row = {"traces": name, "concurrency": batch, "execution": EXECUTION, "steps": len(steps),
           "tokens": int(judged.units.tokens().sum()), "interval_units": judged.units.count,
           "interval_over": judged.units.over, "cache": {}, **judged.figures}
    for other in ("layer", "nocache"):
        ratio, ci = judged.ratio("placement", other)
        row[f"ratio_to_{other}"], row[f"ratio_to_{other}_ci95"] = ratio, ci
    row["verdict"] = verdict(row["ratio_to_layer_ci95"])
    row["llamacpp_build"] = plan_build(plan).label
    return row
