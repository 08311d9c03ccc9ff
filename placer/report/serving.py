"""What the serving commands print: `placer run`'s text and staging counters, `placer
bench`'s measured and predicted tokens/s per arm (llama.cpp's bench: report/llamacpp.py)."""

from __future__ import annotations

from rich.table import Table

from placer.report.figures import bold, print_table, span
from placer.report.figures import console as rich_console
from placer.report.marks import STEP_COLUMN, marked, step_cell, table_marks
from placer.units import format_bytes


def print_result(result: dict) -> None:
    """The generated text, then staging per card and in total."""
    console = rich_console()
    console.print(bold(result["prompt"]), end="")
    console.print(result["text"], highlight=False)
    table = Table(title=f"staging over {result['new_tokens']} new tokens on {result['device']}"
                  f" (cache slots per card: {result['cache_slots']})")
    for col in ("card", "staged", "copies", "cache hits", "seconds"):
        table.add_column(col, justify="right")
    staging = result["staging"]
    for row in [*staging["per_card"], {"card": "total", **staging["total"]}]:
        table.add_row(str(row["card"]), format_bytes(row["bytes"]), str(row["copies"]),
                      str(row["cache_hits"]), f"{row['seconds']:.4f}")
    print_table(table, console)
    ahead = staging.get("prefetch")
    if ahead is not None:
        console.print(f"prefetch: {ahead['prefetched']} experts copied ahead "
                      f"({format_bytes(ahead['prefetch_bytes'])}): {ahead['useful']} useful, "
                      f"{ahead['late']} late, {ahead['wasted']} wasted; {ahead['hits']} other "
                      f"hits, {ahead['misses']} copied on demand. Useful and late are counted "
                      "on the replay's clock model (copy and window times), not measured"
                      + (f"; {ahead['late_measured']} measured late (CUDA events)"
                         if result["device"].startswith("cuda") else "") + ".",
                      highlight=False)


def print_bench(report: dict) -> None:
    """Two rows per arm and concurrency: measured and predicted decode tokens/s, each with
    its 95% interval, and each as a ratio to the first arm; arms by directory name (see
    --json for the paths)."""
    from placer.serve.bench_plot import labels

    console = rich_console()
    table = Table(title=f"{report['num_prompts']} prompts x "
                        f"{report['trials']} trials, {report['max_new_tokens']} new tokens "
                        f"(95% intervals; ratios to the first arm)")
    step = "predicted_tokens_per_s_step"
    steps = any(step in r for r in report["arms"])
    for col in ("arm", "C", "", "decode tok/s", *([STEP_COLUMN] if steps else []),
                "/ first arm", "TTFT ms", "steps"):
        table.add_column(col, justify="left" if col == "arm" else "right")
    names = labels([r["placed"] for r in report["arms"]])
    estimated = report["estimated"]
    for name, r in zip(names, report["arms"], strict=True):
        for kind in ("measured", "predicted"):
            first_row = kind == "measured"
            table.add_row(name if first_row else "", str(r["concurrency"]) if first_row else "",
                          kind if first_row else marked(kind, estimated),
                          figure(r, f"{kind}_tokens_per_s"),
                          *([step_cell(r, step) if not first_row else ""] if steps else []),
                          figure(r, f"{kind}_ratio_to_first", "{:.3f}"),
                          f"{r['ttft_ms']:.1f}" if first_row else "",
                          str(r["decode_steps"]) if first_row else "", end_section=not first_row)
    print_table(table, console)
    for line in table_marks(estimated):
        console.print(line, highlight=False)
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
                     ": put it in the spec's [decode] base_step_ms (or run with --spec-out)"),
                  highlight=False)
    for note in report.get("notes", []):
        console.print(f"note: {note}", highlight=False)
    for v in report["verdicts"]:
        for message in v["messages"]:
            console.print(message, style="bold red", highlight=False)
    if "plot" in report:
        console.print(f"plot written to {report['plot']}")


def figure(row: dict, key: str, fmt: str = "{:.2f}") -> str:
    """A figure and its 95% interval: "value [low, high]"."""
    return f"{fmt.format(row[key])} {span(row[f'{key}_ci95'], fmt)}"
