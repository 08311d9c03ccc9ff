"""`placer hardware list|show|new`: the serving box's spec (`placer probe` measures it:
placer/commands/probe.py)."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from placer.commands.common import command, print_json, print_table
from placer.commands.common import console as rich_console
from placer.hardware.spec import HardwareSpec, load_spec, preset_names
from placer.hardware.spec_toml import spec_toml
from placer.units import format_bytes


def register(app: typer.Typer) -> None:
    hardware = typer.Typer(help="Hardware specs: the presets that ship with placer.",
                           no_args_is_help=True)
    app.add_typer(hardware, name="hardware")

    @command(hardware, "list")
    def list_presets() -> None:
        """List the hardware presets."""
        for name in preset_names():
            typer.echo(f"{name:24s} {load_spec(name).description}")

    @command(hardware, "show")
    def show(
        name: Annotated[str, typer.Argument(help="Preset name or path to a spec .toml.")],
        json_out: Annotated[bool, typer.Option("--json", help="Print as JSON.")] = False,
        toml_out: Annotated[bool, typer.Option("--toml", help=(
            "Print the spec as a TOML file to edit for your box (`placer hardware show "
            "1x-rtx4090 --toml > mybox.toml`); it loads back to the same spec."))] = False,
    ) -> None:
        """Show one hardware spec (a preset or a TOML file), validated."""
        spec = load_spec(name)
        if json_out:
            print_json(spec.to_json())
        elif toml_out:
            typer.echo(spec_toml(spec), nl=False)
        else:
            print_spec(spec)


def print_spec(spec: HardwareSpec) -> None:
    """A human table of a spec."""
    table = Table(title=f"{spec.name}: {spec.description}")
    for col in ("card", "model", "vram", "reserved", "free for experts", "H2D", "latency"):
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
    console.print(f"base decode step: {steps}; host RAM {format_bytes(spec.host_ram)}")
    if spec.host is not None:
        h = spec.host
        console.print(f"host CPU: {h.memory_bandwidth / 1e9:.1f} GB/s from RAM, "
                      f"{h.flops / 1e12:.2f} TFLOP/s, {h.sync_s * 1e6:.1f} us sync per layer, "
                      f"{h.sockets} socket{'s' if h.sockets > 1 else ''}; the GPU computes cold "
                      + (f"experts at >= {h.offload_min_batch} tokens a step"
                         if h.offload_min_batch else "experts never"))
        for t in h.expert:
            points = ", ".join(f"{n}: {s * 1e3:.3g}" for n, s in zip(t.tokens, t.seconds,
                                                                    strict=True))
            console.print(f"measured expert {t.hidden} x {t.inter} {t.dtype}, ms by tokens: "
                          f"{points}")
    else:
        console.print("host CPU: not given (add a \\[host] table to predict CPU execution)")
