"""`placer hardware list|show|cards|new`: the serving box's spec (`placer probe` measures it:
placer/commands/probe.py)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated

import typer

from placer.commands import solve_options as so
from placer.commands.common import command, print_json
from placer.commands.solve_options import KvType
from placer.errors import PlacerError
from placer.files import check_outputs, write_text_atomic
from placer.hardware.backends import backend as backend_named
from placer.hardware.backends import default_backend, fit_for
from placer.hardware.cards import CARDS, known_card
from placer.hardware.spec import load_spec, preset_names
from placer.hardware.spec_toml import spec_toml
from placer.hardware.spill import DEFAULT_OS, check_os, spill_note
from placer.report.hardware import print_known_cards, print_spec
from placer.units import parse_bytes

GROUP_HELP = ("Hardware specs: list and show the presets that ship with placer (or a spec "
              "file), write one for your box from what you know of it (new), and the cards "
              "placer knows (cards).")


def register(app: typer.Typer) -> None:
    hardware = typer.Typer(help=GROUP_HELP, no_args_is_help=True)
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

    @command(hardware, "cards")
    def cards_table(
        json_out: Annotated[bool, typer.Option("--json", help="Print as JSON.")] = False,
    ) -> None:
        """The cards `hardware new` knows: VRAM, memory bandwidth, dense bf16 and int8
        tensor throughput, and the vendor document each figure comes from."""
        if json_out:
            print_json([{**c.__dict__, "aliases": list(c.aliases)} for c in CARDS])
            return
        print_known_cards()

    @command(hardware, "new")
    def new(
        card: Annotated[str, typer.Option(
            help="The card's model, as `placer hardware cards` lists it (e.g. \"RTX 3060\").")],
        pcie: Annotated[str, typer.Option(
            help="Each card's PCIe link, GEN x LANES: 3.0x16, 4.0x8, 5.0x16...")],
        ram: Annotated[str, typer.Option(
            help="Host memory, KIND-RATE x CHANNELS: ddr4-3200x2, ddr5-6000x2, ddr5-4800x8...")],
        cards: Annotated[int, typer.Option(help="How many of the card.")] = 1,
        cpu_cores: Annotated[int, typer.Option(help="The host's CPU cores.")] = 8,
        host_ram: Annotated[str | None, typer.Option(
            help="The host's RAM (e.g. 64GiB): the llama.cpp solve keeps pinned (-lm none) "
                 "host experts within it; not given, 0, and they are not checked.")] = None,
        model: Annotated[Path | None, typer.Option(
            help="A checkpoint (or model.gguf) to estimate the decode step for, from the "
                 "bytes it reads a token (its KV cache at --ctx included) at the backend's "
                 "fitted share of the card's bandwidth plus a fitted cost a layer (else from "
                 "the dense reserve), and whose dense weights and KV cache the cards reserve "
                 "(else shares of VRAM).")] = None,
        config: Annotated[Path | None, typer.Option(
            help="Instead of --model: the model's config.json, its sizes estimated at "
                 "--expert-dtype / --dense-dtype (before the download).")] = None,
        expert_dtype: so.ExpertDtype = None,
        dense_dtype: so.DenseDtype = None,
        ctx: Annotated[int | None, typer.Option(
            "--ctx", help="With --model: the context (tokens) to reserve KV cache for, "
                          "recorded in the spec and printed by `export llamacpp` as -c "
                          "(default 4096).")] = None,
        kv_type: KvType = None,
        backend: Annotated[str | None, typer.Option(
            help="llama.cpp's backend for the card: cuda, cuda-nographs, vulkan, rocm, metal, "
                 "cpu (default: the card vendor's: NVIDIA cuda, AMD rocm, Apple metal, "
                 "Intel vulkan). Picks the step fit, the upload cost and the largest "
                 "allocation (docs/hardware.md).")] = None,
        os_name: Annotated[str, typer.Option(
            "--os", help="The box's OS: linux, windows, wsl2, macos. With the backend it says "
                         "whether a card's buffers past its VRAM spill to host memory "
                         "(Windows CUDA and ROCm: read over the link each step) or fail to "
                         "load (placer/hardware/data/spill.csv).")] = DEFAULT_OS,
        out: Annotated[Path | None, typer.Option(
            help="Write the spec to this .toml (default: print it).")] = None,
    ) -> None:
        """A spec for your box from what you know of it: the card's published figures, the
        link's and the host memory's peaks, typical shares of them; every figure that stands
        in for a measurement marked ESTIMATED with the `placer probe` that replaces it. The
        spec loads as is (`placer solve --hardware box.toml`)."""
        from placer.checkpoint.source import model_inventory
        from placer.hardware.new_spec import model_figures, new_spec

        if out is not None and out.suffix != ".toml":
            raise PlacerError(f"--out writes a TOML spec: give a path ending in .toml, not {out}")
        inputs = [("--model", model), ("--config", config)]
        if out is not None:
            check_outputs([("--out", out)], inputs)
        figures = known_card(card)
        name = backend_named(backend).name if backend is not None else default_backend(figures)
        fit = fit_for(figures, name)
        inv = model_inventory(model, config, expert_dtype, dense_dtype)
        if inv is None and (ctx is not None or kv_type is not None):
            raise PlacerError(f"{'--ctx' if ctx is not None else '--kv-type'}: the KV cache "
                              "is sized from the model's config: give --model or --config")
        got = None if inv is None else model_figures(inv, str(model or config), figures,
                                                     cards, ctx, kv_type)
        made = new_spec(figures, cards, pcie, ram, cpu_cores,
                        0 if host_ram is None else parse_bytes(host_ram, "--host-ram"),
                        name, got)
        spec = dataclasses.replace(made.spec, os=check_os(os_name))
        made = dataclasses.replace(made, spec=spec,
                                   card_notes=(*made.card_notes,
                                               spill_note(*spec.spills(spec.cards[0]))))
        text = spec_toml(made.spec, made.step_note, "\n".join(made.host_notes),
                         "\n".join(made.card_notes))
        if out is None:
            typer.echo(text, nl=False)
        else:
            write_text_atomic(text, out, inputs)
            typer.echo(f"wrote {out}: {made.spec.description}")
        typer.echo(f"decode step: the {name} fit for a {figures.tier} card ({fit.rows} published "
                   f"runs: share {fit.share:g} of the bandwidth, {fit.layer_us:g} us a layer; "
                   f"the step may lie in {fit.spread[0]:g}-{fit.spread[1]:g} x it; "
                   "placer/hardware/data/step_fit.csv)", err=True)
        typer.echo("ESTIMATED figures; measure them on the box: `placer probe` (h2d_bandwidth, "
                   "latency_us), `placer probe --host --hardware SPEC --out SPEC` ([host]), "
                   "`placer probe --step --model M --hardware SPEC --out SPEC` ([decode])",
                   err=True)
        if made.spec.host_ram == 0:
            typer.echo("host_ram = 0: not given (--host-ram); the llama.cpp solve will not "
                       "check a pinned (-lm none) option against the host's RAM", err=True)

