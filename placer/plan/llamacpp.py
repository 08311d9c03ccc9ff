"""`placer solve --engine llamacpp`: which MoE layers llama.cpp keeps in host memory and how
big its expert cache is, from an inventory, a spec of one or more cards and calibration
traffic. With several cards every layer runs on the GPUs (`-ngl all`) split by `-ts` in
proportion to each card's VRAM for experts (machine_of); each card's host layers use its
own link, and the one CPU computes every card's host layers.

The search and its cost are in solvers/llamacpp/search.py and solvers/llamacpp/cost.py; the cache
is llama.cpp's own (solvers/llamacpp/lru.py, ggml-org/llama.cpp @4b060f27). The plan it
writes is a cpu-execution plan (the GPU layers' experts resident, the host layers' cold) with
an `engine` section: {"name": "llamacpp", "host_layers": decoder layers, "moe_cache_mib": N,
"slots": per group, "n_cpu_moe": N where the host layers are the first N decoder layers,
"cpu_share": --moe-cache-cpu-share, "pinned": host experts pinned (-lm none) or mmap'd,
"alignment", "tensor_split": the -ts proportions (None: one card), "devices": the card of
each MoE layer, "llamacpp_build": the build planned for (solvers/llamacpp/builds.py),
"context": -c (the tokens the spec's reserved KV bytes hold, None where the model's
attention shape is not known), "gguf": the GGUF solved from (None: a checkpoint or config),
"options": the table solve prints, upstream's tuner grid included ("tuner": true;
"tuner_pick" names the one placer's replay ranks first)}. `placer export llamacpp` turns it
(or any option) into llama-server flags; `placer evaluate` replays it
(placer/predict/llamacpp.py). Where every expert fits the cards, the plan has no host layer
and no cache (`-ngl all` alone).
"""

from __future__ import annotations

import dataclasses
import math
import re
import time
from functools import reduce

import numpy as np

from placer.checkpoint.flops import expert_flops
from placer.checkpoint.inventory import Inventory
from placer.checkpoint.kv import context_for
from placer.errors import PlacerError
from placer.hardware.host_fit import llamacpp_host_share, llamacpp_spill_rate
from placer.hardware.spec import HardwareSpec
from placer.plan.options import SolveOptions, check_options
from placer.plan.placement import Plan, build_plan
from placer.plan.solve import calibration_json, host_of
from placer.plan.traffic import Traffic, fold_ids, load_traffic, traffic_steps
from placer.units import format_bytes
from solvers.cpu import Host
from solvers.errors import SolverError
from solvers.llamacpp.builds import Build, build_from_json, default_build
from solvers.llamacpp.cost import Machine, Setup, judge, layer_devices
from solvers.llamacpp.lru import CUDA_ALIGNMENT
from solvers.llamacpp.search import (
    CPU_SHARES,
    TUNER_SHARES,
    Candidate,
    Scenario,
    SearchResult,
    Space,
    fewest_host,
    objective,
    search,
    setup_of,
    tuner_grid,
)
from traces.errors import TraceError

ENGINE = "llamacpp"
SOURCE = "ggml-org/llama.cpp src/llama-moe-cache.cpp"
_NUMBERS = re.compile(r"\d+")


def expert_layout(inv: Inventory) -> tuple:
    """[L] (key, nb2) of each MoE layer as llama.cpp's cache compares layouts: its expert
    matrices in llama.cpp's order (biases left out, a quantized matrix's blocks and scales
    together), their dtypes and shapes (layer and expert numbers taken out of the names), and
    the bytes of one expert of each."""
    out = []
    for layer in range(len(inv.moe_layers)):
        ex = inv.experts[layer * inv.experts_per_layer]
        parts: dict[str, list] = {}
        for t in ex.tensors:
            if t.name.endswith(("bias", "_bias")):
                continue
            base = re.sub(r"(_blocks|_scales|\.weight_scale_inv|\.weight)$", "", t.name)
            parts.setdefault(_NUMBERS.sub("#", base), []).append(t)
        names = sorted(parts, key=_bank_order)
        key = tuple((name, tuple((t.dtype, t.shape) for t in parts[name])) for name in names)
        out.append((key, tuple(sum(t.length for t in parts[name]) for name in names)))
    return tuple(out)


