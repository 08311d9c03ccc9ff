"""`placer probe --step` and `--host`: measure (or estimate) a spec's `[decode]` or `[host]`
table and write it into a copy of the spec, each figure saying what it measured.

A step time is the spec's card's only if it was timed on that card: a step measured on the
CPU (or on another GPU) for a spec that names an RTX 3060 mispredicts every tok/s by the
ratio of the two. So `--step --out` refuses to write one, before measuring, unless
`--allow-other-device` says so (then the spec's comment says so too); printed without --out,
it comes with a warning.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from placer.errors import PlacerError
from placer.files import check_apart, write_text_atomic
from placer.hardware.cards import card, same_card
from placer.hardware.devices import check_device
from placer.hardware.spec import MAX_MS, spec_of_text, spec_text
from placer.hardware.spec_values import MAX_BYTES
from placer.hardware.step_estimate import spec_steps
from placer.hardware.timing import DEFAULT_SHAPE
from placer.units import parse_rate

if TYPE_CHECKING:
    from placer.checkpoint.step import StepTimes
    from placer.hardware.probe import HostProbe
    from placer.hardware.spec import HardwareSpec

MAX_STEP_BATCH = 1024  # a stand-in decode step of more sequences is not a spec's figure
MIN_CARD_BANDWIDTH = 1e9  # bytes/s of a card's memory below this are a typo (a 2005 GPU: 8 GB/s)


def check_spec_out(out: Path, hardware: str | None) -> None:
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


@dataclass(frozen=True)
class HostRequest:
    """`placer probe --host`'s options."""

    dtype: str
    mb: int | None
    tokens: int
    expert: list[str] | None
    expert_tokens: tuple[int, ...]
    model: Path | None
    gguf_type: str | None
    hardware: str | None
    out: Path | None


def probe_host_spec(req: HostRequest, say: Callable[[str], None] = lambda line: print(
        line, file=sys.stderr)) -> HostProbe:
    """`placer probe --host`: measure the host; with --out, write it into a copy of
    --hardware's spec there (a merge, never a second `[host]`)."""
    from placer.hardware.probe import parse_shape, probe_host

    if req.model is not None and (req.expert or req.gguf_type):
        raise PlacerError("--model gives the experts' shape (and a GGUF's type): drop "
                          "--expert and --gguf-type")
    text = spec_text(req.hardware) if req.hardware is not None else None
    spec = spec_of_text(text, req.hardware) if text is not None else None
    if req.model is not None:
        shapes, gguf_type, source = model_experts(req.model)
    else:
        shapes = tuple(parse_shape(e) for e in req.expert) if req.expert else (DEFAULT_SHAPE,)
        gguf_type, source = req.gguf_type, ""
    result = probe_host(req.dtype, None if req.mb is None else req.mb * 2**20, req.tokens,
                        experts=shapes, expert_tokens=req.expert_tokens,
                        gguf_type=gguf_type, source=source)
    if req.out is not None:
        assert spec is not None and text is not None
        measured = ("host.memory_bandwidth", "host.flops",
                    *(("host.sync_us",) if result.sync_measured else ()))
        write_spec(merged_host(spec, result).measured(*measured), text, req, say,
                   host_note=host_note(result))
    return result


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
    batch: tuple[int, ...] | None
    device: str
    memory_bandwidth: str | None
    estimate: bool
    out: Path | None
    allow_other_device: bool = False


@dataclass(frozen=True)
class StepProbe:
    """What `probe --step` measured: the times, the spec comment, and why the device was not
    the spec's card (None where it was or may be)."""

    times: StepTimes
    note: str
    other_device: str | None

    def to_json(self, out: Path | None) -> dict:
        t = self.times
        return {"base_step_ms": {str(b): ms for b, ms in t.base_step_ms},
                "estimated": t.estimated, "noisy": t.noisy, "device": t.device or None,
                "other_device": self.other_device, "spread": {str(b): s for b, s in t.spread},
                "steps": {str(b): n for b, n in t.steps}, "how": t.how,
                "step_spread": list(t.step_spread),
                "out": None if out is None else str(out)}


