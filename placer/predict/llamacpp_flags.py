"""`placer evaluate --engine llamacpp --flags '...'`: llama-server command lines predicted on a
box, side by side, beside a llama.cpp plan's choice when a plan is given.

Each command line becomes a setup (placer.plan.engine.flag_lines, placer/plan/llamacpp_flags.py)
replayed as evaluate replays a llama.cpp plan (solvers/llamacpp/cost.py `judge`: the same
steps, seed and bootstrap), so the flags of one of a plan's options predict exactly what the
plan predicts for that option. The lines are judged together where they run on the same
cards (paired intervals; ratios to the first line), apart where -ts or -ot give them other
cards. Without --traces the routing is uniform (every token picks top-k distinct experts
of each layer uniformly at random, UNIFORM_SEQUENCES sequences of UNIFORM_TOKENS tokens,
seeded): said so in the report.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from placer.checkpoint.kv import SHAPE_KEY, trained_context
from placer.checkpoint.source import DTYPE_FLAGS
from placer.errors import PlacerError
from placer.hardware.host_fit import llamacpp_host_share
from placer.hardware.spec import HardwareSpec
from placer.plan import engine as dispatch
from placer.plan.estimates import add_step_ranges, estimated_json
from placer.plan.llamacpp import n_cpu_moe
from placer.plan.llamacpp_flags import UNMODELLED, FlagLine, Model, ServerFlags, parse_flags
from placer.predict.evaluate import EvalOptions, check_options, replay_steps
from solvers.llamacpp.cost import MIB, Machine, Setup, judge
from traces.storing.profile import TokenSteps, load_profile

UNIFORM_SEQUENCES = 32
UNIFORM_TOKENS = 64
PLAN_LINE = "plan's choice"


@dataclass(frozen=True)
class FlagsRequest:
    """What `evaluate --flags` was given: the command lines, and a plan or the model
    (`model` a checkpoint or GGUF, or `config`), the spec and the build."""

    flags: list[str]
    plan: Path | None = None
    engine: str | None = None
    version: str | None = None
    model: Path | None = None
    config: Path | None = None
    hardware: str | None = None
    traces: list[Path] = field(default_factory=list)
    opts: EvalOptions = EvalOptions()
    unused: list[str] = field(default_factory=list)  # evaluate's options --flags does not take
    dtypes: tuple[str | None, str | None] = (None, None)  # --expert-dtype, --dense-dtype


@dataclass(frozen=True)
class Box:
    """What the lines run on: the machine, the model, the spec (its base step and its
    estimate marks), the build's label, the seed and concurrencies, a check of a trace
    directory, and the plan's own line if any."""

    machine: Machine | None  # None: not a llama.cpp target (flag_lines refuses it)
    model: Model
    spec: HardwareSpec  # its base step, and what of it is estimated
    build: str
    seed: int
    batches: tuple[int, ...]
    check_traces: Callable[[Path], None]
    shape: tuple[int, int, int]  # MoE layers, experts per layer, top-k
    plan_line: Setup | None = None
    sized: Callable[[ServerFlags], tuple[Machine | None, str | None]] | None = None
    """A command line's machine with its -c/-ctk/-ctv's KV cache in the reserve, and the line
    saying so (None: the box's machine and the spec's reserved_kv, for every line)."""

    def machine_for(self, flags: ServerFlags) -> tuple[Machine | None, str | None]:
        """The machine `flags` run on, and how its KV cache was sized (None: the spec's)."""
        return (self.machine, None) if self.sized is None else self.sized(flags)