def _bank_order(name: str) -> tuple[int, str]:
    """llama.cpp's order of a layer's expert tensors: gate_up, gate, up, down."""
    rank = next((i for i, part in enumerate(("gate_up", "gate", "up", "down")) if part in name),
                4)
    return rank, name


def machine_of(inv: Inventory, spec: HardwareSpec, opts: SolveOptions,
               build: Build | None = None) -> Machine:
    """The model and the cards as the search needs them: each card's VRAM for experts and
    cache (its free VRAM, or --budget), and with several cards `-ts` in proportion to that
    VRAM (MiB, reduced by their gcd), which decides each layer's card (layer_devices)."""
    hidden = inv.config.get("hidden_size")
    if spec.host is None or not hidden:
        raise PlacerError(f"--engine llamacpp computes host layers on the CPU: hardware spec "
                          f"{spec.name!r} needs a [host] table and the model a hidden_size")
    capacity = [opts.budget if opts.budget is not None else c.free_bytes for c in spec.cards]
    for card, cap in zip(spec.cards, capacity, strict=True):
        if cap > card.free_bytes:
            raise PlacerError(f"--budget {format_bytes(cap)} exceeds card {card.index}'s free "
                              f"VRAM {format_bytes(card.free_bytes)} (vram minus the spec's "
                              "reserved bytes)")
    split, device = None, ()
    if len(spec.cards) > 1:
        mib = [max(1, c >> 20) for c in capacity]
        split = tuple(float(m // reduce(math.gcd, mib)) for m in mib)
        n_layer = int(inv.config.get("num_hidden_layers") or max(inv.moe_layers) + 1)
        device = tuple(int(d) for d in layer_devices(n_layer, split)[list(inv.moe_layers)])
    bandwidth, latency = card_links(spec)
    return Machine(inv.expert_bytes(), expert_flops(inv), expert_layout(inv), inv.top_k,
                   tuple(int(c) for c in capacity), bandwidth, latency, CUDA_ALIGNMENT,
                   llamacpp_host(host_of(spec, hidden)), device, split, pageable_of(spec),
                   (build or default_build()).cache, alloc_limits(spec), *spill_of(spec))


def spill_of(spec: HardwareSpec) -> tuple:
    """Machine's spill fields for `spec`'s cards: whether each spills past its VRAM, its
    VRAM, what it holds beside experts, and the fitted rate it reads spilled bytes at."""
    return (tuple(spec.spills(c)[0] for c in spec.cards), tuple(c.vram for c in spec.cards),
            tuple(c.vram - c.free_bytes for c in spec.cards), llamacpp_spill_rate())


def llamacpp_host(host: Host) -> Host:
    """The spec's host as llama.cpp's CPU runs experts: without a measured expert curve, at
    the fitted share of its streaming bandwidth (placer/hardware/host_fit.py)."""
    if host.curves:
        return host
    return dataclasses.replace(host, memory_bandwidth=host.memory_bandwidth
                               * llamacpp_host_share())


def alloc_limits(spec: HardwareSpec) -> tuple[int, ...]:
    """Each card's largest one allocation, the most of the cache it may hold (its backend's:
    placer/hardware/data/backends.csv; 0: no limit)."""
    return tuple(c.max_alloc or 0 for c in spec.cards)


def pageable_of(spec: HardwareSpec) -> tuple[float | None, ...]:
    """Each card's uploads from mmap'd host memory (`h2d_pageable_bandwidth`; None: not in
    the spec, the cost model then takes the pinned bandwidth x PAGEABLE_FACTOR, ESTIMATED)."""
    return tuple(c.h2d_pageable_bandwidth for c in spec.cards)


def card_links(spec: HardwareSpec) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Each card's host-to-device bandwidth (at most its [[link]]'s: llama.cpp runs the
    layers one after another, so two cards' copies never share the link at once) and
    per-copy latency."""
    link = {c: lk.bandwidth for lk in spec.links for c in lk.cards}
    return (tuple(min(c.h2d_bandwidth, link.get(c.index, c.h2d_bandwidth)) for c in spec.cards),
            tuple(c.latency_s for c in spec.cards))


def scenarios_of(traffic: list[Traffic], opts: SolveOptions) -> tuple[list[Scenario], int]:
    """Every (traffic, concurrency) with the same number of folds over sequences (a fold needs
    B sequences for a step of B), and that number (0: too few sequences anywhere, every
    scenario judged in sample)."""
    weights = opts.weights or tuple(1.0 / len(opts.concurrency) for _ in opts.concurrency)
    k = min(min(opts.folds, t.profile.sequences // b) for t in traffic for b in opts.concurrency)
    out = []
    for t in traffic:
        sets = fold_ids(t, k, opts.seed) if k >= 2 else []
        every = set().union(*sets)
        for b, w in zip(opts.concurrency, weights, strict=True):
            steps = t.steps[b]
            try:
                folds = [tuple(traffic_steps(t.path, t.profile, b, None, opts.seed, ids).tokens
                               for ids in (every - held, held)) for held in sets]
            except TraceError:  # a fold's sequences too few for B after all
                k, folds = 0, []
            out.append(Scenario(f"{t.name} B={b}", steps.tokens, steps.seqs,
                                folds or [(steps.tokens, steps.tokens)], w / len(traffic),
                                0.0))
    if k < 2:
        out = [Scenario(s.name, s.tokens, s.seqs, [(s.tokens, s.tokens)], s.weight, 0.0)
               for s in out]
    return out, max(k, 0) if k >= 2 else 0


def context_of(inv: Inventory, spec: HardwareSpec) -> int | None:
    """-c: the spec's `[context]` tokens where it names them (reserved_kv then holds them:
    placer/hardware/context.py); for a spec without one, the longest context whose f16 KV
    cache fits the reserved_kv summed over the cards (-ts splits the KV over them), as
    placer/checkpoint/kv.py sizes it; None where the config lacks the attention shape or the
    spec reserves less than 256 tokens."""
    if spec.context is not None:
        return spec.context.tokens
    return context_for(inv.config, sum(c.reserved_kv for c in spec.cards))


def space_of(build: Build) -> Space:
    """The search space the build allows (no cache before b11480, CPU shares, the search's
    and the tuner grid's, from its --moe-cache-cpu-share)."""
    share = build.has_cpu_share
    return Space(cache=build.has_cache, cpu_shares=CPU_SHARES if share else (0.0,),
                 tuner_shares=TUNER_SHARES if share else (0.0,))


def solve_llamacpp(inv: Inventory, spec: HardwareSpec, trace_dirs: list, opts: SolveOptions,
                   build: Build | None = None, gguf: str | None = None) -> Plan:
    """The llama.cpp plan (module docstring) for `build` (default: the newest policy known);
    `gguf`: the GGUF path solved from, recorded for export's -m."""
    build = build or default_build()
    machine = check_llamacpp(inv, spec, opts, build, len(trace_dirs))
    fits = fewest_host(machine, np.arange(len(inv.moe_layers))) == 0
    traffic = [load_traffic(d, inv, opts.concurrency, None, opts.seed) for d in trace_dirs]
    if any(not t.profile.per_token for t in traffic):
        raise PlacerError("--engine llamacpp needs per-token traces (imported counts have no "
                          "order for the cache to replay)")
    scenarios, folds = scenarios_of(traffic, opts)
    scenarios = [Scenario(s.name, s.tokens, s.seqs, s.folds, s.weight,
                          spec.base_step_s(s.tokens.shape[1])) for s in scenarios]
    began = time.perf_counter()
    try:
        result = (everything_fits(machine, scenarios) if fits else
                  search(machine, scenarios, space_of(build), spec.host_ram))
    except SolverError as exc:
        raise PlacerError(str(exc)) from None
    seconds = time.perf_counter() - began
    best = result.best
    chosen = setup_of(machine, "chosen", result.orders[best.rank], best.count, best.share,
                      best.cpu_share, best.pinned)
    setups = [chosen] if fits else option_setups(machine, result, chosen, build)
    options = [option_json(inv, s) for s in setups]
    predicted = []
    for t in traffic:
        for b in opts.concurrency:
            judged = judge(machine, setups, t.steps[b].tokens, t.steps[b].seqs,
                           spec.base_step_s(b), seed=opts.seed)
            base = "chosen" if fits else "ncmoe"
            row = {"profile": t.name, "concurrency": b, "options": judged.figures}
            for s in setups:
                ratio, ci = judged.ratio(s.name, base)
                row["options"][s.name]["ratio_to_ncmoe"] = ratio
                row["options"][s.name]["ratio_to_ncmoe_ci95"] = ci
            predicted.append(row)
    plan = plan_of(inv, spec, machine, chosen, opts, options, predicted, folds, result,
                   traffic)
    plan.engine.update({"llamacpp_build": build.to_json(), "context": context_of(inv, spec),
                        "gguf": gguf, "tuner_pick": tuner_pick(options, predicted, opts)})
    plan.solver["seconds"] = seconds
    return plan


def check_llamacpp(inv: Inventory, spec: HardwareSpec, opts: SolveOptions,
                   build: Build | None, traces: int) -> Machine:
    """Every refusal of solve_llamacpp that needs no traffic (placer.plan.engine.check_solve),
    for `traces` trace sets; the Machine the options and spec give."""
    check_options(opts)  # the placer engine's option checks (--concurrency, --weights, ...)
    if opts.weights is not None and len(opts.weights) != len(opts.concurrency):
        raise PlacerError("--weights needs one weight per --concurrency value")
    if not traces:
        raise PlacerError("--engine llamacpp learns from traffic: give --traces DIR")
    for flag, given in (("--robust", opts.robust), ("--page-size", opts.page_size is not None),
                        ("--offload", opts.offload is not None),
                        ("--cache", opts.cache is not None), ("--ep", opts.ep != "contiguous")):
        if given:
            raise PlacerError(f"{flag} is for placer's own runtime; --engine llamacpp chooses "
                              "llama.cpp's host layers and cache (--budget caps the VRAM)")
    if opts.num_steps is not None:
        raise PlacerError("--engine llamacpp replays the calibration tokens in order (the "
                          "cache is an LRU): leave --steps out")
    return machine_of(inv, spec, opts, build or default_build())


def everything_fits(machine: Machine, scenarios: list[Scenario]) -> SearchResult:
    """The one candidate where every expert fits the cards: no host layer, no cache."""
    order = np.arange(len(machine.layer_bytes))
    best = Candidate("ncmoe", 0, 0.0)
    setup = setup_of(machine, "fits", order, 0, 0.0)
    held = [(sc.tokens, None, sc.weight, sc.base_step_s) for sc in scenarios]
    return SearchResult(best, {"ncmoe": order, "cpu": order, "cache": order},
                        {best: objective(machine, setup, held)})


def tuner_pick(options: list[dict], predicted: list[dict], opts: SolveOptions) -> str | None:
    """The tuner grid's option placer's replay predicts fastest (tok/s weighted over the
    concurrencies as the objective weighs them, averaged over the traffic sets)."""
    weights = dict(zip(opts.concurrency, opts.weights or [1.0] * len(opts.concurrency),
                       strict=True))
    names = [o["name"] for o in options if o.get("tuner")]
    if not names:
        return None
    return max(names, key=lambda n: sum(weights[r["concurrency"]]
                                        * r["options"][n]["tokens_per_s"] for r in predicted))


def option_setups(machine: Machine, result: SearchResult, chosen: Setup, build: Build
                  ) -> list[Setup]:
    """The options solve shows: the choice; the best host set with no cache; `-ncmoe N`
    alone (the baseline); the best cached candidate of the search when the choice has no
    cache; every MoE layer on the host with all the VRAM they free as the cache (`-cmoe
    --moe-cache-mib`, what users try first); and upstream's tuner grid (scripts/
    moe-cache-tune.py at b12191: solvers/llamacpp/search.py tuner_grid, also candidates of
    the choice), mmap'd as the command it wraps runs."""
    orders = result.orders
    out = [chosen,
           setup_of(machine, "no cache", orders["cpu"], fewest_host(machine, orders["cpu"]),
                    0.0),
           setup_of(machine, "ncmoe", orders["ncmoe"], fewest_host(machine, orders["ncmoe"]),
                    0.0)]
    cached = {c: v for c, v in result.scores.items() if c.share > 0 and v is not None}
    if chosen.cache_mib == 0 and cached:
        best = max(cached, key=cached.get)
        out.append(setup_of(machine, "best cache", orders[best.rank], best.count, best.share,
                            best.cpu_share, best.pinned))
    every = len(orders["ncmoe"])
    if build.has_cache and not (chosen.cache_mib and chosen.host.all()):
        out.append(setup_of(machine, "cmoe + cache", orders["ncmoe"], every, 1.0))
    if build.has_cache:
        for row in tuner_grid(every, space_of(build).tuner_shares):
            setup = setup_of(machine, "tuner", orders["ncmoe"], every, row.share, row.cpu_share)
            if setup is not None:
                out.append(dataclasses.replace(
                    setup, name=f"tuner {setup.cache_mib} MiB, share {row.cpu_share:g}"))
    named = {s.name: s for s in out if s is not None}
    return list(named.values())


def option_json(inv: Inventory, setup: Setup) -> dict:
    layers = [inv.moe_layers[i] for i in setup.host_layers]
    return {"name": setup.name, "host_layers": layers, "moe_cache_mib": setup.cache_mib,
            "slots": list(setup.slots), "n_cpu_moe": n_cpu_moe(layers),
            "cpu_share": setup.cpu_share, "pinned": setup.pinned,
            "tuner": setup.name.startswith("tuner ")}


def n_cpu_moe(layers: list[int]) -> int | None:
    """N where the host layers are exactly decoder layers 0 .. N - 1 (`-ncmoe N`)."""
    return (max(layers) + 1) if layers and layers == list(range(max(layers) + 1)) else None


def plan_of(inv: Inventory, spec: HardwareSpec, machine: Machine, chosen: Setup,
            opts: SolveOptions, options: list[dict], predicted: list[dict], folds: int,
            result: SearchResult, traffic: list[Traffic]) -> Plan:
    resident = np.repeat(~chosen.host[:, None], inv.experts_per_layer, axis=1).astype(np.int64)
    capacity = machine.per_device(machine.capacity).astype(np.int64)
    solver = {"name": "llamacpp", "objective": result.scores[result.best],
              "bound": None, "gap": None, "seconds": 0.0,
              "status": "cross-validated" if folds else "in sample", "seed": opts.seed,
              "time_limit": None, "steps": None,
              "objective_unit": "predicted decode tokens/s on held-out folds of the "
                                "calibration sequences (weighted over concurrency)"}
    home = np.repeat(machine.layer_device[:, None], inv.experts_per_layer, axis=1)
    plan = build_plan(inv, spec, home=home, resident_pages=resident, page_size=None,
                      budget_bytes=capacity, staging_bytes=np.zeros_like(capacity),
                      budget={"mode": "budget" if opts.budget is not None else "free_vram",
                              "value": opts.budget, "concurrency": list(opts.concurrency),
                              "weights": list(opts.weights) if opts.weights else None},
                      ep="contiguous", solver=solver, execution="cpu")
    plan.calibration = [calibration_json(t) for t in traffic]
    plan.engine = {**option_json(inv, chosen), "name": ENGINE, "source": SOURCE,
                   "layouts": [[repr(key), list(nb2)] for key, nb2 in machine.layout],
                   "alignment": machine.alignment, "folds": folds,
                   "tensor_split": list(machine.tensor_split) if machine.tensor_split else None,
                   "devices": machine.layer_device.tolist(),
                   "choice": choice_label(result, len(inv.moe_layers), spec.host_ram),
                   "options": options,
                   "search": [{"candidate": c.label, "held_out_tokens_per_s": v}
                              for c, v in result.scores.items()]}
    plan.predicted = predicted
    return plan


def choice_label(result: SearchResult, layers: int, host_ram: int) -> str:
    """How the choice reads: its host layers and cache, and whether its pinned host experts
    were checked against the spec's `host_ram` (0: not given, so not checked: search.py)."""
    best = result.best
    if best.count == 0:
        return "every expert on the GPUs (-ngl all), no host layer"
    host = ("every MoE layer on the host" if best.count == layers else
            f"{best.count} of {layers} MoE layers on the host (ranked by {best.rank})")
    cache = ("no cache" if best.share == 0 else
             f"{'all' if best.share == 1 else f'{best.share:g}'} of the VRAM they free as "
             "--moe-cache-mib" + (f", CPU share {best.cpu_share:g}" if best.cpu_share else ""))
    memory = ("mmap'd" if not best.pinned else "pinned (-lm none)" if host_ram else
              "pinned (-lm none; not checked against host RAM: the spec's host_ram is 0, not "
              "given)")
    return f"{host}, {cache}, {memory}"


def engine_setup(plan: Plan, name: str = "placement", option: dict | None = None) -> Setup:
    """The Setup a llama.cpp plan records (or one of its options)."""
    engine = option or plan.engine or {}
    host = np.isin(plan.moe_layers, engine.get("host_layers", []))
    return Setup(name, host, int(engine.get("moe_cache_mib", 0)),
                 tuple(engine.get("slots", ())), float(engine.get("cpu_share", 0.0)),
                 bool(engine.get("pinned", True)))


def plan_build(plan: Plan, override: Build | None = None) -> Build:
    """The build a llama.cpp plan is replayed and exported for: `override`
    (--llamacpp-version), else the one it records (a plan from before builds were recorded:
    the newest policy known, marked assumed)."""
    if override is not None:
        return override
    try:
        return build_from_json((plan.engine or {}).get("llamacpp_build"))
    except SolverError as exc:
        raise PlacerError(str(exc)) from None


def plan_machine(plan: Plan, build: Build | None = None,
                 spec: HardwareSpec | None = None) -> Machine:
    """The Machine a llama.cpp plan was solved for (from its experts, hardware and engine
    section), replaying `build`'s cache (plan_build); on `spec` (the plan's hardware with
    another KV reserve: `evaluate PLAN --flags '-c N'`), each card's VRAM for experts is its
    free VRAM there, within the plan's --budget where one was given (as machine_of)."""
    engine = plan.engine
    flops = plan.model.get("expert_flops")
    if plan.hardware.host is None or flops is None or not plan.model.get("hidden_size"):
        raise PlacerError("this llama.cpp plan lacks the host, expert FLOPs or hidden size "
                          "its replay needs: solve it again")
    capacity = tuple(int(c.budget_bytes) for c in plan.cards)
    if spec is not None:
        given = plan.budget.get("mode") == "budget"
        capacity = tuple(min(b, c.free_bytes) if given else c.free_bytes
                         for b, c in zip(capacity, spec.cards, strict=True))
    bandwidth, latency = card_links(plan.hardware)
    split = engine.get("tensor_split")
    return Machine(plan.matrix("bytes"), np.asarray(flops, dtype=np.float64),
                   tuple((key, tuple(nb2)) for key, nb2 in engine["layouts"]),
                   int(plan.model["top_k"]), capacity,
                   bandwidth, latency, int(engine["alignment"]),
                   llamacpp_host(host_of(plan.hardware, int(plan.model["hidden_size"]))),
                   tuple(engine.get("devices") or ()), tuple(split) if split else None,
                   pageable_of(plan.hardware), plan_build(plan, build).cache,
                   alloc_limits(plan.hardware), *spill_of(spec or plan.hardware))
