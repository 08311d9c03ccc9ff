"""A spec from what a user knows of their box (`placer hardware new --card "RTX 3060" --pcie
3.0x16 --ram ddr4-3200x2 --cpu-cores 8`): the card's published figures from
placer/hardware/cards.py, the link's and the host memory's peaks from their standards, and
typical shares and defaults for what only a measurement knows, each marked ESTIMATED with
the `placer probe` that replaces it (`NewSpec.notes`, written into the spec as comments).

The decode step (`[decode] base_step_ms`, which every spec needs) depends on the model: with
a model's inventory it is estimated from the card's memory bandwidth as `probe --step
--estimate` does (placer/checkpoint/step.py: the bytes a step reads, a floor); without one,
from the dense weights the card reserves, read once a step: a floor of a floor, to be
replaced by `placer probe --step`.

What it writes loads: `new_spec` refuses, naming the option, a value the loader (and so
`solve --hardware`) would refuse (a --host-ram past 2**60 bytes), and reads its own TOML back
through the loader before it is printed or written (`check_loads`).
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass

from placer.errors import PlacerError
from placer.hardware.cards import (
    DDR_SOURCE,
    H2D_SHARE,
    PCIE_SOURCE,
    STREAM_SHARE,
    CardFigures,
    ddr_memory,
    pcie_link,
)
from placer.hardware.spec import ESTIMABLE, Card, HardwareSpec, Host, parse_spec
from placer.hardware.spec_toml import spec_toml
from placer.hardware.spec_values import MAX_BYTES

GIB = 2**30
RESERVED_SHARES = {"reserved_dense": 0.15, "reserved_kv": 0.10, "reserved_activations": 0.05}
LATENCY_US = 10.0     # per copy, typical of a PCIe card (the presets' figure)
SYNC_US = 30.0        # a layer's hand-off to the CPU and back, typical
FLOPS_PER_CORE = 6e10  # effective bf16 FLOP/s of a desktop core in torch (1 TFLOPS on 16)
BATCHES = (1, 8)


@dataclass(frozen=True)
class NewSpec:
    """The spec and, for each of its figures, where it came from."""

    spec: HardwareSpec
    card_notes: tuple[str, ...]
    host_notes: tuple[str, ...]
    step_note: str


def new_spec(card: CardFigures, cards: int, pcie: str, ram: str, cpu_cores: int,
             host_ram: int, steps: tuple[tuple[int, float], ...] | None = None,
             step_how: str = "") -> NewSpec:
    """The spec of `cards` x `card` on `pcie` links with `ram` host memory and `cpu_cores`
    cores; `steps` (batch, ms) where a model's step was estimated (`step_how` says how),
    else the dense-reserve floor (module docstring)."""
    if not 0 <= host_ram <= MAX_BYTES:
        raise PlacerError(f"--host-ram: expected a size up to 2**60 bytes (what a spec "
                          f"holds), got {host_ram:.3g} bytes")
    gen, lanes, link_peak = pcie_link(pcie)
    kind, rate, channels, ram_peak = ddr_memory(ram)
    vram = round(card.vram_gib * GIB)
    reserved = {k: round(share * card.vram_gib * 4) * GIB // 4
                for k, share in RESERVED_SHARES.items()}
    h2d = float(f"{link_peak * H2D_SHARE / 1e9:.3g}") * 1e9
    built = tuple(Card(i, card.name, vram, reserved["reserved_dense"], reserved["reserved_kv"],
                       reserved["reserved_activations"], h2d, LATENCY_US / 1e6)
                  for i in range(cards))
    stream = float(f"{ram_peak * STREAM_SHARE / 1e9:.3g}") * 1e9
    host = Host(memory_bandwidth=stream, flops=FLOPS_PER_CORE * cpu_cores,
                sync_s=SYNC_US / 1e6)
    if steps is None:
        floor = float(f"{1e3 * reserved['reserved_dense'] / card.bandwidth:.4g}")
        steps = tuple((b, floor) for b in BATCHES)
        step_how = (f"ESTIMATED (no --model): the {reserved['reserved_dense'] / GIB:g} GiB of "
                    f"dense weights the card reserves, read once a step at its "
                    f"{card.bandwidth_gbps:g} GB/s (a floor); `placer probe --step --model M "
                    "--hardware THIS.toml --out THIS.toml` on the box replaces it")
    spec = HardwareSpec(
        name=f"{cards}x-{card.name.lower().replace(' ', '-')}",
        description=(f"{cards} x {card.name} ({card.vram_gib:g} GB) on PCIe {gen} x{lanes}, "
                     f"{kind.upper()}-{rate} x {channels} channels, {cpu_cores} cores "
                     "(placer hardware new: ESTIMATED figures)"),
        host_ram=host_ram, cards=built, links=(), base_step_ms=steps, host=host,
        estimated=tuple(ESTIMABLE))
    made = NewSpec(spec, card_notes(card, gen, lanes, link_peak), host_notes(
        kind, rate, channels, ram_peak, cpu_cores), step_how)
    check_loads(made)
    return made


# The option each field of a made spec comes from, for an error naming the option.
FIELD_OPTIONS = (("host_ram", "--host-ram"), ("cards", "--card/--cards/--pcie"),
                 ("host.flops", "--cpu-cores"), ("host", "--ram/--cpu-cores"),
                 ("decode", "--model"))


def check_loads(made: NewSpec) -> None:
    """PlacerError, naming the option, unless the TOML of `made` loads as a spec (the check
    `solve --hardware` makes of the file)."""
    text = spec_toml(made.spec, made.step_note, "\n".join(made.host_notes),
                     "\n".join(made.card_notes))
    try:
        parse_spec(tomllib.loads(text), "the spec")
    except PlacerError as exc:
        field = str(exc).removeprefix("the spec: ")
        option = next((o for f, o in FIELD_OPTIONS if field.startswith(f)), "hardware new")
        raise PlacerError(f"{option}: the spec these options make would not load ({field})"
                          ) from None


def card_notes(card: CardFigures, gen: str, lanes: int, link_peak: float) -> tuple[str, ...]:
    """Where each card figure came from."""
    bf16 = "not published" if card.bf16_tflops is None else f"{card.bf16_tflops:g} TFLOPS"
    int8 = "not published" if card.int8_tops is None else f"{card.int8_tops:g} TOPS"
    return (
        f"{card.name}: vram {card.vram_gib:g} GB, memory bandwidth {card.bandwidth_gbps:g} "
        f"GB/s, dense bf16 {bf16}, int8 {int8}: {card.source}"
        + (f" ({card.derived})" if card.derived else ""),
        f"h2d_bandwidth: ESTIMATED, {H2D_SHARE:g} x PCIe {gen} x{lanes}'s "
        f"{link_peak / 1e9:.2f} GB/s peak ({PCIE_SOURCE}); `placer probe` on the box "
        "measures it",
        f"latency_us: ESTIMATED, {LATENCY_US:g} us a copy, typical; `placer probe` measures it",
        "reserved_*: ESTIMATED, " + ", ".join(f"{k.removeprefix('reserved_')} "
                                              f"{100 * v:g}%" for k, v in
                                              RESERVED_SHARES.items())
        + " of VRAM: set them to your model's dense weights, KV cache and buffers",
    )


def host_notes(kind: str, rate: int, channels: int, ram_peak: float, cores: int
               ) -> tuple[str, ...]:
    """Where each host figure came from."""
    return (
        f"memory_bandwidth: ESTIMATED, {STREAM_SHARE:g} x {kind.upper()}-{rate} x {channels} "
        f"channels' {ram_peak / 1e9:.1f} GB/s peak ({DDR_SOURCE}); `placer probe --host "
        "--hardware THIS.toml --out THIS.toml` measures it",
        f"flops: ESTIMATED, {cores} cores x {FLOPS_PER_CORE / 1e9:g} GFLOP/s (a desktop "
        "core's effective bf16 rate in torch); `placer probe --host` measures it",
        f"sync_us: ESTIMATED, {SYNC_US:g} us, typical; `placer probe --host` measures it where "
        "a GPU is visible",
        "no [[host.expert]] curve: `placer probe --host --model M` times your model's experts",
    )
