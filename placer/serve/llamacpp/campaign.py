"""`placer bench --engine llamacpp` as one call: every input and output checked before
llama.cpp starts, the bench run (bench.py), and with a spec to write the spec fitted to
the measured times (calibrate.py)."""

from __future__ import annotations

from pathlib import Path

from placer.errors import PlacerError
from placer.serve.llamacpp.bench import (
    LlamaBenchOptions,
    bench_llamacpp,
    bench_options,
    llamacpp_plan,
    prepare,
    progress,
)
from placer.serve.llamacpp.calibrate import calibrate_spec, calibration_options, check_spec_out


def run_llamacpp_bench(placed: list[Path], model: Path | None, prompts: Path,
                       opts: LlamaBenchOptions, *, spec_out: Path | None,
                       calibrate_on: str | None, ignored: dict[str, bool],
                       bar: bool, lines: bool) -> dict:
    """Check every input and output target (`ignored`: placer's own runtime's flags, each
    given or not), the GGUF, the device and the options (bench.prepare), run the bench with
    a progress bar (`bar`) or lines on stderr (`lines`), calibrate the spec where --spec-out
    asks: the report."""
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
    calibrate = None
    if spec_out is not None:
        check_spec_out(spec_out, [("the plan", placed[0]), ("the model", model),
                                  ("the prompts", prompts)])
        calibrate = calibration_options(
            bench_options(llamacpp_plan(placed[0]), opts.options), calibrate_on)
    elif calibrate_on is not None:
        raise PlacerError("--calibrate-on goes with --spec-out")
    prepared = prepare(placed[0], model, opts)
    with progress(prepared, bar, lines) as shown:
        report = bench_llamacpp(prepared, prompts, shown)
    if spec_out is not None:
        report["calibration"] = calibrate_spec(prepared.plan, report, calibrate, spec_out,
                                               [("the model", model)], prepared.device)
    return report
