"""A spec from what a user knows of their box (`placer hardware new --card "RTX 3060" --pcie
3.0x16 --ram ddr4-3200x2 --cpu-cores 8`): the card's published figures from
placer/hardware/cards.py, the link's and the host memory's peaks from their standards, and
typical shares and defaults for what only a measurement knows, each marked ESTIMATED with
the `placer probe` that replaces it (`NewSpec.notes`, written into the spec as comments).

The decode step (`[decode] base_step_ms`, which every spec needs) depends on the model and the
backend llama.cpp runs the card with (`--backend`, by default the card vendor's: NVIDIA cuda,
AMD rocm, Apple metal, Intel vulkan; placer/hardware/backends.py): with a model's inventory it
is estimated as `probe --step --estimate` does (placer/checkpoint/step.py: the bytes a step
reads at the backend's fitted share of the card's bandwidth, plus each layer's fitted fixed
cost); without one, the dense weights the card reserves, read so, over FLOOR_LAYERS layers (a
7B model's). Either way `[decode] spread` is the fit's range, and `placer probe --step`
replaces both. The backend is written into `[card]`; its upload cost and sync stand in for
the card's latency_us and the host's sync_us.

The reserves: with a model (`--model`), reserved_dense is its dense tensors' bytes and
reserved_kv llama.cpp's KV cache at `--ctx` tokens of `--kv-type` (placer/hardware/context.py,
recorded as the spec's `[context]`; the spec's `card.reserved` is then not marked estimated);
without one, shares of VRAM marked ESTIMATED. reserved_activations is always a share
(llama.cpp's compute buffers depend on the backend).

What it writes loads: `new_spec` refuses, naming the option, a value the loader (and so
`solve --hardware`) would refuse (a --host-ram past 2**60 bytes), and reads its own TOML back
through the loader before it is printed or written (`check_loads`).
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from placer.checkpoint.step import significant, step_ms
from placer.errors import PlacerError
from placer.hardware.backends import backend as backend_named
from placer.hardware.backends import default_backend, fit_for
from placer.hardware.cards import (
    DDR_SOURCE,
    H2D_SHARE,
    PCIE_SOURCE,
    STREAM_SHARE,
    CardFigures,
    ddr_memory,
    pcie_link,
)
from placer.hardware.context import ModelReserve
from placer.hardware.spec import ESTIMABLE, Card, HardwareSpec, Host, parse_spec
from placer.hardware.spec_toml import spec_toml
from placer.hardware.spec_values import MAX_BYTES
from placer.hardware.step_estimate import spec_steps
from placer.units import format_bytes

if TYPE_CHECKING:
    from placer.checkpoint.experts import Inventory

GIB = 2**30
RESERVED_SHARES = {"reserved_dense": 0.15, "reserved_kv": 0.10, "reserved_activations": 0.05}
FLOPS_PER_CORE = 6e10  # effective bf16 FLOP/s of a desktop core in torch (1 TFLOPS on 16)
BATCHES = (1, 8)
FLOOR_LAYERS = 32  # decoder layers of the step without --model (LLaMA 7B's)


@dataclass(frozen=True)
class ModelFigures:
    """What `hardware new --model` (or `--config`) takes from the model: its inventory (the
    step is estimated from it on the spec made: placer/hardware/step_estimate.py), where it
    was read, and the dense and KV reserves."""

    inv: Inventory
    source: str
    reserve: ModelReserve


def model_figures(inv: Inventory, source: str, card: CardFigures, cards: int,
                  ctx: int | None, kv_type: str | None) -> ModelFigures:
    """The reserves of the model `inv` (read from `source`) on `cards` x `card`."""
    from placer.hardware.context import model_reserve

    return ModelFigures(inv, source, model_reserve(inv, source, [round(card.vram_gib * GIB)]
                                                   * cards, ctx, kv_type))


@dataclass(frozen=True)
class NewSpec:
    """The spec and, for each of its figures, where it came from."""

    spec: HardwareSpec
    card_notes: tuple[str, ...]
    host_notes: tuple[str, ...]
    step_note: str


def step_inputs(card: CardFigures, backend: str, ram: str, cpu_cores: int
                ) -> tuple[float, float | None]:
    """(bytes/s, FLOP/s or None) a step on `card` with `backend` reads and computes at: the
    card's (dense bf16 tensor FLOP/s where published), or on cpu the host memory's peak and
    its cores' FLOP/s."""
    if backend == "cpu":
        return ddr_memory(ram)[3], FLOPS_PER_CORE * cpu_cores
    return card.bandwidth, None if card.bf16_tflops is None else card.bf16_tflops * 1e12


