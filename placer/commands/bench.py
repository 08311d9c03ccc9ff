"""`placer bench`: serve placed directories on this box, measure them, and set each beside
what `placer evaluate`'s cost model predicts for the same tokens."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from placer.commands.common import command, parse_list, print_json
from placer.commands.placed_dir import MODEL_HELP, check_placed, source_model
from placer.errors import PlacerError
from placer.files import check_outputs_apart, check_target
from placer.hardware.devices import check_device
from placer.progress import ItemsBar
from placer.report.serving import print_bench


def register(app: typer.Typer) -> None:
    @command(app, "bench")
    def bench_cmd(
        placed: Annotated[list[Path], typer.Argument(
            help="Placed directories to compare (the first is the reference of the ratios), "
                 "e.g. a plan and its --solver layer twin at the same budget; with --engine "
                 "llamacpp, one plan.json of `solve --engine llamacpp`.")],
        prompts: Annotated[Path, typer.Option(
            help="Prompts: .txt (blank-line-separated blocks), .jsonl (text, messages or "
                 "turns: the first turn) or .parquet; at least the largest concurrency.")],
        model: Annotated[Path | None, typer.Option(help=MODEL_HELP.replace(
            "it was", "they were").replace("the manifest", "the first manifest"))] = None,
        concurrency: Annotated[str, typer.Option(
            help="Requests kept in flight, e.g. 1,8.")] = "1,8",
        trials: Annotated[int, typer.Option(help="Runs of every prompt per arm and "
                                                 "concurrency.")] = 3,
        max_new_tokens: Annotated[int, typer.Option(
            help="Tokens generated per prompt (greedy).")] = 64,
        device: Annotated[str, typer.Option(
            help="torch device: auto, cpu, cuda, cuda:N.")] = "auto",
        cache_slots: Annotated[int | None, typer.Option(
            help="Cache slots per card instead of each manifest's (default: its cards' slots per "
                 "layer and policy as placed); the prediction replays the same cache.")] = None,
        seed: Annotated[int, typer.Option(help="Seed of the bootstrap.")] = 0,
        spec_out: Annotated[Path | None, typer.Option(
            help="Write the first arm's hardware spec with the base step this run measured "
                 "(\\[decode] base_step_ms: its decode step less the predicted stall, by "
                 "concurrency) to this .toml.")] = None,
        plot: Annotated[Path | None, typer.Option(
            help="Write a PNG of measured and predicted tokens/s per arm (a .png path).")
        ] = None,
        engine: Annotated[str, typer.Option(
            help="placer (placer's runtime on placed directories) or llamacpp (real llama.cpp "
                 "on a llama.cpp plan's options: --model the GGUF).")] = "placer",
        options: Annotated[str | None, typer.Option(
            help="--engine llamacpp: the options of the plan's table to run, e.g. "
                 "'chosen,ncmoe' (default: every row).")] = None,
        server: Annotated[str | None, typer.Option(
            help="--engine llamacpp: run your own llama-server instead of the bundled "
                 "llama.cpp, e.g. 'llama-server -m model.gguf' (placer adds each option's "
                 "flags and --host 127.0.0.1 --port, and stops it after).")] = None,
        max_prompt_tokens: Annotated[int | None, typer.Option(
            help="--engine llamacpp: prompts cut to this many tokens (default: what the "
                 "device runs: 256 on a GPU, 4 on a software Vulkan device, where b11669 "
                 "was seen to crash with 32).")] = None,
        threads: Annotated[int | None, typer.Option(
            help="--engine llamacpp: CPU threads of llama.cpp (default: up to 8).")] = None,
        calibrate_on: Annotated[str | None, typer.Option(
            help="--engine llamacpp --spec-out: the (at most 3) options whose measured "
                 "times the spec is fitted to (default: 3 chosen to differ most).")] = None,
        allow_other_device: Annotated[bool, typer.Option(
            help="--engine llamacpp: run on a device that is not the spec's card (then the "
                 "options are compared by their ratios, with no prediction error).")
        ] = False,
        json_out: Annotated[bool, typer.Option("--json", help=(
            "Print the report as JSON: {\"arms\": [{placed, concurrency, "
            "measured_tokens_per_s, measured_tokens_per_s_ci95, predicted_tokens_per_s, "
            "predicted_tokens_per_s_ci95, ttft_ms, ...}]}."))] = False,
    ) -> None:
        """The paired campaign on this box: each PLACED directory serves the same prompts
        greedily (continuous batching, as `placer serve`) at each concurrency, --trials
        times. Measured: decode tokens/s over the steps in which every sequence decodes (95%
        interval over trials, of the log time per token: positive; none under 3 trials),
        time to first token, and the decode step (printed with the base step it implies;
        --spec-out writes that into a spec). The routing those steps served is replayed
        through `placer evaluate`'s cost model (plan's hardware spec, base step included),
        so measured and predicted see the same tokens (95% interval over prompts). Each
        arm's ratio to the first arm is shown for both."""
        if engine == "llamacpp":
            from placer.report.llamacpp import print_llamacpp_bench
            from placer.serve.llamacpp.bench import LlamaBenchOptions
            from placer.serve.llamacpp.campaign import run_llamacpp_bench

            names = tuple(n.strip() for n in options.split(",") if n.strip()) if options \
                else None
            report = run_llamacpp_bench(
                placed, model, prompts, LlamaBenchOptions(
                    trials=trials, max_new_tokens=max_new_tokens,
                    max_prompt_tokens=max_prompt_tokens, options=names, seed=seed,
                    server=server, allow_other_device=allow_other_device,
                    **({"threads": threads} if threads else {})),
                spec_out=spec_out, calibrate_on=calibrate_on,
                ignored={"--concurrency": concurrency != "1,8", "--device": device != "auto",
                         "--cache-slots": cache_slots is not None, "--plot": plot is not None},
                bar=not json_out and sys.stderr.isatty(), lines=not sys.stderr.isatty())
            if json_out:
                print_json(report)
            else:
                print_llamacpp_bench(report)
            return
        if engine != "placer":
            raise PlacerError(f"--engine: expected placer or llamacpp, got {engine!r}")
        for flag, value in (("--options", options), ("--server", server),
                            ("--threads", threads), ("--calibrate-on", calibrate_on),
                            ("--max-prompt-tokens", max_prompt_tokens),
                            ("--allow-other-device", allow_other_device or None)):
            if value is not None:
                raise PlacerError(f"{flag} goes with --engine llamacpp")
        from placer.serve.bench import BenchOptions, bench, write_measured_spec
        from placer.serve.bench_plot import plot_bench

        opts = BenchOptions(concurrency=tuple(parse_list(concurrency, int, "--concurrency")),
                            trials=trials, max_new_tokens=max_new_tokens, device=device,
                            cache_slots=cache_slots, seed=seed)
        check_bench_options(placed, prompts, plot, cache_slots, device)
        model = source_model(placed[0], model)
        if spec_out is not None and spec_out.suffix != ".toml":
            raise PlacerError(f"--spec-out writes a TOML spec: give a .toml path, not {spec_out}")
        check_outputs(placed, model, prompts, spec_out, plot)
        total = len(placed) * len(opts.concurrency) * trials
        with ItemsBar("bench", total, enabled=not json_out and sys.stderr.isatty()) as bar:
            report = bench(placed, model, prompts, opts, bar)
        if plot is not None:
            report["plot"] = str(plot_bench(report, plot))
        if spec_out is not None:
            write_measured_spec(report, placed[0], model, spec_out)
        if json_out:
            print_json(report)
        else:
            print_bench(report)


def check_bench_options(placed: list[Path], prompts: Path, plot: Path | None,
                        cache_slots: int | None, device: str) -> None:
    """One line for a value `placer bench` cannot use, before any model loads."""
    for path in placed:
        check_placed(path)
    if not prompts.is_file():
        raise PlacerError(f"--prompts: {prompts} is not a file")
    if plot is not None and plot.suffix.lower() != ".png":
        raise PlacerError(f"--plot writes a PNG: give a path ending in .png, not {plot}")
    check_device(device)


def check_outputs(placed: list[Path], model: Path, prompts: Path, spec_out: Path | None,
                  plot: Path | None) -> None:
    """Before anything is measured: each output apart from every input (the placed
    directories, the checkpoint, the prompts) and from the other output, and writable."""
    outputs = [("--spec-out", spec_out), ("--plot", plot)]
    inputs = [("the checkpoint", model), ("--prompts", prompts),
              *(("the placed directory", p) for p in placed)]
    check_outputs_apart(outputs, inputs)
    for what, path in outputs:
        if path is not None:
            check_target(path, inputs, what=what)
