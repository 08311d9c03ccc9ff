"""Whose runtime a plan is for, and which build: the one engine dispatch.

Every command that solves, evaluates or exports asks this module, never decides itself:
`target_of` turns what the user gave (--engine, --llamacpp-version, the model's path) into a
`Target`, with one error per wrong option; `check_solve` refuses, before any traffic is read,
every option the target's solver would refuse later (so `placer plan` refuses them before it
collects); `solve` runs the target's solver. A llama.cpp plan records its build and the GGUF
it was solved from (path and fingerprint, placer.plan.llamacpp), which export and evaluate
read back through `plan_build`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from placer.errors import PlacerError

if TYPE_CHECKING:
    from collections.abc import Callable

    from placer.checkpoint.inventory import Inventory
    from placer.hardware.spec import HardwareSpec
    from placer.plan.llamacpp_flags import FlagLine, ServerFlags
    from placer.plan.llamacpp_flags import Model as FlagModel
    from placer.plan.options import SolveOptions
    from placer.plan.placement import Plan
    from solvers.llamacpp.builds import Build
    from solvers.llamacpp.cost import Machine
    from solvers.static.ilp import Progress

    # A command line's machine, and the line that says how its -c/-ctk/-ctv sized the KV.
    MachineFor = Callable[[ServerFlags], tuple[Machine | None, str | None]]

ENGINES = ("placer", "llamacpp")  # placer's runtime (emit, serve) or llama.cpp (llama-server)


@dataclass(frozen=True)
class Target:
    """The runtime a plan is for: `engine` (ENGINES), the llama.cpp `build` (None for placer)
    and the GGUF the plan is solved from (llama.cpp: recorded for `-m`; None: a checkpoint or
    config.json, exported with a named placeholder)."""

    engine: str = "placer"
    build: Build | None = None
    gguf: Path | None = None


def is_gguf(model: Path | None) -> bool:
    return model is not None and model.suffix.lower() == ".gguf"


def parse_version(version: str | None) -> Build:
    """The llama.cpp build `--llamacpp-version` names (None: the newest policy known, marked
    assumed), or a PlacerError naming the option."""
    from solvers.errors import SolverError
    from solvers.llamacpp.builds import parse_build

    try:
        return parse_build(version)
    except SolverError as exc:
        raise PlacerError(str(exc)) from None


def target_of(engine: str | None, version: str | None, model: Path | None) -> Target:
    """The Target of a command's --engine (None: llamacpp for a GGUF, else placer),
    --llamacpp-version and --model."""
    name = engine if engine is not None else ("llamacpp" if is_gguf(model) else "placer")
    if name not in ENGINES:
        raise PlacerError(f"--engine must be one of {', '.join(ENGINES)}, not {name!r}")
    if name != "llamacpp":
        if version is not None:
            raise PlacerError("--llamacpp-version is for --engine llamacpp")
        return Target(name)
    return Target(name, parse_version(version), model if is_gguf(model) else None)


def check_solve(inv: Inventory, spec: HardwareSpec, opts: SolveOptions, target: Target,
                traces: int) -> None:
    """Every refusal of `solve(...)` that needs no traffic, for `traces` trace sets: the
    options' ranges (check_options, which both solvers' checks run first), their
    combinations, the budget against the cards."""
    if target.engine == "llamacpp":
        from placer.plan.llamacpp import check_llamacpp

        check_llamacpp(inv, spec, opts, target.build, traces)
    else:
        from placer.plan.solve import check_placement

        check_placement(inv, spec, opts, traces)


def solve(inv: Inventory, spec: HardwareSpec, trace_dirs: list[Path], opts: SolveOptions,
          target: Target, progress: Progress | None = None) -> Plan:
    """The plan of `target` for `inv` on `spec` from the traces in `trace_dirs`; `progress`
    is told placer's solver stages."""
    from placer.plan.estimates import add_step_ranges

    if target.engine == "llamacpp":
        from placer.plan.llamacpp import solve_llamacpp

        plan = solve_llamacpp(inv, spec, trace_dirs, opts, target.build,
                              None if target.gguf is None else str(target.gguf))
    else:
        from placer.plan.solve import solve_plan
        from solvers.static.ilp import no_progress

        plan = solve_plan(inv, spec, trace_dirs, opts, progress or no_progress)
    add_step_ranges(plan.predicted, spec)
    return plan


def plan_target(plan: Plan, version: str | None = None) -> Target:
    """The Target a plan was solved for; `version` (--llamacpp-version) replaces a llama.cpp
    plan's build, and is refused for any other plan."""
    if plan.engine is None:
        if version is not None:
            raise PlacerError("--llamacpp-version is for plans solved with --engine llamacpp")
        return Target("placer")
    from placer.plan.llamacpp import plan_build

    gguf = plan.engine.get("gguf")
    return Target("llamacpp", plan_build(plan, None if version is None
                                         else parse_version(version)),
                  Path(gguf) if gguf else None)


def for_build(plan: Plan, version: str) -> Plan:
    """`plan` replayed for the llama.cpp build `version` (--llamacpp-version of a plan solved
    with --engine llamacpp; refused for any other plan)."""
    import dataclasses

    build = plan_target(plan, version).build
    return dataclasses.replace(plan, engine={**plan.engine, "llamacpp_build": build.to_json()})


def flag_lines(target: Target, texts: list[str], machine_for: MachineFor, model: FlagModel,
               batches: tuple[int, ...]) -> list[FlagLine]:
    """`evaluate --flags`: each command line of `texts` as the target's engine runs it on the
    machine `machine_for` gives its flags (its -c/-ctk/-ctv size the KV cache where the model's
    config is known: the line that says so, else None) (placer.plan.llamacpp_flags); refused
    for any engine but llama.cpp."""
    if target.engine != "llamacpp":
        raise PlacerError("--flags takes llama-server's command line: it is for --engine "
                          "llamacpp, beside a plan only one solved with --engine llamacpp")
    from placer.plan.llamacpp_flags import flag_line, parse_flags

    names = ["flags"] if len(texts) == 1 else [f"flags {i + 1}" for i in range(len(texts))]
    lines = []
    for name, text in zip(names, texts, strict=True):
        flags = parse_flags(text)
        machine, kv_note = machine_for(flags)
        assert machine is not None  # a llama.cpp target has its machine
        lines.append(flag_line(name, flags, machine, model, target.build, batches, kv_note))
    return lines
