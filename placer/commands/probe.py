"""`placer probe`: measure the serving box (the cards' copies, the host CPU with --host, the
decode step with --step), each figure saying what it measured: the device timed, its spread
over repeats, NOISY where the repeats did not settle, ESTIMATED where nothing ran.

A step time is the spec's card's only if it was timed on that card: a step measured on the
CPU (or on another GPU) for a spec that names an RTX 3060 mispredicts every tok/s by the
ratio of the two. So `--step --out` refuses to write one, before measuring, unless
`--allow-other-device` says so (then the spec's comment says so too); printed without --out,
it comes with a warning.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from placer.commands.common import command, parse_list, print_json
from placer.errors import PlacerError
from placer.files import check_apart, write_text_atomic
from placer.hardware.cards import card, memory_bandwidth, same_card
from placer.hardware.devices import check_device
from placer.hardware.spec import MAX_BYTES, MAX_MS, load_spec
from placer.hardware.timing import DEFAULT_SHAPE, DEFAULT_TOKENS
from placer.units import parse_rate

if TYPE_CHECKING:
    from placer.checkpoint.step import StepTimes
    from placer.hardware.probe import HostProbe
    from placer.hardware.spec import HardwareSpec

MAX_STEP_BATCH = 1024  # a stand-in decode step of more sequences is not a spec's figure
MIN_CARD_BANDWIDTH = 1e9  # bytes/s of a card's memory below this are a typo (a 2005 GPU: 8 GB/s)


def register(app: typer.Typer) -> None:
    @command(app, "probe")
    def probe(
        json_out: Annotated[bool, typer.Option("--json", help="Print as JSON.")] = False,
        host: Annotated[bool, typer.Option(
            "--host", help="Measure the host CPU instead (no GPU needed): memory bandwidth, "
            "matmul FLOP/s, cold experts' times, and the GPU round trip where CUDA is "
            "visible; print the spec's host table (or merge it into --hardware's spec at "
            "--out).")
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
                 "RAM (repeatable; default 2048x768, or --model's); the cpu model predicts "
                 "from these.")
        ] = None,
        expert_tokens: Annotated[str, typer.Option(
            help="With --host: the token counts n each expert is timed at.")
        ] = ",".join(map(str, DEFAULT_TOKENS)),
        step: Annotated[bool, typer.Option(
            "--step", help="Measure the decode step with every expert resident (\\[decode] "
            "base_step_ms) of --model: the model with one resident expert's shape per "
            "selection, timed on --device (which must be the spec's card to be written: see "
            "--allow-other-device); estimated from memory bandwidth where it cannot run here "
            "(marked ESTIMATED).")] = False,
        model: Annotated[Path | None, typer.Option(
            help="With --step: the checkpoint directory (or model.gguf: estimated only). With "
                 "--host: the model whose experts to time (a GGUF: its expert shape and type, "
                 "timed with llama.cpp's kernels; a checkpoint: its expert shape).")
        ] = None,
        hardware: Annotated[str | None, typer.Option(
            help="The spec (preset or .toml) to measure for: with --step its batches, its "
                 "card (the device timed must be it) and the card's memory bandwidth for an "
                 "estimate; the spec --out writes, with the measured table replaced.")
        ] = None,
        batch: Annotated[str | None, typer.Option(
            help="With --step: the batches to time (default: the spec's, else 1,8).")] = None,
        device: Annotated[str, typer.Option(
            help="With --step: torch device to time on: auto, cpu, cuda, cuda:N.")] = "auto",
        allow_other_device: Annotated[bool, typer.Option(
            "--allow-other-device", help="With --step --out: write a step timed on another "
                                         "device than the spec's card (--device cpu for a GPU "
                                         "spec), marked as such in the spec.")] = False,
        memory_bandwidth: Annotated[str | None, typer.Option(
            help="With --step: the card's memory bandwidth for an estimate (e.g. 1008GB/s; "
                 "default: the spec's card model, if placer knows it).")] = None,
        estimate: Annotated[bool, typer.Option(
            "--estimate", help="With --step: estimate from memory bandwidth, do not run.")
        ] = False,
        out: Annotated[Path | None, typer.Option(
            help="With --step or --host: write --hardware's spec with the measured table into "
                 "this .toml (it may be --hardware's own file: the spec is merged, not "
                 "appended to).")
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
        --step, measure the decode step of --model and print the spec's \\[decode] table.
        With --hardware SPEC --out FILE, write SPEC with the measured table in its place.
        Every figure names the device it timed and its spread over repeats (NOISY where the
        repeats did not settle)."""
        if gguf_type is not None and not host:
            raise PlacerError("--gguf-type goes with --host")
        if allow_other_device and not step:
            raise PlacerError("--allow-other-device goes with --step")
        if out is not None:
            check_target(out, hardware)
        if step:
            probe_step(StepRequest(model, hardware, batch, device, memory_bandwidth, estimate,
                                   out, allow_other_device), json_out)
        elif host:
            probe_host_command(HostRequest(dtype, mb, tokens, expert, expert_tokens, model,
                                           gguf_type, hardware, out), json_out)
        else:
            if out is not None or model is not None:
                raise PlacerError("--out and --model go with --step or --host")
            probe_cards(json_out)


