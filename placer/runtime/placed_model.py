"""A placed model ready to generate: checked, loaded, its experts bound to the runtime.

`load_placed_model` is what `placer run`, `placer serve` and `placer bench` share: the
placed directory must have been made from this very checkpoint (fingerprint, then every
file's size and sha256), the runtime loads its cards and the causal LM its dense weights,
the routed experts come from the runtime's tables, and the tokenizer comes along.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from placer.checkpoint.config import read_config
from placer.checkpoint.inventory import read_inventory
from placer.checkpoint.step import free_memory
from placer.errors import PlacerError
from placer.placed.manifest import read_manifest
from placer.plan.placement import Plan, check_cache_slots, plan_from_json
from placer.runtime.experts import StagedExperts
from placer.runtime.integrity import check_integrity, check_layout
from placer.runtime.loader import PlacedRuntime, load_placed
from placer.runtime.patch import load_staged_model
from placer.runtime.prefetch import run_prefetch
from placer.units import format_bytes
from traces.options import kv_bytes_per_token


@dataclass
class PlacedModel:
    """The model, the runtime its routed experts come from (its device, its cache:
    runtime.cache), its tokenizer, and the checkpoint directory it was loaded from."""

    model: nn.Module
    runtime: PlacedRuntime
    tokenizer: Any
    checkpoint: Path

    @property
    def device(self) -> torch.device:
        return self.runtime.device

    def tables(self) -> list:
        """The per-layer expert tables (placer.runtime.tables), in layer order."""
        return [m.table for m in self.model.modules()
                if isinstance(m, StagedExperts) and m.table is not None]


def resolve_device(name: str) -> torch.device:
    """`auto` is cuda where there is one, else cpu; anything else as torch reads it."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise PlacerError(f"--device: cannot read {name!r} as a torch device") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise PlacerError(f"--device {name}: this host has no CUDA device")
    return device


def check_cache_memory(plan: Plan, cache_slots: int | None, device: torch.device) -> None:
    """PlacerError, before anything is loaded or hashed, where `cache_slots` slots on every
    card (--cache-slots) are more than the plan's experts (check_cache_slots) or more than
    `device`'s free memory holds: each slot keeps one expert's weights, its largest, and every
    card's slots live on the one device."""
    if cache_slots is None:
        return
    check_cache_slots(plan, cache_slots)
    need = cache_slots * len(plan.cards) * int(plan.matrix("bytes").max(initial=0))
    free = free_memory(str(device))
    if need > free:
        raise PlacerError(f"--cache-slots {cache_slots}: {len(plan.cards)} cards x "
                          f"{cache_slots} slots of up to {format_bytes(plan.matrix('bytes').max())}"
                          f" need {format_bytes(need)} on {device}, which has "
                          f"{format_bytes(free)} free")


def check_generation_memory(checkpoint: Path, tokens: int, device: torch.device,
                            option: str = "--max-new-tokens") -> None:
    """PlacerError, before anything is loaded, where `tokens` generated tokens' key/value
    cache (traces.options.kv_bytes_per_token, a floor) is more than `device`'s free memory: a count
    bounded by what it allocates, not a generation that runs until memory is gone."""
    per_token = kv_bytes_per_token(read_config(Path(checkpoint) / "config.json"))
    free = free_memory(str(device))
    if per_token * tokens > free:
        raise PlacerError(f"{option} {tokens}: their key/value cache alone takes "
                          f"{format_bytes(per_token)} a token, {format_bytes(per_token * tokens)}"
                          f" in all, more than the {format_bytes(free)} free on {device}")


def load_placed_model(placed: Path, checkpoint: Path, *, device: str = "auto",
                      cache_slots: int | None = None, prefetch: bool | None = None,
                      **kwargs: Any) -> PlacedModel:
    """Check and load `placed` for `checkpoint` (see module docstring); `cache_slots` None
    takes the manifest's cache (slots per card and layer, and policy); `prefetch`: prefetch
    the next MoE layer's experts (True, False; None: as the plan decided: run_prefetch);
    `kwargs` go to `from_pretrained` (e.g. `attn_implementation`)."""
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # stdout/stderr stay the command's own (--json)
    torch_device = resolve_device(device)
    manifest = read_manifest(placed)
    plan = plan_from_json(manifest)
    check_cache_memory(plan, cache_slots, torch_device)
    inv = read_inventory(checkpoint, gguf=False)
    if inv.fingerprint != manifest["model"]["fingerprint"]:
        raise PlacerError(f"{placed} was placed for model {manifest['model']['fingerprint']}, "
                          f"but {checkpoint} is model {inv.fingerprint}")
    check_integrity(placed, checkpoint, manifest)
    check_layout(placed, manifest, inv)
    runtime = load_placed(placed, device=torch_device, cache_slots=cache_slots,
                          prefetch=run_prefetch(plan, prefetch))
    model = load_staged_model(checkpoint, runtime, device=str(torch_device), **kwargs)
    tokenizer = AutoTokenizer.from_pretrained(checkpoint, local_files_only=True)
    return PlacedModel(model, runtime, tokenizer, Path(checkpoint))
