"""`placer bench`: serve placed directories on this box, measure them, and set each beside
what `placer evaluate`'s cost model predicts for the same tokens."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from placer.checkpoint.step import monotone
from placer.commands.common import command, parse_list, print_json, print_table, span
from placer.commands.common import console as rich_console
from placer.commands.placed_dir import MODEL_HELP, check_placed, source_model
from placer.errors import PlacerError
from placer.files import check_outputs_apart, check_target, write_text_atomic
from placer.hardware.devices import check_device
from placer.progress import ItemsBar


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
        max_prompt_tokens: Annotated[int, typer.Option(
            help="--engine llamacpp: prompts cut to this many tokens.")] = 256,
        threads: Annotated[int | None, typer.Option(
            help="--engine llamacpp: CPU threads of llama.cpp (default: up to 8).")] = None,
        calibrate_on: Annotated[str | None, typer.Option(
            help="--engine llamacpp --spec-out: the (at most 3) options whose measured "
                 "times the spec is fitted to (default: 3 chosen to differ most).")] = None,
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
            from placer.commands.bench_llamacpp import run_llamacpp_bench

            run_llamacpp_bench(
                placed, model, prompts, trials=trials, max_new_tokens=max_new_tokens,
                max_prompt_tokens=max_prompt_tokens, threads=threads, options=options,
                server=server, seed=seed, spec_out=spec_out, calibrate_on=calibrate_on,
                json_out=json_out, ignored={"--concurrency": concurrency != "1,8",
                                            "--device": device != "auto",
                                            "--cache-slots": cache_slots is not None,
                                            "--plot": plot is not None})
            return
        if engine != "placer":
            raise PlacerError(f"--engine: expected placer or llamacpp, got {engine!r}")
        for flag, value in (("--options", options), ("--server", server),
                            ("--threads", threads), ("--calibrate-on", calibrate_on)):
            if value is not None:
                raise PlacerError(f"{flag} goes with --engine llamacpp")
        from placer.serve.bench import BenchOptions, bench
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
            print_report(report)


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


def print_report(report: dict) -> None:
    """Two rows per arm and concurrency: measured and predicted decode tokens/s, each with
    its 95% interval, and each as a ratio to the first arm; arms by directory name (see
    --json for the paths)."""
    from placer.serve.bench_plot import labels

    console = rich_console()
    table = Table(title=f"{report['num_prompts']} prompts x "
                        f"{report['trials']} trials, {report['max_new_tokens']} new tokens "
                        f"(95% intervals; ratios to the first arm)")
    for col in ("arm", "C", "", "decode tok/s", "/ first arm", "TTFT ms", "steps"):
        table.add_column(col, justify="left" if col == "arm" else "right")
    names = labels([r["placed"] for r in report["arms"]])
    for name, r in zip(names, report["arms"], strict=True):
        for kind in ("measured", "predicted"):
            first_row = kind == "measured"
            table.add_row(name if first_row else "", str(r["concurrency"]) if first_row else "",
                          kind, figure(r, f"{kind}_tokens_per_s"),
                          figure(r, f"{kind}_ratio_to_first", "{:.3f}"),
                          f"{r['ttft_ms']:.1f}" if first_row else "",
                          str(r["decode_steps"]) if first_row else "", end_section=not first_row)
    print_table(table, console)
    bases = sorted({(r["concurrency"], r["predicted_base_step_ms"]) for r in report["arms"]})
    console.print("predicted with each plan's hardware spec, base step "
                  + ", ".join(f"{ms:.2f} ms at C={c}" for c, ms in bases), highlight=False)
    first = report["arms"][0]["placed"]
    measured = [r for r in report["arms"] if r["placed"] == first]
    console.print(f"measured on this box ({first}): decode step "
                  + ", ".join(f"{r['measured_step_ms']:.2f} ms at C={r['concurrency']}"
                              for r in measured)
                  + "; less the predicted stall, base step "
                  + ", ".join(f"{r['measured_base_step_ms']:.2f} ms" for r in measured)
                  + (f": written to {report['spec_out']}" if "spec_out" in report else
                     ": put it in the spec's \\[decode] base_step_ms (or run with --spec-out)"),
                  highlight=False)
    for note in report.get("notes", []):
        console.print(f"note: {note}", highlight=False)
    for v in report["verdicts"]:
        for message in v["messages"]:
            console.print(message, style="bold red", highlight=False)
    if "plot" in report:
        console.print(f"plot written to {report['plot']}")


def write_measured_spec(report: dict, placed: Path, model: Path, out: Path) -> None:
    """The first arm's plan's hardware spec with the base step its run measured, at `out`;
    the report records where."""
    from placer.hardware.spec_toml import spec_toml
    from placer.plan.placement import read_plan

    spec = read_plan(placed / "manifest.json").hardware
    rows = [r for r in report["arms"] if r["placed"] == str(placed)]
    steps = monotone(sorted((r["concurrency"], float(f"{r['measured_base_step_ms']:.4g}"))
                            for r in rows))
    text = spec_toml(dataclasses.replace(spec, base_step_ms=steps),
                     f"measured by placer bench {placed} (decode step less predicted stall)")
    write_text_atomic(text, out, [("the checkpoint", model)], what="--spec-out")
    report["spec_out"] = str(out)


def figure(row: dict, key: str, fmt: str = "{:.2f}") -> str:
    """A figure and its 95% interval: "value [low, high]"."""
    return f"{fmt.format(row[key])} {span(row[f'{key}_ci95'], fmt)}"
