"""`placer bench --engine llamacpp`: a llama.cpp plan's setup and its alternatives run by real
llama.cpp on this box, measured beside what placer predicts for the same tokens.

The options are the rows of the plan's options table (`engine.options`, placer/plan/
llamacpp.py: the choice, the best host set without a cache, `-ncmoe N` at the same VRAM, a
cached alternative, and the tuner's pick where the table has one), those with the same
setup run once. Every prompt is tokenized by the GGUF and continued greedily once; those
tokens are then fed to every option in every trial (teacher forced), so all options serve
the same tokens. Per option, one recording pass reads the routing of every token and the
cache's log; then the trials, interleaved (trial t runs every option, in an order rotated
by t), each a fresh llama.cpp context timing every decode token (binding.py). The first
`warmup` sequences of each pass are fed first and not counted (Vulkan compiles its
pipelines on first use); the replay includes them, as the cache saw them.

Measured: decode tokens/s of each trial (decode tokens over their seconds), the geometric
mean over trials with its 95% Student's t interval on the log time per token, and each
option's ratio to the first, trial by trial (placer.serve.bench_predict: the same
machinery as `placer bench`). Predicted: the recorded routing replayed (predict.py), with
a bootstrap interval over prompts, and the paired ratio to the first option. The cache's
logged hits and misses are set beside the replay's: a mismatch means the build runs another
policy than the one placer assumed (b11669's LRU), and the report says so.

Before the first pass (`prepare`): the GGUF must be the plan's (its fingerprint, as `placer
export llamacpp` checks it: placer.exporters.llamacpp.check_model); the device is named and
checked against the spec's card (device.py); each option's flags are checked against the
build the bench drives (b11669's flags as export prints them; with --server, that server's
--help): the options it cannot run are named and left out, the others run.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from placer.errors import PlacerError
from placer.exporters.llamacpp import check_model, engine_args
from placer.plan.estimates import estimated_json, step_range_field
from placer.plan.llamacpp import n_cpu_moe
from placer.plan.placement import Plan, read_plan
from placer.progress import NO_BAR, ItemLines, ItemsBar
from placer.serve.bench_predict import MIN_TRIALS, ratio_to, t_interval
from placer.serve.llamacpp.binding import BenchEngine, BindingDriver, Pass
from placer.serve.llamacpp.device import (
    Device,
    binding_device,
    check_device,
    default_prompt_tokens,
)
from placer.serve.llamacpp.predict import (
    BENCH_BUILD,
    POLICY,
    bench_machine,
    cost_terms,
    logs_agree,
    option_setup,
    predict_decode,
    replayed_log,
    ubatches_of,
)
from solvers.llamacpp.builds import Build, default_build
from traces.collecting.corpora import open_corpus
from traces.errors import TraceError


@dataclass(frozen=True)
class LlamaBenchOptions:
    trials: int = 3
    max_new_tokens: int = 32
    max_prompt_tokens: int | None = None  # None: the device's (device.default_prompt_tokens)
    threads: int = max(1, min(8, os.cpu_count() or 1))
    options: tuple[str, ...] | None = None
    warmup: int = 1
    seed: int = 0
    server: str | None = None
    allow_other_device: bool = False


@dataclass(frozen=True)
class BenchOption:
    """A row of the plan's options table: host_layers are decoder layers; cpu_share and
    pinned as the row says (--moe-cache-cpu-share, -lm none); same_as names the other rows
    with this very setup."""

    name: str
    host_layers: tuple[int, ...]
    cache_mib: int
    n_cpu_moe: int | None
    same_as: tuple[str, ...] = ()
    cpu_share: float = 0.0
    pinned: bool = True


@dataclass(frozen=True)
class Prepared:
    """Everything checked before the first pass (`prepare`): the options to run and those
    left out (each with why), the device (None: the user's --server, not named), why it is
    not the spec's card (None: it is or may be), the options with the prompt length set, and
    the driver of the passes."""

    plan_path: Path
    gguf: Path
    plan: Plan
    options: list[BenchOption]
    skipped: list[str]
    device: Device | None
    other_device: str | None
    opts: LlamaBenchOptions
    driver: object


def llamacpp_plan(path: Path) -> Plan:
    """The plan at `path`, refused unless solved with `--engine llamacpp`."""
    plan = read_plan(path)
    engine = plan.engine or {}
    if engine.get("name") != "llamacpp" or not isinstance(engine.get("options"), list):
        raise PlacerError(f"{path}: engine: expected a plan of `placer solve --engine "
                          "llamacpp` (its options table is what the bench runs)")
    return plan


def bench_options(plan: Plan, names: tuple[str, ...] | None) -> list[BenchOption]:
    """The options table's rows (only `names`, in their order, when given), one per setup.
    Two references are added to the table's rows where they are not in it: "cmoe" (every
    MoE layer's experts on the host, no cache: `-cmoe`, the least VRAM) and "cmoe + half
    cache" (every layer on the host, half the table's largest cache), so the cost of a host
    layer and of the cache are each seen at more than one point."""
    rows = {str(r["name"]): r for r in plan.engine["options"]}
    every = [int(i) for i in plan.moe_layers]
    largest = max((int(r.get("moe_cache_mib") or 0) for r in rows.values()), default=0)
    for name, mib in (("cmoe", 0), ("cmoe + half cache", largest // 2)):
        if name not in rows and (name == "cmoe" or mib > 0):
            rows[name] = {"name": name, "host_layers": every, "moe_cache_mib": mib,
                          "n_cpu_moe": n_cpu_moe(every)}
    if names is not None:
        unknown = [n for n in names if n not in rows]
        if unknown:
            raise PlacerError(f"--options: the plan has no option {unknown[0]!r} (it has "
                              f"{', '.join(repr(n) for n in rows)})")
    picked: dict[tuple, BenchOption] = {}
    for name in names or tuple(rows):
        r = rows[name]
        key = (tuple(int(i) for i in r["host_layers"]), int(r.get("moe_cache_mib") or 0),
               float(r.get("cpu_share") or 0.0), bool(r.get("pinned", True)))
        if key in picked:
            first = picked[key]
            picked[key] = dataclasses.replace(first, same_as=(*first.same_as, name))
        else:
            picked[key] = BenchOption(name, key[0], key[1], r.get("n_cpu_moe"),
                                      cpu_share=key[2], pinned=key[3])
    return list(picked.values())


def option_flags(plan: Plan, option: BenchOption, build: Build = BENCH_BUILD) -> str:
    """The llama-server flags of an option (as `placer export llamacpp` prints them for
    `build`, by default the one the bench drives); PlacerError naming a flag it lacks."""
    row = {"name": option.name, "host_layers": list(option.host_layers),
           "moe_cache_mib": option.cache_mib, "n_cpu_moe": option.n_cpu_moe,
           "cpu_share": option.cpu_share, "pinned": option.pinned}
    return " ".join(engine_args(plan, build, row))


def runnable(plan: Plan, options: list[BenchOption], driver) -> tuple[list[BenchOption],
                                                                        list[str]]:
    """(the options the driven build can run, why each other one cannot): with --server
    each flag in that server's --help (ServerDriver.check; the flags as export prints them
    for the newest build), then each option's flags as export prints them for b11669
    (engine_args refuses a flag that build lacks: the recording pass and the replay are
    b11669's)."""
    ok, skipped = [], []
    for option in options:
        try:
            if hasattr(driver, "check"):
                driver.check(shlex.split(option_flags(plan, option, default_build())))
            option_flags(plan, option)
        except PlacerError as exc:
            reason = str(exc).split(": solve for")[0].split(": run options it has")[0]
            skipped.append(f"option {option.name!r} not run: "
                           f"{reason.removeprefix(f'option {option.name!r} ')}")
            continue
        ok.append(option)
    if not ok:
        raise PlacerError(f"--options: this llama.cpp can run none of them ({'; '.join(skipped)})")
    return ok, skipped


def prepare(plan_path: Path, gguf: Path, opts: LlamaBenchOptions) -> Prepared:
    """Every check before the first pass (module docstring), fast: no model is loaded. The
    GGUF's fingerprint, then the device, then each option's flags."""
    check_bench(opts)
    plan = llamacpp_plan(plan_path)
    check_model(plan, gguf)
    chosen = bench_options(plan, opts.options)
    device = None if opts.server is not None else binding_device()
    other = check_device(plan, device, opts.allow_other_device)
    prompt = opts.max_prompt_tokens or default_prompt_tokens(device)
    opts = dataclasses.replace(opts, max_prompt_tokens=prompt)
    engine = BenchEngine(str(gguf), int(plan.model["top_k"]), opts.threads,
                         prompt + opts.max_new_tokens + 8, prompt + 8)
    driver = BindingDriver(engine)
    if opts.server is not None:
        from placer.serve.llamacpp.server import ServerDriver

        def flags_of(host_layers: tuple[int, ...], cache_mib: int) -> str:
            return option_flags(plan, BenchOption("", host_layers, cache_mib,
                                                  n_cpu_moe(list(host_layers))))

        driver = ServerDriver.from_command(opts.server, gguf, engine, flags_of)
    options, skipped = runnable(plan, chosen, driver)
    return Prepared(plan_path, gguf, plan, options, skipped, device, other, opts, driver)


def progress(prepared: Prepared, bar: bool, lines: bool) -> ItemsBar | ItemLines:
    """A bar on a terminal (`bar`), lines where stderr is not one (`lines`), else nothing:
    one item per pass."""
    total = len(prepared.options) * (prepared.opts.trials + 1)
    if bar:
        return ItemsBar("bench llama.cpp", total, enabled=True)
    return ItemLines("bench llama.cpp", total) if lines else NO_BAR


def read_documents(path: Path) -> list:
    try:
        docs = list(open_corpus(path).documents())
    except TraceError as exc:
        raise PlacerError(f"--prompts: {exc}") from None
    if not docs:
        raise PlacerError(f"--prompts: {path} holds no prompt")
    return docs


def check_bench(opts: LlamaBenchOptions) -> None:
    prompt = opts.max_prompt_tokens
    if opts.trials < 1 or opts.max_new_tokens < 2 or (prompt is not None and prompt < 1) or (
            opts.threads < 1 or opts.warmup < 0):
        raise PlacerError("--trials, --threads and --max-prompt-tokens must be >= 1, "
                          "--max-new-tokens >= 2")


def bench_llamacpp(prepared: Prepared, prompts: Path, bar: ItemsBar | ItemLines = NO_BAR
                   ) -> dict:
    """The report (module docstring) of what `prepare` checked; the passes run through the
    bundled binding, or through `opts.server` (server.py)."""
    plan, options, opts, driver = (prepared.plan, prepared.options, prepared.opts,
                                   prepared.driver)
    docs = read_documents(prompts)
    split = plan.engine.get("tensor_split")
    split = tuple(float(x) for x in split) if split else None
    bar.show("tokenizing and generating")
    sequences = driver.sequences(docs, opts.max_prompt_tokens, opts.max_new_tokens)
    if all(len(t) == p for p, t in sequences):
        raise PlacerError("every prompt ended at once (an end token): no decode step to time")
    fed = sequences[:opts.warmup] + sequences
    recorded = {}
    for option in options:
        bar.show(f"{option.name}: recording routing")
        recorded[option.name] = driver.run(option.host_layers, option.cache_mib, split, fed,
                                           True)
        bar.advance()
    timed: dict[str, list[Pass]] = {o.name: [] for o in options}
    for trial in range(opts.trials):
        for i in range(len(options)):
            option = options[(i + trial) % len(options)]
            bar.show(f"{option.name}: trial {trial + 1}")
            timed[option.name].append(driver.run(option.host_layers, option.cache_mib, split,
                                                 fed, False))
            bar.advance()
    rows = [option_row(plan, o, recorded[o.name], timed[o.name], len(sequences), opts)
            for o in options]
    for row in rows:
        row.update(ratio_to(row, rows[0]))
    for row in rows:
        del row["_predicted"]
        if prepared.other_device:
            row["predicted_over_measured"] = None
    return report_of(prepared, prompts, rows, sequences)


def option_row(plan: Plan, option: BenchOption, recorded: Pass, timed: list[Pass],
               num_prompts: int, opts: LlamaBenchOptions) -> dict:
    """One option's row: measured over the trials, predicted on its recorded routing, the
    cache's log beside the replay."""
    per_trial = []
    for p in timed:
        seconds = [s for seq in p.decode_s[opts.warmup:] for s in seq]
        per_trial.append(len(seconds) / sum(seconds))
    measured, measured_ci = t_interval(per_trial)
    machine = bench_machine(plan, recorded.alignment)
    host = np.isin(plan.moe_layers, option.host_layers)
    setup = option_setup(machine, option.name, host, option.cache_mib)
    ub = ubatches_of(recorded.routing, opts.warmup)
    base = plan.hardware.base_step_s(1)
    predicted = predict_decode(machine, setup, ub, num_prompts, base, opts.seed)
    terms = cost_terms(machine, setup, ub)
    cache = None
    if option.cache_mib:
        replayed = replayed_log(machine, setup, ub)
        cache = {"slots_logged": [s for _, _, s in recorded.slots],
                 "slots_replayed": list(setup.slots), "logged": recorded.totals,
                 "replayed": replayed, "timed_logs_equal": all(
                     p.totals == recorded.totals for p in timed),
                 "agrees": logs_agree(recorded.totals, replayed)}
    return {"option": option.name, "same_as": list(option.same_as),
            "host_layers": list(option.host_layers), "moe_cache_mib": option.cache_mib,
            "flags": option_flags(plan, option),
            "measured_tokens_per_s": measured, "measured_tokens_per_s_ci95": measured_ci,
            "measured_tokens_per_s_trials": per_trial,
            "measured_ms_per_token": 1e3 / measured,
            "predicted_tokens_per_s": predicted["tokens_per_s"],
            "predicted_tokens_per_s_ci95": predicted["tokens_per_s_ci95"],
            "predicted_stall_ms_per_step": predicted["stall_ms_per_step"],
            "predicted_base_step_ms": predicted["base_step_ms"],
            **{f"predicted_{k}": v for k, v in step_range_field(
                plan.hardware, 1, predicted["stall_ms_per_step"]).items()},
            "predicted_over_measured": predicted["tokens_per_s"] / measured,
            "decode_tokens": ub.decode_steps, "cache": cache, "model_terms": terms,
            "_predicted": predicted["estimate"]}


def report_of(prepared: Prepared, prompts: Path, rows: list[dict], sequences: list) -> dict:
    opts, driver = prepared.opts, prepared.driver
    notes = list(prepared.skipped)
    if prepared.other_device:
        notes.append(f"{prepared.other_device}: the options are compared by their ratios to "
                     "the first; no prediction error is reported (--allow-other-device)")
    elif prepared.device is None:
        notes.append("the device --server runs on is not named: placer does not know whether "
                     "it is the spec's card")
    if opts.trials < MIN_TRIALS:
        notes.append(f"{opts.trials} trial{'s' if opts.trials > 1 else ''}: too few for an "
                     f"interval of the measured figures (give --trials {MIN_TRIALS} or more)")
    if len(sequences) < 5:
        notes.append(f"{len(sequences)} prompts: too few for an interval of the predicted "
                     "figures (5 or more)")
    cached = [r for r in rows if r["cache"] is not None]
    disagree = [r["option"] for r in cached if not r["cache"]["agrees"]]
    if disagree:
        notes.append(f"the cache's logged hits/misses differ from placer's replay for "
                     f"{', '.join(disagree)}: this llama.cpp ({driver.source}) runs another "
                     f"cache policy than the one assumed, {POLICY}")
    return {"engine": "llamacpp", "driver": driver.name, "build": driver.build,
            "source": driver.source, "cache_policy_assumed": POLICY,
            "cache_policy_agrees": not disagree if cached else None,
            "device": prepared.device.to_json() if prepared.device else None,
            "other_device": prepared.other_device,
            "skipped": prepared.skipped,
            "plan": str(prepared.plan_path), "model": str(prepared.gguf),
            "prompts": str(prompts), "num_prompts": len(sequences), "trials": opts.trials,
            "max_new_tokens": opts.max_new_tokens, "max_prompt_tokens": opts.max_prompt_tokens,
            "prompt_tokens": sequences[0][0], "warmup": opts.warmup, "notes": notes,
            "options": rows, "estimated": estimated_json(prepared.plan.hardware)}