def new_spec(card: CardFigures, cards: int, pcie: str, ram: str, cpu_cores: int,
             host_ram: int, backend: str | None = None, model: ModelFigures | None = None
             ) -> NewSpec:
    """The spec of `cards` x `card` run with `backend` (None: its vendor's default) on `pcie`
    links with `ram` host memory and `cpu_cores` cores; with `model`, its dense and KV
    reserves and its step estimated on the spec (module docstring), else shares of VRAM and
    the dense-reserve step."""
    if not 0 <= host_ram <= MAX_BYTES:
        raise PlacerError(f"--host-ram: expected a size up to 2**60 bytes (what a spec "
                          f"holds), got {host_ram:.3g} bytes")
    name = backend or default_backend(card)
    costs = backend_named(name)
    gen, lanes, link_peak = pcie_link(pcie)
    kind, rate, channels, ram_peak = ddr_memory(ram)
    vram = round(card.vram_gib * GIB)
    reserved = {k: round(share * card.vram_gib * 4) * GIB // 4
                for k, share in RESERVED_SHARES.items()}
    h2d = float(f"{link_peak * H2D_SHARE / 1e9:.3g}") * 1e9
    reserve = model.reserve if model else None
    dense = reserve.dense if reserve else (reserved["reserved_dense"],) * cards
    kv = reserve.kv if reserve else (reserved["reserved_kv"],) * cards
    if reserve and dense[0] + kv[0] + reserved["reserved_activations"] > vram:
        raise PlacerError(f"--ctx {reserve.context.tokens}: the model's dense weights "
                          f"({format_bytes(dense[0])}) and KV cache ({format_bytes(kv[0])}) "
                          f"per card, with {format_bytes(reserved['reserved_activations'])} "
                          f"of buffers, exceed the {card.name}'s {card.vram_gib:g} GB")
    built = tuple(Card(i, card.name, vram, dense[i], kv[i], reserved["reserved_activations"],
                       h2d, costs.upload_us / 1e6, backend=name)
                  for i in range(cards))
    stream = float(f"{ram_peak * STREAM_SHARE / 1e9:.3g}") * 1e9
    host = Host(memory_bandwidth=stream, flops=FLOPS_PER_CORE * cpu_cores,
                sync_s=costs.sync_us / 1e6)
    fit = fit_for(card, name)  # the dense-reserve step, which a model's replaces below
    bandwidth, _ = step_inputs(card, name, ram, cpu_cores)
    floor = significant(step_ms(reserved["reserved_dense"], FLOOR_LAYERS, bandwidth,
                                fit.step_fit()))
    steps, step_spread = tuple((b, floor) for b in BATCHES), fit.spread
    step_how = (f"ESTIMATED (no --model): the {reserved['reserved_dense'] / GIB:g} GiB of "
                f"dense weights the card reserves, read at {fit.share:g} x its "
                f"{card.bandwidth_gbps:g} GB/s, plus {FLOOR_LAYERS} layers x "
                f"{fit.layer_us:g} us ({fit.step_fit().name}); `placer probe --step "
                "--model M --hardware THIS.toml --out THIS.toml` on the box replaces it")
    spec = HardwareSpec(
        name=f"{cards}x-{card.name.lower().replace(' ', '-')}",
        description=(f"{cards} x {card.name} ({card.vram_gib:g} GB) on PCIe {gen} x{lanes}, "
                     f"{kind.upper()}-{rate} x {channels} channels, {cpu_cores} cores "
                     "(placer hardware new: ESTIMATED figures)"),
        host_ram=host_ram, cards=built, links=(), base_step_ms=steps, host=host,
        estimated=tuple(e for e in ESTIMABLE if not (
            reserve and e == "card.reserved" and "ESTIMATED" not in reserve.notes[0])),
        context=reserve.context if reserve else None, step_spread=step_spread)
    if model is not None:
        times = spec_steps(model.inv, spec, BATCHES, f"hardware new, {card.name} on {name}")
        spec = replace(spec, base_step_ms=times.base_step_ms, step_spread=times.step_spread)
        step_how = times.note() + "; `placer probe --step` on the box replaces it"
    made = NewSpec(spec, card_notes(card, gen, lanes, link_peak, name, reserve), host_notes(
        kind, rate, channels, ram_peak, cpu_cores, name), step_how)
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


