"""`placer hardware list|show` and `placer probe`: the serving box."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from placer.commands.common import command, parse_list, print_json, print_table
from placer.commands.common import console as rich_console
from placer.errors import PlacerError
from placer.files import check_apart, write_text_atomic
from placer.hardware.cards import memory_bandwidth
from placer.hardware.devices import check_device
from placer.hardware.spec import HardwareSpec, load_spec, preset_names
from placer.hardware.spec_toml import spec_toml
from placer.hardware.timing import DEFAULT_SHAPE, DEFAULT_TOKENS
from placer.units import format_bytes, parse_rate

MAX_STEP_BATCH = 1024  # a stand-in decode step of more sequences is not a spec's figure


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
        step: Annotated[bool, typer.Option(
            "--step", help="Measure the decode step with every expert resident (\\[decode] "
            "base_step_ms) of --model: the model with one resident expert's shape per "
            "selection, timed on --device; estimated from memory bandwidth where it cannot "
            "run here (marked estimated).")] = False,
        model: Annotated[Path | None, typer.Option(
            help="With --step: the checkpoint directory (or model.gguf: estimated only).")
        ] = None,
        hardware: Annotated[str | None, typer.Option(
            help="With --step: the spec (preset or .toml) whose step to measure: its batches, "
                 "its card's memory bandwidth for an estimate, and the spec --out writes.")
        ] = None,
        batch: Annotated[str | None, typer.Option(
            help="With --step: the batches to time (default: the spec's, else 1,8).")] = None,
        device: Annotated[str, typer.Option(
            help="With --step: torch device to time on: auto, cpu, cuda, cuda:N.")] = "auto",
        memory_bandwidth: Annotated[str | None, typer.Option(
            help="With --step: the card's memory bandwidth for an estimate (e.g. 1008GB/s; "
                 "default: the spec's card model, if placer knows it).")] = None,
        estimate: Annotated[bool, typer.Option(
            "--estimate", help="With --step: estimate from memory bandwidth, do not run.")
        ] = False,
        out: Annotated[Path | None, typer.Option(
            help="With --step: write --hardware's spec with the step into this .toml.")
        ] = None,
        gguf_type: Annotated[str | None, typer.Option(
            help="With --host: time the experts with llama.cpp's own CPU kernels in this GGUF "
                 "type (Q4_K, Q6_K, MXFP4, F16...: the model's expert type), as llama.cpp runs "
                 "a host layer, instead of torch (`make llama-env` installs llama.cpp).")
        ] = None,
    ) -> None:
        """Measure each visible GPU's pinned host-to-device bandwidth and per-copy latency,
        and print a spec fragment. Exits non-zero where no GPU is visible. With --host,
        measure the host CPU as it runs cold experts and print the spec's host table. With
        --step, measure the decode step of --model and print (or --out: write) the spec's
        \\[decode] table."""
        from placer.hardware.probe import host_fragment, parse_shape, probe_host, spec_fragment
        from placer.hardware.probe import probe as run_probe

        if gguf_type is not None and not host:
            raise PlacerError("--gguf-type goes with --host")
        if step:
            probe_step(StepRequest(model, hardware, batch, device, memory_bandwidth, estimate,
                                   out), json_out)
            return
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


@dataclass(frozen=True)
class StepRequest:
    """`placer probe --step`'s options."""

    model: Path | None
    hardware: str | None
    batch: str | None
    device: str
    memory_bandwidth: str | None
    estimate: bool
    out: Path | None


def probe_step(req: StepRequest, json_out: bool) -> None:
    """`placer probe --step`: measure (or estimate) base_step_ms; print it, or write it into
    a copy of --hardware's spec at --out."""
    from placer.checkpoint.inventory import read_inventory
    from placer.checkpoint.step import estimate_steps, fits, measure_steps

    if req.model is None:
        raise PlacerError("--step needs --model, the checkpoint whose decode step to time")
    if req.out is not None and req.hardware is None:
        raise PlacerError("--out writes a spec: give --hardware, the spec to write it into")
    if req.out is not None and req.out.suffix != ".toml":
        raise PlacerError(f"--out writes a TOML spec: give a path ending in .toml, not {req.out}")
    spec = load_spec(req.hardware) if req.hardware is not None else None
    batches = tuple(parse_list(req.batch, int, "--batch")) if req.batch else (
        tuple(b for b, _ in spec.base_step_ms) if spec is not None else (1, 8))
    if any(not 1 <= b <= MAX_STEP_BATCH for b in batches):
        raise PlacerError(f"--batch: batches must lie in 1..{MAX_STEP_BATCH}, got {batches}")
    check_device(req.device)
    if req.out is not None:
        check_apart(req.out, step_inputs(req), what="--out")
    inv = read_inventory(req.model)
    device = resolve_device(req.device)
    gguf = req.model.suffix == ".gguf"
    if req.estimate or gguf or not fits(inv, device):
        why = ("--estimate" if req.estimate else "a GGUF file is not run here" if gguf
               else f"the model does not fit {device} here")
        times = estimate_steps(inv, step_bandwidth(req, spec), batches, why)
    else:
        times = measure_steps(inv, device, batches)
    note = ("ESTIMATED, not measured: " if times.estimated else "") + times.how
    if json_out:
        print_json({"base_step_ms": {str(b): ms for b, ms in times.base_step_ms},
                    "estimated": times.estimated, "how": times.how,
                    "out": None if req.out is None else str(req.out)})
    if req.out is not None:
        assert spec is not None
        text = spec_toml(dataclasses.replace(spec, base_step_ms=times.base_step_ms), note)
        write_text_atomic(text, req.out, step_inputs(req), what="--out")
    if not json_out:
        steps = ", ".join(f"{b} = {ms:.4g}" for b, ms in times.base_step_ms)
        typer.echo(f"[decode]\nbase_step_ms = {{ {steps} }}  # {note}")
        if req.out is not None:
            typer.echo(f"wrote {req.out}")


def step_inputs(req: StepRequest) -> list[tuple[str, Path | None]]:
    """What `probe --step --out` reads, which it must not write onto."""
    spec = Path(req.hardware) if req.hardware and Path(req.hardware).exists() else None
    return [("the checkpoint", req.model), ("the hardware spec", spec)]


def step_bandwidth(req: StepRequest, spec: HardwareSpec | None) -> float:
    """The memory bandwidth an estimate divides by: --memory-bandwidth, else the spec's
    first card's by its model name."""
    if req.memory_bandwidth is not None:
        return parse_rate(req.memory_bandwidth, "--memory-bandwidth")
    known = memory_bandwidth(spec.cards[0].model) if spec is not None else None
    if known is None:
        card = f"card {spec.cards[0].model!r}" if spec is not None else "card (no --hardware)"
        raise PlacerError(f"--step: cannot run the model here and the {card} has no known "
                          "memory bandwidth: give --memory-bandwidth, e.g. 1008GB/s")
    return known


def resolve_device(name: str) -> str:
    """auto: cuda where a CUDA device is visible, else cpu."""
    if name != "auto":
        return name
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


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
