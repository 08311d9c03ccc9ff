"""A hardware spec written back as the TOML file a user edits (`placer hardware show NAME
--toml`, `placer probe --step --out`, `placer bench --spec-out`).

Loading what `spec_toml` writes gives the very same HardwareSpec (a test checks every preset
and odd figures): sizes and rates are written in the largest unit that reads back to the same
bytes ("32GiB", "53GB/s", else a plain count), times as the shortest decimal that reads back
to the same float after the loader's division by 1e6 or 1e3.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable

from placer.hardware.backends import UNKNOWN
from placer.hardware.spec import Card, HardwareSpec, Host
from placer.hardware.spill import DEFAULT_OS
from placer.units import parse_bytes, parse_rate

SIZE_UNITS = ("TiB", "GiB", "MiB", "KiB")
RATE_UNITS = ("TB", "GB", "MB", "KB")
FLOPS_UNITS = (("PFLOPS", 1e15), ("TFLOPS", 1e12), ("GFLOPS", 1e9), ("MFLOPS", 1e6))
HEADER = ("# A placer hardware spec (docs/hardware.md lists every field). Edit the\n"
          "# figures to your box: `placer probe` measures the cards' copies, `placer probe\n"
          "# --host` the CPU, `placer probe --step` the decode step.\n")
ESTIMATED_COMMENT = (
    "# estimated: figures that stand in for a measurement (the comments say which",
    "# probe measures each; a probe that writes one drops it from this list)")
HOST_RAM_UNSET = ("0: not given (hardware new --host-ram): the llama.cpp solve cannot check "
                  "a pinned (-lm none) option against the host's RAM")


def spec_toml(spec: HardwareSpec, step_comment: str = "", host_comment: str = "",
              card_comment: str = "") -> str:
    """The TOML text of `spec`; `step_comment` is written after `base_step_ms` (e.g. that it
    is an estimate, not a measurement), `host_comment` above the `[host]` table and
    `card_comment` above the cards (how their figures were obtained)."""
    lines = [HEADER.rstrip("\n"), f"name = {_str(spec.name)}",
             f"description = {_str(spec.description)}",
             f"host_ram = {_size(spec.host_ram)}" + (f"  # {HOST_RAM_UNSET}"
                                                     if spec.host_ram == 0 else "")]
    if spec.os != DEFAULT_OS:
        lines.append(f"os = {_str(spec.os)}  # with each card's backend: whether it spills past "
                     "its VRAM")
    if spec.estimated:
        lines += [*ESTIMATED_COMMENT, estimated_line(spec)]
    first = spec.cards[0]
    above = _comment(card_comment)
    if all(_card_fields(c) == _card_fields(first) for c in spec.cards):
        lines += [f"cards = {len(spec.cards)}", "", *above, "[card]", *_card_fields(first)]
    else:
        lines += ["", *above] if above else []
        for card in spec.cards:
            lines += ["", "[[cards]]", *_card_fields(card)]
    for link in spec.links:
        lines += ["", "[[link]]", f"name = {_str(link.name)}",
                  f"cards = [{', '.join(map(str, link.cards))}]",
                  f"bandwidth = {_rate(link.bandwidth)}"]
    lines += ["", *decode_lines(spec, step_comment)]
    if spec.host is not None:
        lines += ["", *host_lines(spec.host, host_comment)]
    if spec.context is not None:
        lines += ["", "[context]", f"tokens = {spec.context.tokens}",
                  f"kv_type = {_str(spec.context.kv_type)}"]
    return "\n".join(lines) + "\n"


def estimated_line(spec: HardwareSpec) -> str:
    """The top-level `estimated = [...]` line of `spec`."""
    return f"estimated = [{', '.join(map(_str, spec.estimated))}]"


def decode_lines(spec: HardwareSpec, step_comment: str = "") -> list[str]:
    """The `[decode]` table of `spec`, `step_comment` beside base_step_ms."""
    steps = ", ".join(f"{b} = {_float(ms)}" for b, ms in spec.base_step_ms)
    comment = f"  # {step_comment}" if step_comment else ""
    lines = ["[decode]", f"base_step_ms = {{ {steps} }}{comment}"]
    if spec.step_spread != (1.0, 1.0):
        lo, hi = spec.step_spread
        lines += [f"spread = [{_float(lo)}, {_float(hi)}]  # where the estimated step may lie, "
                  "as factors of base_step_ms"]
    return lines


def host_lines(host: Host, comment: str = "") -> list[str]:
    """The `[host]` table and its `[[host.expert]]` tables, `comment` above them."""
    lines = [*_comment(comment), "[host]", f"memory_bandwidth = {_rate(host.memory_bandwidth)}",
             f"flops = {_flops(host.flops)}",
             f"sync_us = {_scaled(host.sync_s, 1e6, lambda x: x / 1e6)}",
             f"sockets = {host.sockets}", f"offload_min_batch = {host.offload_min_batch}"]
    for t in host.expert:
        ms = ", ".join(_scaled(s, 1e3, lambda x: x * 1e-3) for s in t.seconds)
        lines += ["", "[[host.expert]]", f"hidden = {t.hidden}", f"inter = {t.inter}",
                  f"dtype = {_str(t.dtype)}", f"tokens = [{', '.join(map(str, t.tokens))}]",
                  f"ms = [{ms}]"]
    return lines


def _comment(text: str) -> list[str]:
    """`text` as TOML comment lines (each line of it one, none for "")."""
    return [f"# {line}" if line else "#" for line in text.splitlines()]


def _card_fields(card: Card) -> list[str]:
    return [f"model = {_str(card.model)}", f"vram = {_size(card.vram)}",
            f"reserved_dense = {_size(card.reserved_dense)}",
            f"reserved_kv = {_size(card.reserved_kv)}",
            f"reserved_activations = {_size(card.reserved_activations)}",
            f"h2d_bandwidth = {_rate(card.h2d_bandwidth)}",
            *([f"h2d_pageable_bandwidth = {_rate(card.h2d_pageable_bandwidth)}"]
              if card.h2d_pageable_bandwidth is not None else []),
            *([f"backend = {_str(card.backend)}"] if card.backend != UNKNOWN else []),
            *([f"spills = {str(card.spills).lower()}"] if card.spills is not None else []),
            f"latency_us = {_scaled(card.latency_s, 1e6, lambda x: x / 1e6)}"]


def _str(text: str) -> str:
    """A TOML basic string: JSON's escapes are TOML's for the characters JSON escapes (",
    backslash, U+0000..U+001F); TOML also forbids a raw DEL (U+007F), which JSON leaves as
    is, so it is written as \\u007f."""
    return json.dumps(text, ensure_ascii=False).replace("\x7f", "\\u007f")


def _size(n: int) -> str:
    for unit in SIZE_UNITS:
        number = _short(n / parse_bytes("1" + unit))
        if n >= parse_bytes("1" + unit) and len(number) <= 6 and parse_bytes(number + unit) == n:
            return _str(number + unit)
    return str(n)


def _rate(bps: float) -> str:
    for unit in RATE_UNITS:
        text = f"{_short(bps / parse_bytes('1' + unit))}{unit}/s"
        if bps >= parse_bytes("1" + unit) and len(text) <= 12 and parse_rate(text) == bps:
            return _str(text)
    return _str(f"{int(bps)}B/s")


def _flops(value: float) -> str:
    for unit, scale in FLOPS_UNITS:
        number = _short(value / scale)
        if value >= scale and float(number) * scale == value:
            return _str(number + unit)
    return _float(value)


def _scaled(value: float, scale: float, back: Callable[[float], float]) -> str:
    """The shortest decimal x with back(x) == value, x near value * scale (the loader divides
    by the scale, which can round: then one of x's float neighbours reads back)."""
    x = value * scale
    candidates = [float(f"{x:.{digits}g}") for digits in range(1, 18)]
    up = down = x
    for _ in range(64):
        up, down = math.nextafter(up, math.inf), math.nextafter(down, -math.inf)
        candidates += [up, down]
    return _float(next((c for c in candidates if back(c) == value), x))


def _short(x: float) -> str:
    """The shortest decimal of `x` ("32", "53.5", "1e-05"), for a number before a unit."""
    text = repr(float(x))
    return text.removesuffix(".0")


def _float(x: float) -> str:
    """A TOML float: the shortest repr that reads back to `x`."""
    return repr(float(x))