def check_target(out: Path, hardware: str | None) -> None:
    """Refuse an --out that cannot be written, before anything is measured: not a .toml,
    no --hardware spec to write, a directory, or a folder that does not exist or is not
    writable (a measurement of minutes is not to be lost to a typo in a path)."""
    if hardware is None:
        raise PlacerError("--out writes a spec: give --hardware, the spec to write it into")
    if out.suffix != ".toml":
        raise PlacerError(f"--out writes a TOML spec: give a path ending in .toml, not {out}")
    if out.is_dir():
        raise PlacerError(f"--out {out}: is a directory (name a .toml file)")
    parent = out.parent if str(out.parent) else Path(".")
    if not parent.is_dir():
        raise PlacerError(f"--out {out}: the folder {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK) or (out.exists() and not os.access(out, os.W_OK)):
        raise PlacerError(f"--out {out}: permission denied (cannot write there)")


def probe_cards(json_out: bool) -> None:
    """`placer probe`: every visible GPU's copies."""
    from placer.hardware.probe import probe as run_probe
    from placer.hardware.probe import spec_fragment

    results = run_probe()
    if json_out:
        print_json([r.__dict__ for r in results])
        return
    for r in results:
        typer.echo(f"# card {r.index} {r.name}: {r.h2d_bandwidth / 1e9:.2f} GB/s pinned "
                   f"H2D, {r.latency_us:.2f} us per 4 KiB copy")
    typer.echo(spec_fragment(results))


@dataclass(frozen=True)
class HostRequest:
    """`placer probe --host`'s options."""

    dtype: str
    mb: int | None
    tokens: int
    expert: list[str] | None
    expert_tokens: str
    model: Path | None
    gguf_type: str | None
    hardware: str | None
    out: Path | None


def probe_host_command(req: HostRequest, json_out: bool) -> None:
    """`placer probe --host`: measure, print the `[host]` table (or write it into a copy of
    --hardware's spec at --out: a merge, never a second `[host]`)."""
    from placer.hardware.probe import host_fragment, parse_shape, probe_host

    if req.model is not None and (req.expert or req.gguf_type):
        raise PlacerError("--model gives the experts' shape (and a GGUF's type): drop "
                          "--expert and --gguf-type")
    spec = load_spec(req.hardware) if req.hardware is not None else None
    if req.model is not None:
        shapes, gguf_type, source = model_experts(req.model)
    else:
        shapes = tuple(parse_shape(e) for e in req.expert) if req.expert else (DEFAULT_SHAPE,)
        gguf_type, source = req.gguf_type, ""
    result = probe_host(req.dtype, None if req.mb is None else req.mb * 2**20, req.tokens,
                        experts=shapes, expert_tokens=tuple(
                            parse_list(req.expert_tokens, int, "--expert-tokens")),
                        gguf_type=gguf_type, source=source)
    if req.out is not None:
        assert spec is not None
        write_spec(merged_host(spec, result), req, host_note=host_note(result))
    if json_out:
        print_json({**dataclasses.asdict(result), "noisy": result.noisy,
                    "out": None if req.out is None else str(req.out)})
        return
    typer.echo(host_fragment(result), nl=False)
    if result.noisy:
        typer.echo("warning: some timings did not settle (NOISY): the machine was busy; "
                   "rerun when it is idle", err=True)
    if req.out is not None:
        typer.echo(f"wrote {req.out}")


def host_note(result: HostProbe) -> str:
    """The comment above the merged `[host]` table: the fragment's notes, each figure's
    ("flops: measured: torch bfloat16 matmul ..."), the expert tables' in their order."""
    from placer.hardware.probe import host_fragment

    notes = []
    for line in host_fragment(result).splitlines():
        head, sep, comment = line.partition("  # ")
        if line.startswith("# "):
            notes.append(line[2:])
        elif sep:
            notes.append(f"{head.split(' = ')[0]}: {comment}")
    return "\n".join(notes)


def merged_host(spec: HardwareSpec, result: HostProbe) -> HardwareSpec:
    """`spec` with its host figures replaced by the probe's (sockets and offload_min_batch,
    which no probe measures, kept)."""
    from placer.hardware.spec import Host

    old = spec.host
    host = Host(memory_bandwidth=float(round(result.memory_bandwidth / 1e7) * 10**7),
                flops=float(f"{result.flops:.4g}"), sync_s=round(result.sync_us, 1) / 1e6,
                **({} if old is None else {"sockets": old.sockets,
                                           "offload_min_batch": old.offload_min_batch}),
                expert=result.experts)
    return dataclasses.replace(spec, host=host)


def model_experts(model: Path) -> tuple[tuple[tuple[int, int], ...], str | None, str]:
    """The expert shape to time for `model`, the GGUF type to time it in (None: torch), and
    a line saying where they came from. A GGUF's gate projection gives both (its up and down
    projections' types, where they differ, are named: the curve is scaled by bytes)."""
    from placer.checkpoint.inventory import read_inventory

    inv = read_inventory(model)
    if not inv.experts:
        raise PlacerError(f"--model {model}: no routed experts to time")
    tensors = inv.experts[0].tensors
    gate = next((t for t in tensors if "gate" in t.name), tensors[0])
    if len(gate.shape) != 2:
        raise PlacerError(f"--model {model}: expert tensor {gate.name} has shape {gate.shape}, "
                          "expected [inter, hidden] (a fused gate_up is not timed here)")
    inter, hidden = gate.shape
    if model.suffix != ".gguf":
        return ((hidden, inter),), None, f"{model.name}: {hidden}x{inter} (torch)"
    others = sorted({t.dtype for t in tensors} - {gate.dtype})
    mixed = f"; its other projections are {', '.join(others)}" if others else ""
    return ((hidden, inter),), gate.dtype, f"{model.name}: {hidden}x{inter} {gate.dtype}{mixed}"


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
    allow_other_device: bool = False


def probe_step(req: StepRequest, json_out: bool) -> None:
    """`placer probe --step`: measure (or estimate) base_step_ms; print it, or write it into
    a copy of --hardware's spec at --out. A measurement on another device than the spec's
    card is refused for --out (unless --allow-other-device) before anything runs."""
    from placer.checkpoint.inventory import read_inventory
    from placer.checkpoint.step import estimate_steps, fits, measure_steps
    from placer.hardware.devices import device_name

    if req.model is None:
        raise PlacerError("--step needs --model, the checkpoint whose decode step to time")
    spec = load_spec(req.hardware) if req.hardware is not None else None
    batches = tuple(parse_list(req.batch, int, "--batch")) if req.batch else (
        tuple(b for b, _ in spec.base_step_ms) if spec is not None else (1, 8))
    if any(not 1 <= b <= MAX_STEP_BATCH for b in batches):
        raise PlacerError(f"--batch: batches must lie in 1..{MAX_STEP_BATCH}, got {batches}")
    check_device(req.device)
    bandwidth = step_bandwidth(req, spec) if req.memory_bandwidth is not None else None
    if req.out is not None:
        check_apart(req.out, step_inputs(req), what="--out")
    inv = read_inventory(req.model)
    device = resolve_device(req.device)
    gguf = req.model.suffix == ".gguf"
    warning = None
    if req.estimate or gguf or not fits(inv, device):
        why = ("--estimate" if req.estimate else "a GGUF file is not run here" if gguf
               else f"the model does not fit {device} here")
        times = estimate_steps(inv, bandwidth or step_bandwidth(req, spec), batches, why)
    else:
        name = device_name(device)
        warning = other_device(spec, device, name)
        if warning and req.out is not None and not req.allow_other_device:
            raise PlacerError(f"probe --step: {warning}; not written to {req.out}: time it on "
                              "the card (--device cuda), or --estimate from its memory "
                              "bandwidth, or --allow-other-device to write it marked as such")
        typer.echo(f"probe --step: timing on {name}", err=True)
        times = measure_steps(inv, device, batches, device_label=name)
    check_steps(times)
    note = times.note() + (f"; NOT THE SPEC'S CARD ({warning}; --allow-other-device)"
                           if warning else "")
    if json_out:
        print_json({"base_step_ms": {str(b): ms for b, ms in times.base_step_ms},
                    "estimated": times.estimated, "noisy": times.noisy,
                    "device": times.device or None, "other_device": warning,
                    "spread": {str(b): s for b, s in times.spread},
                    "steps": {str(b): n for b, n in times.steps}, "how": times.how,
                    "out": None if req.out is None else str(req.out)})
    if req.out is not None:
        assert spec is not None
        write_spec(dataclasses.replace(spec, base_step_ms=times.base_step_ms), req,
                   step_note=note)
    if warning:
        typer.echo(f"warning: {warning}: the figure below is not the card's step", err=True)
    if not json_out:
        steps = ", ".join(f"{b} = {ms:.4g}" for b, ms in times.base_step_ms)
        typer.echo(f"[decode]\nbase_step_ms = {{ {steps} }}  # {note}")
        if req.out is not None:
            typer.echo(f"wrote {req.out}")


def other_device(spec: HardwareSpec | None, device: str, name: str) -> str | None:
    """Why `device` (named `name`, "cuda:0 (NVIDIA GeForce RTX 3060)") is not the spec's
    card, or None where it is or may be: the CPU never is; a GPU is where CUDA's name for it
    is the card's model (placer.hardware.cards.same_card), or where the spec names no model
    placer knows ("12 GB card": a preset's generic card, taken to be this GPU)."""
    if spec is None:
        return None
    model = spec.cards[0].model
    if device.startswith("cuda"):
        gpu = name.partition("(")[2].rstrip(")")
        if same_card(model, gpu) or card(model) is None:
            return None
    return f"timed on {name}, but the spec's card is {model!r}"


def check_steps(times: StepTimes) -> None:
    """PlacerError where a step figure is one the spec would refuse to load (an estimate from
    a bandwidth too small for the model: minutes a step)."""
    worst = max(ms for _, ms in times.base_step_ms)
    if worst > MAX_MS:
        raise PlacerError(f"probe --step: a step of {worst:.4g} ms is more than a spec holds "
                          f"({MAX_MS:g} ms): check --memory-bandwidth")


def write_spec(spec: HardwareSpec, req: StepRequest | HostRequest, *, step_note: str = "",
               host_note: str = "") -> None:
    """Write `spec` to --out (atomically; onto --hardware's own file too: it was read
    whole before)."""
    from placer.hardware.spec_toml import spec_toml

    assert req.out is not None
    write_text_atomic(spec_toml(spec, step_note, host_note), req.out,
                      [("the checkpoint", req.model)], what="--out")


def step_inputs(req: StepRequest) -> list[tuple[str, Path | None]]:
    """What `probe --step --out` reads and must not write onto: the checkpoint (the spec,
    read whole before writing, may be rewritten in place)."""
    return [("the checkpoint", req.model)]


def step_bandwidth(req: StepRequest, spec: HardwareSpec | None) -> float:
    """The memory bandwidth an estimate divides by: --memory-bandwidth (a card's: 1 GB/s up
    to 2**60 B/s), else the spec's first card's by its model name."""
    if req.memory_bandwidth is not None:
        rate = parse_rate(req.memory_bandwidth, "--memory-bandwidth")
        if not MIN_CARD_BANDWIDTH <= rate <= MAX_BYTES:
            raise PlacerError(f"--memory-bandwidth: expected a card's memory bandwidth, from "
                              f"1GB/s up to 2**60 B/s, got {req.memory_bandwidth!r}")
        return rate
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
