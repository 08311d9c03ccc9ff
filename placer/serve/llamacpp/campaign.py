"""`placer bench --engine llamacpp` as one call: every input and output checked before
llama.cpp starts, the bench run (bench.py), and with a spec to write the spec fitted to
the measured times (calibrate.py)."""

from __future__ import annotations

from pathlib import Path

from placer.errors import PlacerError
from placer.progress import ItemsBar
from placer.serve.llamacpp.bench import (
    LlamaBenchOptions,
    bench_llamacpp,
    bench_options,
    llamacpp_plan,
)
from placer.serve.llamacpp.calibrate import calibrate_spec, calibration_options, check_spec_out


def run_llamacpp_bench(placed: list[Path], model: Path | None, prompts: Path,
                       opts: LlamaBenchOptions, *, spec_out: Path | None,
                       calibrate_on: str | None, ignored: dict[str, bool],
                       progress: bool) -> dict:
    """Check every input and output target (`ignored`: placer's own runtime's flags, each
    given or not), run the bench, calibrate the spec where --spec-out asks: the report."""
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
    plan = llamacpp_plan(placed[0])
    chosen = bench_options(plan, opts.options)
    calibrate = None
    if spec_out is not None:
        check_spec_out(spec_out, [("the plan", placed[0]), ("the model", model),
                                  ("the prompts", prompts)])
        calibrate = calibration_options(chosen, calibrate_on)
    elif calibrate_on is not None:
        raise PlacerError("--calibrate-on goes with --spec-out")
    total = len(chosen) * (opts.trials + 1)
    with ItemsBar("bench llama.cpp", total, enabled=progress) as bar:
        report = bench_llamacpp(placed[0], model, prompts, opts, bar)
    if spec_out is not None:
        report["calibration"] = calibrate_spec(plan, report, calibrate, spec_out,
                                               [("the model", model)])
    return report