def probe_step(req: StepRequest, say: Callable[[str], None] = lambda line: print(
        line, file=sys.stderr)) -> StepProbe:
    """`placer probe --step`: measure (or estimate) base_step_ms; with --out, write it into
    a copy of --hardware's spec there. A measurement on another device than the spec's card
    is refused for --out (unless --allow-other-device) before anything runs; `say` hears
    which device is timed."""
    from placer.checkpoint.inventory import read_inventory
    from placer.checkpoint.step import fits, measure_steps
    from placer.hardware.devices import device_name

    if req.model is None:
        raise PlacerError("--step needs --model, the checkpoint whose decode step to time")
    text = spec_text(req.hardware) if req.hardware is not None else None
    spec = spec_of_text(text, req.hardware) if text is not None else None
    batches = req.batch or (
        tuple(b for b, _ in spec.base_step_ms) if spec is not None else (1, 8))
    if any(not 1 <= b <= MAX_STEP_BATCH for b in batches):
        raise PlacerError(f"--batch: batches must lie in 1..{MAX_STEP_BATCH}, got {batches}")
    check_device(req.device)
    bandwidth = given_bandwidth(req.memory_bandwidth)
    if req.out is not None:
        check_apart(req.out, [("the checkpoint", req.model)], what="--out")
    inv = read_inventory(req.model)
    device = resolve_device(req.device)
    gguf = req.model.suffix == ".gguf"
    warning = None
    if req.estimate or gguf or not fits(inv, device):
        why = ("--estimate" if req.estimate else "a GGUF file is not run here" if gguf
               else f"the model does not fit {device} here")
        times = spec_steps(inv, spec, batches, why, bandwidth)
    else:
        name = device_name(device)
        warning = other_device(spec, device, name)
        if warning and req.out is not None and not req.allow_other_device:
            raise PlacerError(f"probe --step: {warning}; not written to {req.out}: time it on "
                              "the card (--device cuda), or --estimate from its memory "
                              "bandwidth, or --allow-other-device to write it marked as such")
        say(f"probe --step: timing on {name}")
        times = measure_steps(inv, device, batches, device_label=name)
    check_steps(times)
    note = times.note() + (f"; NOT THE SPEC'S CARD ({warning}; --allow-other-device)"
                           if warning else "")
    if req.out is not None:
        assert spec is not None and text is not None
        stepped = dataclasses.replace(spec, base_step_ms=times.base_step_ms,
                                      step_spread=times.step_spread)
        if times.estimated and "base_step_ms" not in spec.estimated:
            stepped = dataclasses.replace(stepped, estimated=(*spec.estimated, "base_step_ms"))
        write_spec(stepped if times.estimated else stepped.measured("base_step_ms"), text, req,
                   say, step_note=note)
    return StepProbe(times, note, warning)


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


def write_spec(spec: HardwareSpec, text: str, req: StepRequest | HostRequest,
               say: Callable[[str], None], *, step_note: str | None = None,
               host_note: str | None = None) -> None:
    """Write `spec` to --out as --hardware's `text` with the measured tables rewritten, its
    other lines and comments kept (placer/hardware/spec_update.py; `say` warns where they
    could not be), atomically (onto --hardware's own file too: it was read whole before);
    the checkpoint is never written onto."""
    from placer.hardware.spec_update import updated_text

    assert req.out is not None and req.hardware is not None
    written, kept = updated_text(text, spec, req.hardware, step_note=step_note,
                                 host_note=host_note)
    if not kept:
        say(f"warning: {req.hardware}'s lines could not be edited in place (its tables are not "
            f"written as [table] headers?): {req.out} is the spec written afresh, its other "
            "comments dropped")
    write_text_atomic(written, req.out, [("the checkpoint", req.model)], what="--out")


def given_bandwidth(text: str | None) -> float | None:
    """--memory-bandwidth (a card's: 1 GB/s up to 2**60 B/s), or None where not given."""
    if text is None:
        return None
    rate = parse_rate(text, "--memory-bandwidth")
    if not MIN_CARD_BANDWIDTH <= rate <= MAX_BYTES:
        raise PlacerError(f"--memory-bandwidth: expected a card's memory bandwidth, from "
                          f"1GB/s up to 2**60 B/s, got {text!r}")
    return rate


def resolve_device(name: str) -> str:
    """auto: cuda where a CUDA device is visible, else cpu."""
    if name != "auto":
        return name
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"
