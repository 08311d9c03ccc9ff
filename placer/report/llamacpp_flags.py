"""What `placer evaluate --flags` prints: per traffic and concurrency, each llama-server
command line (and a plan's choice) side by side with 95% intervals; then each line's flags
and what placer does not model of them."""

from __future__ import annotations

from pathlib import Path

from rich.table import Table

from placer.files import write_json_atomic
from placer.report.figures import console as rich_console
from placer.report.figures import plus_minus, print_table, span
from placer.report.llamacpp import _layers as host_text
from placer.report.marks import marked, step_ranges, table_marks


def report_flags(report: dict, out: Path | None = None, *, quiet: bool = False) -> None:
    """With `out`, the report as JSON there; the tables and notes on stdout unless `quiet`."""
    if out is not None:
        write_json_atomic(report, out)
    if not quiet:
        print_flags(report)


def print_flags(report: dict) -> None:
    console = rich_console()
    lines = {line["name"]: line for line in report["lines"]}
    first = report["lines"][0]["name"]
    routing = ("uniform routing (no --traces)" if report["routing"] == "uniform"
               else "every held-out token")
    for row in report["results"]:
        table = Table(title=f"{row['traces']} B={row['concurrency']}: predicted decode on "
                            f"{routing}, {report['llamacpp_build']}; ± 95% bootstrap "
                            f"interval over {row['interval_units']} {row['interval_over']}")
        for col in ("line", "host layers", "--moe-cache-mib", "slots", "cpu share",
                    "host experts", marked("tok/s", report["estimated"]),
                    marked("stall ms/step", report["estimated"], stall=True),
                    f"stall / {first}'s"):
            table.add_column(col, justify="right")
        for name, fig in row["lines"].items():
            line = lines[name]
            ratio = ("-" if fig["ratio_to_first"] is None else
                     f"{fig['ratio_to_first']:.3f}x {span(fig['ratio_to_first_ci95'])}")
            spill = (f" (SPILLS {sum(line['spill_mib'])} MiB)"
                     if line.get("spill") else "")
            table.add_row(name + spill, host_text(line), str(line["moe_cache_mib"]),
                          ",".join(map(str, line["slots"])) or "-", f"{line['cpu_share']:g}",
                          "pinned" if line["pinned"] else "mmap'd",
                          plus_minus(fig, "tokens_per_s", "{:.2f}"),
                          plus_minus(fig, "stall_ms_per_step", "{:.4f}"), ratio)
        print_table(table, console)
        for line in step_ranges(f"B={row['concurrency']}", row["lines"]):
            console.print(line, highlight=False, markup=False)
    for line in table_marks(report["estimated"]):
        console.print(line, highlight=False, markup=False)
    for line in report["lines"]:
        if line["flags"] is not None:
            console.print(f"{line['name']}: {line['flags']}", highlight=False, markup=False)
        for note in line["notes"]:
            console.print(f"  {note}", highlight=False, markup=False)
    for note in report["notes"]:
        console.print(f"note: {note}", highlight=False, markup=False)

