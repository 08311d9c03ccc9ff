"""What the box's commands print: a spec (`placer hardware show`), the cards placer knows
(`hardware cards`), and what `placer probe` measured (the cards' copies, the host's table,
the decode step)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.table import Table

from placer.plan.estimates import estimated_json
from placer.report.figures import console as rich_console
from placer.report.figures import print_table
from placer.report.marks import MARK, table_marks
from placer.units import format_bytes

if TYPE_CHECKING:
    from placer.hardware.probe import HostProbe, ProbeResult
    from placer.hardware.spec import HardwareSpec
    from placer.hardware.spec_probe import StepProbe


def print_known_cards() -> None:
    """The cards placer knows, with each figure's source."""
    from placer.hardware.cards import CARDS

    table = Table(title="cards placer knows (placer/hardware/cards.py)")
    for col in ("card", "VRAM", "memory", "bf16 dense", "int8 dense", "source"):
        table.add_column(col)
    for c in CARDS:
        table.add_row(c.name, f"{c.vram_gib:g} GB", f"{c.bandwidth_gbps:g} GB/s",
                      "-" if c.bf16_tflops is None else f"{c.bf16_tflops:g} TFLOPS",
                      "-" if c.int8_tops is None else f"{c.int8_tops:g} TOPS",
                      c.source.split(" (")[0] + (" (derived)" if c.derived else ""))
    print_table(table)


def print_spec(spec: HardwareSpec) -> None:
    """A human table of a spec: every figure its `estimated` lists marked ESTIMATED, and
    under it what rests on them and the probe that measures each."""
    from placer.hardware.spec_toml import HOST_RAM_UNSET

    def mark(text: str, figure: str) -> str:
        return f"{text} {MARK}" if figure in spec.estimated else text

    table = Table(title=f"{spec.name}: {spec.description}")
    for col in ("card", "model", "vram", mark("reserved", "card.reserved"),
                mark("free for experts", "card.reserved"), mark("H2D", "card.h2d_bandwidth"),
                mark("latency", "card.latency_us")):
        table.add_column(col)
    for c in spec.cards:
        table.add_row(str(c.index), c.model, format_bytes(c.vram),
                      format_bytes(c.vram - c.free_bytes), format_bytes(c.free_bytes),
                      f"{c.h2d_bandwidth / 1e9:.1f} GB/s", f"{c.latency_s * 1e6:.1f} us")
    console = rich_console()
    print_table(table, console)
    for link in spec.links:
        console.print(f"link {link.name}: cards {list(link.cards)}, "
                      f"{link.bandwidth / 1e9:.1f} GB/s shared")
    steps = ", ".join(f"B={b}: {ms:.4g} ms" for b, ms in spec.base_step_ms)
    lo, hi = spec.step_spread
    spread = f" (it may lie in {lo:g}-{hi:g} x it)" if (lo, hi) != (1.0, 1.0) else ""
    console.print(f"{mark('base decode step', 'base_step_ms')}: {steps}{spread}; host RAM "
                  + (HOST_RAM_UNSET if spec.host_ram == 0 else format_bytes(spec.host_ram)))
    if spec.context is not None:
        console.print(f"context: {spec.context.tokens} tokens of {spec.context.kv_type} K and "
                      "V (reserved_kv is for it; export llamacpp prints -c)")
    fates: dict[tuple[bool, str], list[int]] = {}
    for c in spec.cards:
        fates.setdefault(spec.spills(c), []).append(c.index)
    for (spills, why), cards in fates.items():
        console.print(f"card{'s' if len(cards) > 1 else ''} {', '.join(map(str, cards))} past "
                      f"VRAM: {'spills to host memory' if spills else 'fails to load'} ({why})")
    if spec.host is not None:
        h = spec.host
        ram = mark(f"{h.memory_bandwidth / 1e9:.1f} GB/s", "host.memory_bandwidth")
        console.print(f"host CPU: {ram} from RAM, "
                      f"{mark(f'{h.flops / 1e12:.2f} TFLOP/s', 'host.flops')}, "
                      f"{mark(f'{h.sync_s * 1e6:.1f} us', 'host.sync_us')} sync per layer, "
                      f"{h.sockets} socket{'s' if h.sockets > 1 else ''}; the GPU computes cold "
                      + (f"experts at >= {h.offload_min_batch} tokens a step"
                         if h.offload_min_batch else "experts never"))
        for t in h.expert:
            points = ", ".join(f"{n}: {s * 1e3:.3g}" for n, s in zip(t.tokens, t.seconds,
                                                                    strict=True))
            console.print(f"measured expert {t.hidden} x {t.inter} {t.dtype}, ms by tokens: "
                          f"{points}")
    else:
        console.print("host CPU: not given (add a [host] table to predict CPU execution)")
    for line in table_marks(estimated_json(spec)):
        console.print(line)


def print_cards(results: list[ProbeResult]) -> None:
    """`placer probe`: every visible GPU's copies, then the spec fragment."""
    from placer.hardware.probe import spec_fragment

    for r in results:
        typer.echo(f"# card {r.index} {r.name}: {r.h2d_bandwidth / 1e9:.2f} GB/s pinned "
                   f"H2D, {r.latency_us:.2f} us per 4 KiB copy")
    typer.echo(spec_fragment(results))


def print_host(result: HostProbe, out: Path | None) -> None:
    """`placer probe --host`: the `[host]` table, a warning where a timing did not settle."""
    from placer.hardware.probe import host_fragment

    typer.echo(host_fragment(result), nl=False)
    if result.noisy:
        typer.echo("warning: some timings did not settle (NOISY): the machine was busy; "
                   "rerun when it is idle", err=True)
    if out is not None:
        typer.echo(f"wrote {out}")


def print_step(found: StepProbe, out: Path | None, json_out: bool = False) -> None:
    """`placer probe --step`: a warning on stderr where the device timed is not the spec's
    card; then (not with --json) the `[decode]` table."""
    if found.other_device:
        typer.echo(f"warning: {found.other_device}: the figure below is not the card's step",
                   err=True)
    if not json_out:
        steps = ", ".join(f"{b} = {ms:.4g}" for b, ms in found.times.base_step_ms)
        typer.echo(f"[decode]\nbase_step_ms = {{ {steps} }}  # {found.note}")
        if out is not None:
            typer.echo(f"wrote {out}")