def evaluate_flags(req: FlagsRequest) -> dict:
    """The report of `evaluate --flags` (the --json form)."""
    check_options(req.opts)
    if not req.flags:
        raise PlacerError("give PLAN_OR_MANIFEST, or --flags '<llama-server flags>' (--model, "
                          "--config, --hardware and --engine are for --flags)")
    timed = req.opts.oracle_time_limit != EvalOptions().oracle_time_limit
    for flag, given in (("--cache-slots", req.opts.cache_slots),
                        ("--execution", req.opts.execution),
                        ("--oracle-time-limit", True if timed else None),
                        *((n, True) for n in req.unused)):
        if given is not None:
            raise PlacerError(f"{flag} is for a plan's own evaluation; --flags predicts "
                              "llama-server command lines: leave it out")
    if req.opts.num_steps is not None and not req.traces:
        raise PlacerError("--steps samples --traces; without them --flags is predicted on "
                          "uniform routing: give --traces or leave --steps out")
    box, target = plan_box(req) if req.plan is not None else model_box(req)
    lines = dispatch.flag_lines(target, req.flags, box.machine_for, box.model, box.batches)
    results, notes = [], []
    sets: list[tuple[str, Path | None]] = [(str(d), d) for d in req.traces] or [
        ("uniform routing", None)]
    for name, trace_dir in sets:
        if trace_dir is not None:
            box.check_traces(trace_dir)
            profile = load_profile(trace_dir)
        for b in box.batches:
            if trace_dir is None:
                steps = uniform_steps(*box.shape, b, box.seed)
            else:
                steps, note = replay_steps(trace_dir, profile, b, req.opts.num_steps,
                                           box.seed, groupings=req.opts.groupings)
                notes += [note] if note else []
            results.append(flags_row(box, lines, name, steps, req.opts.replicates))
    if not req.traces:
        notes.append(f"no --traces: uniform routing (each token picks {box.shape[2]} of "
                     f"{box.shape[1]} experts per layer uniformly at random; "
                     f"{UNIFORM_SEQUENCES} sequences x {UNIFORM_TOKENS} tokens, seed "
                     f"{box.seed}): real traffic's skew is what a cache lives on")
    notes += host_share_note(box, lines)
    add_step_ranges(results, box.spec)
    return {"engine": "llamacpp", "llamacpp_build": box.build, "seed": box.seed,
            "estimated": estimated_json(box.spec),
            "replicates": req.opts.replicates,
            "routing": "traces" if req.traces else "uniform",
            "lines": ([{"name": PLAN_LINE, "flags": None,
                        **setup_json(box, box.plan_line, box.machine),
                        "notes": [], "not_modelled": []}] if box.plan_line is not None else [])
            + [{"name": line.name, "flags": line.flags.text,
                **setup_json(box, line.setup, line.machine), "notes": list(line.notes),
                "not_modelled": [n.removeprefix(UNMODELLED) for n in line.notes
                                 if n.startswith(UNMODELLED)]} for line in lines],
            "results": results, "notes": notes}


def plan_box(req: FlagsRequest) -> tuple[Box, dispatch.Target]:
    """The box of a plan (its cards, model, build, seed and concurrencies)."""
    from placer.plan.llamacpp import engine_setup, plan_machine
    from placer.plan.placement import read_plan
    from placer.predict.evaluate import check_traces

    for flag, given in (("--model", req.model), ("--config", req.config),
                        ("--hardware", req.hardware), ("--engine", req.engine),
                        *zip(DTYPE_FLAGS, req.dtypes, strict=True)):
        if given is not None:
            raise PlacerError(f"{flag}: the plan names its model, hardware and engine; "
                              f"leave {flag} out")
    plan = read_plan(req.plan)
    target = dispatch.plan_target(plan, req.version)
    llama = target.engine == "llamacpp"
    model = Model(int(plan.model.get("num_layers") or max(plan.moe_layers) + 1),
                  tuple(plan.moe_layers))
    batches = req.opts.concurrency or tuple(plan.budget.get("concurrency") or (1,))
    seed = plan.solver.get("seed", 0) if req.opts.seed is None else req.opts.seed
    machine = plan_machine(plan, target.build) if llama else None
    if llama and SHAPE_KEY not in plan.model:
        sized_kv = next((f for f in req.flags if parse_flags(f).kv()), None)
        if sized_kv is not None:
            raise PlacerError(f"--flags {sized_kv!r}: this plan was written before plans "
                              "recorded the model's KV shape, so its -c/-ctk/-ctv cannot size "
                              "the KV cache: solve the plan again, or give --model (or "
                              "--config) and --hardware in place of the plan")
    return Box(machine, model, plan.hardware, target.build.label if llama else "", seed,
               batches, lambda d: check_traces(plan, d),
               (len(plan.moe_layers), plan.experts_per_layer, int(plan.model["top_k"])),
               engine_setup(plan, PLAN_LINE) if llama else None,
               kv_sizer(machine, plan.hardware, plan.model, lambda s: plan_machine(
                   plan, target.build, s)) if llama else None), target