def card_notes(card: CardFigures, gen: str, lanes: int, link_peak: float, backend: str,
               reserve: ModelReserve | None = None) -> tuple[str, ...]:
    """Where each card figure came from (the reserves: `reserve`'s notes where the model
    gave them)."""
    guessed = ("reserved_activations",) if reserve else tuple(RESERVED_SHARES)
    bf16 = "not published" if card.bf16_tflops is None else f"{card.bf16_tflops:g} TFLOPS"
    int8 = "not published" if card.int8_tops is None else f"{card.int8_tops:g} TOPS"
    return (
        f"{card.name}: vram {card.vram_gib:g} GB, memory bandwidth {card.bandwidth_gbps:g} "
        f"GB/s, dense bf16 {bf16}, int8 {int8}: {card.source}"
        + (f" ({card.derived})" if card.derived else ""),
        f"h2d_bandwidth: ESTIMATED, {H2D_SHARE:g} x PCIe {gen} x{lanes}'s "
        f"{link_peak / 1e9:.2f} GB/s peak ({PCIE_SOURCE}); `placer probe` on the box "
        "measures it",
        f"backend: {backend} (--backend; placer/hardware/data/backends.csv: "
        f"{backend_named(backend).source})",
        f"latency_us: ESTIMATED, {backend}'s {backend_named(backend).upload_us:g} us an upload "
        "(backends.csv); `placer probe` measures it",
        *(reserve.notes if reserve else ()),
        "reserved_*: ESTIMATED, " + ", ".join(f"{k.removeprefix('reserved_')} "
                                              f"{100 * RESERVED_SHARES[k]:g}%" for k in guessed)
        + " of VRAM: " + ("llama.cpp's compute buffers, which the backend sizes" if reserve
                          else "set them to your model's dense weights, KV cache and buffers "
                          "(`hardware new --model M --ctx N` computes the first two)"),
    )


def host_notes(kind: str, rate: int, channels: int, ram_peak: float, cores: int,
               backend: str) -> tuple[str, ...]:
    """Where each host figure came from."""
    return (
        f"memory_bandwidth: ESTIMATED, {STREAM_SHARE:g} x {kind.upper()}-{rate} x {channels} "
        f"channels' {ram_peak / 1e9:.1f} GB/s peak ({DDR_SOURCE}); `placer probe --host "
        "--hardware THIS.toml --out THIS.toml` measures it",
        f"flops: ESTIMATED, {cores} cores x {FLOPS_PER_CORE / 1e9:g} GFLOP/s (a desktop "
        "core's effective bf16 rate in torch); `placer probe --host` measures it",
        f"sync_us: ESTIMATED, {backend}'s {backend_named(backend).sync_us:g} us "
        "(placer/hardware/data/backends.csv); `placer probe --host` measures it where a GPU is "
        "visible",
        "no [[host.expert]] curve: `placer probe --host --model M` times your model's experts",
    )
