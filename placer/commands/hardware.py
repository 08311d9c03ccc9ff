"""`placer hardware list|show` and `placer probe`: the serving box."""

from __future__ import annotations

import dataclasses
from typing import Annotated

import typer
from rich.table import Table

from placer.commands.common import command, parse_list, print_json
from placer.commands.common import console as rich_console
from placer.errors import PlacerError
from placer.hardware.expert_probe import DEFAULT_SHAPE, DEFAULT_TOKENS
from placer.hardware.probe import host_fragment, parse_shape, probe_host, spec_fragment
from placer.hardware.probe import probe as run_probe
from placer.hardware.spec import HardwareSpec, load_spec, preset_names
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
    ) -> None:
        """Show one hardware spec (a preset or a TOML file), validated."""
        spec = load_spec(name)
        if json_out:
            print_json(spec.to_json())
        else:
            print_spec(spec)

    @command(app, "probe")
    def probe(
        json_out: Annotated[bool, typer.Option("--json", help="Print as JSON.")] = False,
        host: Annotated[bool, typer.Option(
            "--host", help="Measure the host CPU instead (no GPU needed): memory bandwidth, "
            "matmul FLOP/s, and the GPU round trip where CUDA is visible; print the spec's "
            "host table.")
        ] = False,
        dtype: Annotated[str, typer.Option(
            help="With --host: the experts' compute dtype, bfloat16 or float32.")
        ] = "bfloat16",
        mb: Annotated[int | None, typer.Option(
            help="With --host: copy buffer in MiB (default 4 x last-level cache, >= 256).")
        ] = None,
        tokens: Annotated[int, typer.Option(
            help="With --host: rows of the timed matmul, (tokens x 2048) @ (2048 x 768).")
        ] = 1024,
        expert: Annotated[list[str] | None, typer.Option(
            help="With --host: an expert shape HIDDENxINTER to time over n tokens, cold from "
                 "RAM (repeatable; default 2048x768); the cpu model predicts from these.")
        ] = None,
        expert_tokens: Annotated[str, typer.Option(
            help="With --host: the token counts n each expert is timed at.")
        ] = ",".join(map(str, DEFAULT_TOKENS)),
        gguf_type: Annotated[str | None, typer.Option(
            help="With --host: time the experts with llama.cpp's own CPU kernels in this GGUF "
                 "type (Q4_K, Q6_K, MXFP4, F16...: the model's expert type), as llama.cpp runs "
                 "a host layer, instead of torch (`make llama-env` installs llama.cpp).")
        ] = None,
    ) -> None:
        """Measure each visible GPU's pinned host-to-device bandwidth and per-copy latency,
        and print a spec fragment. Exits non-zero where no GPU is visible. With --host,
        measure the host CPU as it runs cold experts and print the spec's host table."""
        if gguf_type is not None and not host:
            raise PlacerError("--gguf-type goes with --host")
        if host:
            shapes = tuple(parse_shape(e) for e in expert) if expert else (DEFAULT_SHAPE,)
            result = probe_host(dtype, None if mb is None else mb * 2**20, tokens,
                                experts=shapes, expert_tokens=tuple(
                                    parse_list(expert_tokens, int, "--expert-tokens")),
                                gguf_type=gguf_type)
            if json_out:
                print_json(dataclasses.asdict(result))
            else:
                typer.echo(host_fragment(result), nl=False)
            return
        results = run_probe()
        if json_out:
            print_json([r.__dict__ for r in results])
        else:
            for r in results:
                typer.echo(f"# card {r.index} {r.name}: {r.h2d_bandwidth / 1e9:.2f} GB/s pinned "
                           f"H2D, {r.latency_us:.2f} us per 4 KiB copy")
            typer.echo(spec_fragment(results))


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
    console.print(table)
    for link in spec.links:
        console.print(f"link {link.name}: cards {list(link.cards)}, "
                      f"{link.bandwidth / 1e9:.1f} GB/s shared")
    steps = ", ".join(f"B={b}: {ms} ms" for b, ms in spec.base_step_ms)
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