def model_box(req: FlagsRequest) -> tuple[Box, dispatch.Target]:
    """The box of a model (a checkpoint, GGUF or config.json) on a spec."""
    from placer.checkpoint.source import model_inventory
    from placer.hardware.spec import load_spec
    from placer.plan.llamacpp import machine_of
    from placer.plan.options import SolveOptions
    from traces.storing.dataset import check_compatible, check_shape

    if (req.model is None) == (req.config is None):
        raise PlacerError("--flags: give a plan, or --model MODEL.gguf (or a checkpoint) or "
                          "--config config.json (not both), with --hardware")
    if req.hardware is None:
        raise PlacerError("--flags: give --hardware (a preset name or a .toml spec)")
    target = dispatch.target_of(req.engine or "llamacpp", req.version, req.model)
    inv = model_inventory(req.model, req.config, *req.dtypes)
    spec = load_spec(req.hardware)
    llama = target.engine == "llamacpp"
    machine = machine_of(inv, spec, SolveOptions(), target.build) if llama else None
    names = {layer: sorted({t.name for e in inv.experts[i * inv.experts_per_layer:
                                                         (i + 1) * inv.experts_per_layer]
                            for t in e.tensors})
             for i, layer in enumerate(inv.moe_layers)}
    gguf = all(n.startswith("blk.") for ns in names.values() for n in ns)
    model = (Model(inv.num_layers, tuple(inv.moe_layers), names.__getitem__) if gguf
             else Model(inv.num_layers, tuple(inv.moe_layers)))

    def check(trace_dir: Path) -> None:
        if inv.estimated:
            check_shape(trace_dir, len(inv.moe_layers), inv.experts_per_layer)
        else:
            check_compatible(trace_dir, inv.fingerprint, inv.moe_layers, inv.experts_per_layer)

    return Box(machine, model, spec, target.build.label if llama else "",
               0 if req.opts.seed is None else req.opts.seed, req.opts.concurrency or (1,),
               check, (len(inv.moe_layers), inv.experts_per_layer, inv.top_k),
               sized=kv_sizer(machine, spec, inv.config, lambda s: machine_of(
                   inv, s, SolveOptions(), target.build)) if llama else None), target


def kv_sizer(machine: Machine, spec: HardwareSpec, config: dict,
             machine_on: Callable[[HardwareSpec], Machine]
             ) -> Callable[[ServerFlags], tuple[Machine, str | None]]:
    """Box.sized for a model of `config` (a config.json, a GGUF's, or a plan's model section
    with its kv_shape) on `spec`: a line's -c/-ctk/-ctv size the KV cache in place of the
    spec's reserved_kv (placer.hardware.context.with_context), and `machine_on` makes the
    machine of that spec; `machine` where the line gives none, or gives -ctk/-ctv alone for a
    model whose trained context is unknown (said so: KV_NOTE)."""
    from placer.hardware.context import with_context

    def sized(flags: ServerFlags) -> tuple[Machine, str | None]:
        ctx = flag_context(flags, config) if flags.kv() else None
        if ctx is None:
            return machine, None
        with_kv, note = with_context(spec, config, ctx, flags.get("-ctk", "f16"),
                                     flags.get("-ctv"), said=", ".join(flags.kv()))
        return machine_on(with_kv), note

    return sized


def host_share_note(box: Box, lines: list[FlagLine]) -> list[str]:
    """Where a line has host layers read at the fitted share of host.memory_bandwidth."""
    setups = [line.setup for line in lines] + ([box.plan_line] if box.plan_line else [])
    host = box.machine.host if box.machine is not None else None
    if host is None or host.curves or not any(s.host.any() for s in setups):
        return []
    share = llamacpp_host_share()
    return [f"host layers: their experts read at {share:g} x the spec's host.memory_bandwidth, "
            f"{host.memory_bandwidth / 1e9:.3g} GB/s, the share llama.cpp's CPU expert "
            "matmuls reach (fitted to published runs: placer/hardware/data/host_fit.csv)"]


