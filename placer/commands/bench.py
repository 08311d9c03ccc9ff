"""`placer bench`: serve placed directories on this box, measure them, and set each beside
what `placer evaluate`'s cost model predicts for the same tokens."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from placer.commands.common import command, parse_list, print_json, span
from placer.commands.common import console as rich_console
from placer.commands.run import check_cache_slots, check_placed
from placer.errors import PlacerError
from placer.files import check_apart
from placer.hardware.devices import check_device
from placer.progress import ItemsBar


def register(app: typer.Typer) -> None:
    @command(app, "bench")
    def bench_cmd(
        placed: Annotated[list[Path], typer.Argument(
            help="Placed directories to compare (the first is the reference of the ratios), "
                 "e.g. a plan and its --solver layer twin at the same budget.")],
        model: Annotated[Path, typer.Option(
            help="The checkpoint directory they were placed from.")],
        prompts: Annotated[Path, typer.Option(
            help="Prompts: .txt (blank-line-separated blocks), .jsonl (text, messages or "
                 "turns: the first turn) or .parquet; at least the largest concurrency.")],
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
        plot: Annotated[Path | None, typer.Option(
            help="Write a PNG of measured and predicted tokens/s per arm (a .png path).")
        ] = None,
        json_out: Annotated[bool, typer.Option("--json", help=(
            "Print the report as JSON: {\"arms\": [{placed, concurrency, "
            "measured_tokens_per_s, measured_tokens_per_s_ci95, predicted_tokens_per_s, "
            "predicted_tokens_per_s_ci95, ttft_ms, ...}]}."))] = False,
    ) -> None:
        """The paired campaign on this box: each PLACED directory serves the same prompts
        greedily (continuous batching, as `placer serve`) at each concurrency, --trials
        times. Measured: decode tokens/s over the steps in which every sequence decodes (95%
        interval over trials) and time to first token. The routing those steps served is
        replayed through `placer evaluate`'s cost model (plan's hardware spec, base step
        included), so measured and predicted see the same tokens (95% interval over
        prompts). Each arm's ratio to the first arm is shown for both."""
        from placer.serve.bench import BenchOptions, bench
        from placer.serve.bench_plot import plot_bench

        opts = BenchOptions(concurrency=tuple(parse_list(concurrency, int, "--concurrency")),
                            trials=trials, max_new_tokens=max_new_tokens, device=device,
                            cache_slots=cache_slots, seed=seed)
        check_bench_options(placed, prompts, plot, cache_slots, device)
        total = len(placed) * len(opts.concurrency) * trials
        with ItemsBar("bench", total, enabled=not json_out and sys.stderr.isatty()) as bar:
            report = bench(placed, model, prompts, opts, bar)
        if plot is not None:
            report["plot"] = str(plot_bench(report, plot))
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
    if plot is not None:
        check_apart(plot, what="--plot")
    check_cache_slots(cache_slots)
    check_device(device)


def print_report(report: dict) -> None:
    """One row per arm and concurrency: measured beside predicted tokens/s, each with its
    95% interval, and each as a ratio to the first arm."""
    console = rich_console()
    table = Table(title=f"decode tokens/s, {report['num_prompts']} prompts x "
                        f"{report['trials']} trials, {report['max_new_tokens']} new tokens "
                        f"(95% intervals; ratios to the first arm)")
    for col in ("placed", "C", "measured tok/s", "predicted tok/s", "measured / first",
                "predicted / first", "TTFT ms", "steps"):
        table.add_column(col, justify="left" if col == "placed" else "right")
    for r in report["arms"]:
        table.add_row(r["placed"], str(r["concurrency"]),
                      figure(r, "measured_tokens_per_s"), figure(r, "predicted_tokens_per_s"),
                      figure(r, "measured_ratio_to_first", "{:.3f}"),
                      figure(r, "predicted_ratio_to_first", "{:.3f}"),
                      f"{r['ttft_ms']:.1f}", str(r["decode_steps"]))
    console.print(table)
    bases = sorted({(r["concurrency"], r["predicted_base_step_ms"]) for r in report["arms"]})
    console.print("predicted with each plan's hardware spec, base step "
                  + ", ".join(f"{ms:.2f} ms at C={c}" for c, ms in bases)
                  + ": give the spec this box's decode step (decode.base_step_ms) for absolute "
                    "figures", highlight=False)
    for v in report["verdicts"]:
        for message in v["messages"]:
            console.print(message, style="bold red")
    if "plot" in report:
        console.print(f"plot written to {report['plot']}")


def figure(row: dict, key: str, fmt: str = "{:.2f}") -> str:
    """A figure and its 95% interval: "value [low, high]"."""
    return f"{fmt.format(row[key])} {span(row[f'{key}_ci95'], fmt)}"
