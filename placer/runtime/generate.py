"""`placer run`: greedy generation through the staging runtime, with its counters."""

from __future__ import annotations

from pathlib import Path

import torch

from placer.errors import PlacerError
from placer.runtime.placed_model import (
    check_generation_memory,
    load_placed_model,
    resolve_device,
)
from placer.runtime.tables import tables_json


def run_prompt(placed: Path, checkpoint: Path, prompt: str, *, max_new_tokens: int = 32,
               cache_slots: int | None = None, device: str = "auto",
               prefetch: bool | None = None) -> dict:
    """Generate greedily from `prompt` with the model of `checkpoint` whose routed experts
    come from the placed directory `placed` (`prefetch`: prefetching the next MoE layer's
    experts, placer/runtime/prefetch.py); the text and what the runtime staged."""
    if max_new_tokens < 1:
        raise PlacerError("--max-new-tokens must be >= 1")
    check_generation_memory(checkpoint, max_new_tokens, resolve_device(device))
    placed_model = load_placed_model(placed, checkpoint, device=device, cache_slots=cache_slots,
                                     prefetch=prefetch)
    model, runtime, tokenizer = placed_model.model, placed_model.runtime, placed_model.tokenizer
    inputs = tokenizer(prompt, return_tensors="pt").to(placed_model.device)
    runtime.counters.reset()
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False,
                             pad_token_id=tokenizer.pad_token_id)
    new = out[0, inputs["input_ids"].shape[1]:]
    return {"prompt": prompt, "text": tokenizer.decode(new, skip_special_tokens=True),
            "new_tokens": int(new.numel()), "device": str(placed_model.device),
            "cache_slots": [int(n) for n in runtime.cache.slots],
            "cache_policy": runtime.cache.name, "cards": runtime.cards_json(),
            "tables": tables_json(placed_model.tables()),
            "staging": runtime.counters.to_json()}