def flag_context(flags: ServerFlags, config: dict) -> int | None:
    """The context llama-server allocates KV for: -c N, or with -c 0 or no -c the model's
    trained context (common/common.h: n_ctx 0 is n_ctx_train); None where that is unknown."""
    given = int(flags.get("-c", "0"))
    return given if given > 0 else trained_context(config)


def uniform_steps(layers: int, experts: int, top_k: int, batch: int, seed: int) -> TokenSteps:
    """Uniform routing at concurrency `batch`: UNIFORM_SEQUENCES (at least 4 x batch, a
    multiple of it) sequences of UNIFORM_TOKENS tokens, `batch` of them decoding together."""
    rng = np.random.default_rng(seed)
    seqs = max(UNIFORM_SEQUENCES, 4 * batch)
    seqs += -seqs % batch
    k = min(top_k, experts)
    ids = np.empty((seqs, UNIFORM_TOKENS, layers, k), dtype=np.int16)
    for layer in range(layers):  # k distinct of E: the first k of a random order
        order = rng.random((seqs, UNIFORM_TOKENS, experts), dtype=np.float32)
        ids[:, :, layer] = np.argpartition(order, k - 1, axis=2)[..., :k]
    # [groups, B, T, L, k] -> steps [groups x T, B, L, k]
    grouped = ids.reshape(seqs // batch, batch, UNIFORM_TOKENS, layers, k)
    tokens = grouped.transpose(0, 2, 1, 3, 4).reshape(-1, batch, layers, k)
    seq_ids = np.arange(seqs).reshape(seqs // batch, batch)
    return TokenSteps(tokens, np.repeat(seq_ids, UNIFORM_TOKENS, axis=0))


def flags_row(box: Box, lines: list[FlagLine], name: str, steps: TokenSteps,
              replicates: int) -> dict:
    """One (traffic, B) row: every line's figures; each line's stall over the first line's
    where they run on the same cards (paired 95% interval), else null."""
    batch = steps.batch
    named = ([(box.machine, box.plan_line)] if box.plan_line is not None else []) + [
        (line.machine, line.setup) for line in lines]
    groups: dict[tuple, list[tuple[Machine, Setup]]] = {}
    for machine, setup in named:
        groups.setdefault((machine.device, machine.tensor_split), []).append((machine, setup))
    first = named[0][1].name
    figures: dict[str, dict] = {}
    row: dict = {"traces": name, "concurrency": batch, "steps": len(steps)}
    for members in groups.values():
        judged = judge(members[0][0], [s for _, s in members], steps.tokens, steps.seqs,
                       box.spec.base_step_s(batch), replicates, box.seed)
        row.update({"tokens": int(judged.units.tokens().sum()),
                    "interval_units": judged.units.count, "interval_over": judged.units.over})
        for _, setup in members:
            fig = dict(judged.figures[setup.name])
            ratio, ci = (judged.ratio(setup.name, first)
                         if first in judged.figures else (None, None))
            fig["ratio_to_first"], fig["ratio_to_first_ci95"] = ratio, ci
            figures[setup.name] = fig
    row["lines"] = {s.name: figures[s.name] for _, s in named}
    return row


def setup_json(box: Box, setup: Setup, machine: Machine) -> dict:
    """How a line runs: its host layers (decoder layers), cache and slots, share, pinning,
    and the MiB each card spills past its VRAM (`spill`: whether any does; predicted with
    the spilled share read over the link, solvers/llamacpp/cost.py)."""
    layers = [box.model.moe_layers[i] for i in setup.host_layers]
    spilled = [int(b) // MIB for b in machine.spill_bytes(setup.host)]
    return {"host_layers": layers, "n_cpu_moe": n_cpu_moe(layers),
            "moe_cache_mib": setup.cache_mib, "slots": list(setup.slots),
            "cpu_share": setup.cpu_share, "pinned": setup.pinned,
            "spill": any(spilled), "spill_mib": spilled}
