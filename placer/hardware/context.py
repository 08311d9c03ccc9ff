"""A spec's reserves from the model itself: the KV cache at a context (placer/checkpoint/kv.py)
and, for `hardware new --model`, the dense weights the model's tensors hold. `solve --ctx` and
`plan --ctx` replace the spec's reserved_kv this way (`with_context`); `hardware new --model`
computes both reserves (`model_reserve`) instead of taking shares of VRAM.

Over several cards each reserve is split in proportion to each card's VRAM, rounded up
(llama.cpp's default -ts splits layers, and with them their dense weights and KV, by the
devices' memory)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

from placer.checkpoint.kv import Context, check_ctx, check_kv_type, kv_bytes
from placer.errors import PlacerError
from placer.hardware.spec import HardwareSpec
from placer.units import format_bytes

if TYPE_CHECKING:
    from placer.checkpoint.experts import Inventory

OPTIONS = "--ctx/--kv-type"  # what sizes the KV cache, unless a caller says otherwise
DEFAULT_CTX = 4096  # hardware new --model without --ctx: the context its KV reserve is for


def split_over(total: int, vram: list[int]) -> list[int]:
    """`total` bytes split over cards in proportion to their `vram`, each share rounded up."""
    whole = sum(vram)
    return [-(-total * v // whole) for v in vram]


def with_context(spec: HardwareSpec, config: dict, ctx: int | None, kv_type: str | None,
                 v_type: str | None = None, *, said: str = OPTIONS
                 ) -> tuple[HardwareSpec, str | None]:
    """`spec` with reserved_kv the KV cache of the model of `config` at --ctx `ctx` tokens of
    --kv-type `kv_type` (V of `v_type` where given: llama-server's -ctv), the spec's [context]
    filling what is not given, and the line that says so (`said`: the options it came from);
    `spec` and None where neither option is given (the spec's reserves stand)."""
    if ctx is None and kv_type is None:
        return spec, None
    base = spec.context
    if ctx is None and base is None:
        raise PlacerError("--kv-type: give --ctx N too (the spec names no context to size the "
                          "KV cache for)")
    context = Context(check_ctx(ctx) if ctx is not None else base.tokens,
                      check_kv_type(kv_type) if kv_type is not None
                      else base.kv_type if base is not None else "f16")
    v_type = context.kv_type if v_type is None else check_kv_type(v_type)
    total = kv_bytes(config, context.tokens, context.kv_type, v_type=v_type)
    shares = split_over(total, [c.vram for c in spec.cards])
    cards = tuple(dataclasses.replace(c, reserved_kv=s) for c, s in zip(spec.cards, shares,
                                                                        strict=True))
    for c in cards:
        if c.free_bytes < 0:
            where = f"--ctx {context.tokens}" if said == OPTIONS else said
            raise PlacerError(f"{where}: card {c.index}'s KV cache "
                              f"({format_bytes(c.reserved_kv)}) and the spec's other reserves "
                              f"exceed its {format_bytes(c.vram)} of VRAM")
    was = sorted({format_bytes(c.reserved_kv) for c in spec.cards})
    types = (f"{context.kv_type} K and V" if v_type == context.kv_type
             else f"{context.kv_type} K, {v_type} V")
    note = (f"context {context.tokens} tokens, {types} ({said}): "
            f"reserved_kv {format_bytes(shares[0])}"
            + (" per card" if len(cards) > 1 else "")
            + f", llama.cpp's KV cache of this model ({format_bytes(total)} in all, computed "
            f"from its config) in place of the spec's {'/'.join(was)}; the budget is what "
            "VRAM is left")
    return dataclasses.replace(spec, cards=cards, context=context), note


@dataclass(frozen=True)
class ModelReserve:
    """`hardware new --model`'s reserves per card, the context the KV one is for, and where
    each came from (the spec's comments)."""

    dense: tuple[int, ...]
    kv: tuple[int, ...]
    context: Context
    notes: tuple[str, ...]


def model_reserve(inv: Inventory, model: str, vram: list[int], ctx: int | None,
                  kv_type: str | None) -> ModelReserve:
    """The dense and KV reserves of the model `inv` (read from `model`) on cards of `vram`:
    its dense tensors' bytes, its KV cache at `ctx` tokens (DEFAULT_CTX where not given) of
    `kv_type` (f16 where not given)."""
    context = Context(DEFAULT_CTX if ctx is None else check_ctx(ctx),
                      "f16" if kv_type is None else check_kv_type(kv_type))
    total_kv = kv_bytes(inv.config, context.tokens, context.kv_type)
    split = f", split over {len(vram)} cards by VRAM" if len(vram) > 1 else ""
    said = "--ctx" if ctx is not None else f"the default ({DEFAULT_CTX}); --ctx sets it"
    notes = (
        f"reserved_dense: {inv.dense_bytes} bytes ({format_bytes(inv.dense_bytes)}), the "
        f"dense (non-expert) tensors of {model}{split}: "
        + ("ESTIMATED from its config.json at the dtypes given (no weights read)"
           if inv.estimated else "exact"),
        f"reserved_kv: {total_kv} bytes ({format_bytes(total_kv)}), llama.cpp's KV cache "
        f"for {context.tokens} tokens ({said}) of {context.kv_type} K and V, from the "
        f"model's config (placer/checkpoint/kv.py){split}",
    )
    return ModelReserve(tuple(split_over(inv.dense_bytes, vram)),
                        tuple(split_over(total_kv, vram)), context, notes)
