"""`placer bench --engine llamacpp`: the checks, the call and the table (the bench itself is
placer/serve/llamacpp/bench.py); `placer bench` dispatches here."""

from __future__ import annotations

import sys
from pathlib import Path

from rich.table import Table

from placer.commands.common import console as rich_console
from placer.commands.common import print_json, print_table, span
from placer.errors import PlacerError
from placer.progress import ItemsBar


def run_llamacpp_bench(placed: list[Path], model: Path | None, prompts: Path, *,
                       trials: int, max_new_tokens: int, max_prompt_tokens: int,
                       threads: int | None, options: str | None, server: str | None,
                       seed: int, spec_out: Path | None, calibrate_on: str | None,
                       json_out: bool, ignored: dict[str, bool]) -> None:
    """Check every input and output target, run the bench, print or write its report."""
    from placer.serve.llamacpp.bench import (
        LlamaBenchOptions,
        bench_llamacpp,
        bench_options,
        llamacpp_plan,
    )

    given = [flag for flag, set_ in ignored.items() if set_]
    if given:
        raise PlacerError(f"{given[0]} is for placer's own runtime; --engine llamacpp runs "
                          "llama.cpp on a plan's options")
    if len(placed) != 1:
        raise PlacerError("--engine llamacpp takes one plan.json (its options table holds "
                          "the alternatives)")
    if model is None or model.suffix.lower() != ".gguf" or not model.is_file():
        raise PlacerError(f"--model: --engine llamacpp runs a GGUF file, got {model}")
    if not prompts.is_file():
        raise PlacerError(f"--prompts: {prompts} is not a file")
    names = tuple(n.strip() for n in options.split(",") if n.strip()) if options else None
    opts = LlamaBenchOptions(trials=trials, max_new_tokens=max_new_tokens,
                             max_prompt_tokens=max_prompt_tokens, options=names, seed=seed,
                             server=server, **({"threads": threads} if threads else {}))
    plan = llamacpp_plan(placed[0])
    chosen = bench_options(plan, names)
    calibrate = None
    if spec_out is not None:
        from placer.serve.llamacpp.calibrate import calibration_options, check_spec_out

        check_spec_out(spec_out, [("the plan", placed[0]), ("the model", model),
                                  ("the prompts", prompts)])
        calibrate = calibration_options(chosen, calibrate_on)
    elif calibrate_on is not None:
        raise PlacerError("--calibrate-on goes with --spec-out")
    total = len(chosen) * (trials + 1)
    with ItemsBar("bench llama.cpp", total, enabled=not json_out and sys.stderr.isatty()) as bar:
        report = bench_llamacpp(placed[0], model, prompts, opts, bar)
    if spec_out is not None:
        from placer.serve.llamacpp.calibrate import calibrate_spec

        report["calibration"] = calibrate_spec(plan, report, calibrate, spec_out,
                                               [("the model", model)])
    if json_out:
        print_json(report)
    else:
        print_report(report)


def print_report(report: dict) -> None:
    """Two rows per option: measured and predicted decode tokens/s with their 95% intervals
    and ratios to the first option; then the cache's logged and replayed counts."""
    console = rich_console()
    table = Table(title=f"llama.cpp {report['build']} ({report['driver']}): "
                        f"{report['num_prompts']} prompts x {report['trials']} trials, "
                        f"up to {report['max_new_tokens']} new tokens (95% intervals; "
                        "ratios to the first option)")
    for col in ("option", "", "decode tok/s", "/ first", "pred / meas"):
        table.add_column(col, justify="left" if col == "option" else "right")
    for r in report["options"]:
        name = r["option"] + (f" (= {', '.join(r['same_as'])})" if r["same_as"] else "")
        table.add_row(name, "measured", _figure(r, "measured_tokens_per_s"),
                      _figure(r, "measured_ratio_to_first", "{:.3f}"),
                      f"{r['predicted_over_measured']:.3f}")
        table.add_row("", "predicted", _figure(r, "predicted_tokens_per_s"),
                      _figure(r, "predicted_ratio_to_first", "{:.3f}"), "", end_section=True)
    print_table(table, console)
    for r in report["options"]:
        console.print(f"{r['option']}: {r['flags']}", highlight=False)
        c = r["cache"]
        if c is not None:
            logged = "; ".join(f"{k}: {v[0]} hits, {v[1]} misses" for k, v in c["logged"].items())
            replayed = "; ".join(f"{k}: {v[0]} hits, {v[1]} misses"
                                 for k, v in c["replayed"].items())
            console.print(f"  cache logged   {logged or 'nothing'} (slots {c['slots_logged']})\n"
                          f"  cache replayed {replayed or 'nothing'} (slots "
                          f"{c['slots_replayed']}): "
                          + ("equal" if c["agrees"] else "DIFFERENT"), highlight=False)
    console.print(f"cache policy assumed: {report['cache_policy_assumed']}", highlight=False)
    for note in report["notes"]:
        console.print(f"note: {note}", highlight=False)
    cal = report.get("calibration")
    if cal:
        console.print(f"calibrated on {', '.join(cal['options'])}: {cal['fitted']}; spec "
                      f"written to {cal['spec_out']}", highlight=False)


def _figure(row: dict, key: str, fmt: str = "{:.2f}") -> str:
    return f"{fmt.format(row[key])} {span(row[f'{key}_ci95'], fmt)}"

