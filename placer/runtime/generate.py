"""`placer run`: greedy generation through the staging runtime, with its counters."""

from __future__ import annotations

from pathlib import Path

import torch

from placer.checkpoint.inventory import read_inventory
from placer.errors import PlacerError
from placer.placed.manifest import read_manifest
from placer.runtime.integrity import check_integrity
from placer.runtime.loader import load_placed
from placer.runtime.patch import load_staged_model


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


def run_prompt(placed: Path, checkpoint: Path, prompt: str, *, max_new_tokens: int = 32,
               cache_slots: int | None = None, device: str = "auto") -> dict:
    """Generate greedily from `prompt` with the model of `checkpoint` whose routed experts
    come from the placed directory `placed`; the text and what the runtime staged."""
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # stdout/stderr stay the command's own (--json)

    if max_new_tokens < 1:
        raise PlacerError("--max-new-tokens must be >= 1")
    torch_device = resolve_device(device)
    manifest = read_manifest(placed)
    fingerprint = read_inventory(checkpoint).fingerprint
    if fingerprint != manifest["model"]["fingerprint"]:
        raise PlacerError(f"{placed} was placed for model {manifest['model']['fingerprint']}, "
                          f"but {checkpoint} is model {fingerprint}")
    check_integrity(placed, checkpoint, manifest)
    runtime = load_placed(placed, device=torch_device, cache_slots=cache_slots)
    model = load_staged_model(checkpoint, runtime, device=str(torch_device))
    tokenizer = AutoTokenizer.from_pretrained(checkpoint, local_files_only=True)
    inputs = tokenizer(prompt, return_tensors="pt").to(torch_device)
    runtime.counters.reset()
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False,
                             pad_token_id=tokenizer.pad_token_id)
    new = out[0, inputs["input_ids"].shape[1]:]
    return {"prompt": prompt, "text": tokenizer.decode(new, skip_special_tokens=True),
            "new_tokens": int(new.numel()), "device": str(torch_device),
            "cache_slots": [int(n) for n in runtime.cache.slots],
            "cache_policy": runtime.cache.name, "cards": runtime.cards_json(),
            "staging": runtime.counters.to_json()}
