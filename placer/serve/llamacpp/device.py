"""Which device `placer bench --engine llamacpp` times, and what follows from it: whether it
is the plan's card, and the prompt length it runs.

The bundled binding runs llama.cpp b11669 on Vulkan's first device (binding.py): a GPU, or
where there is none Mesa's llvmpipe, a software Vulkan device that runs on the CPU. Its name
is ggml's own (traces/llamacpp/worker.py `list_devices`), read before any model loads.

- Another device than the spec's card: a tok/s measured there says nothing about the card's,
  so the bench refuses it unless `--allow-other-device`; then it reports the options' ratios
  to each other and no prediction error. A software device is never the card; a GPU is
  where its name is the spec's card model (placer.hardware.cards.same_card, as `probe
  --step` decides for CUDA), or where the spec names no card placer knows (a preset's
  generic card, taken to be this GPU).
- The prompt length: on the software device b11669 was seen to die of SIGSEGV with prompts
  of 32 tokens (after 4 minutes), while 4-token prompts ran in every run (docs/llamacpp.md,
  "Prompts go to llama.cpp at one length"), so prompts are cut to SOFTWARE_PROMPT_TOKENS
  there unless --max-prompt-tokens says otherwise; on a GPU to GPU_PROMPT_TOKENS.
"""

from __future__ import annotations

from dataclasses import dataclass

from placer.errors import PlacerError
from placer.hardware.cards import card, same_card
from placer.plan.placement import Plan
from traces.errors import TraceError

SOFTWARE_PROMPT_TOKENS = 4
GPU_PROMPT_TOKENS = 256
GPU_TYPES = (1, 2)  # ggml_backend_dev_type: GGML_BACKEND_DEVICE_TYPE_GPU, _IGPU


@dataclass(frozen=True)
class Device:
    """The device llama.cpp runs the options on: ggml's backend name ("Vulkan0", "CPU"), the
    device's own name ("NVIDIA GeForce RTX 3060", "llvmpipe (LLVM 15.0.6, 256 bits)"), and
    whether it is a GPU or runs on the CPU (a software Vulkan device, or no Vulkan device)."""

    backend: str
    name: str
    kind: str  # "GPU" or "CPU"

    @property
    def label(self) -> str:
        software = " (a software Vulkan device: it runs on the CPU)" if (
            self.kind == "CPU" and self.backend != "CPU") else ""
        return f"{self.backend}: {self.name}, {self.kind}{software}"

    def to_json(self) -> dict:
        return {"backend": self.backend, "name": self.name, "kind": self.kind,
                "label": self.label}


def binding_device() -> Device:
    """The device the bundled binding runs on: Vulkan's first GPU-type device, else the CPU."""
    from traces.llamacpp.runner import devices

    try:
        found = devices()
    except TraceError as exc:
        raise PlacerError(str(exc)) from None
    gpu = next((d for d in found if d.get("type") in GPU_TYPES), None)
    if gpu is not None:
        return Device(str(gpu["name"]), str(gpu["description"]),
                      "CPU" if gpu.get("software") else "GPU")
    cpu = next((d for d in found if d.get("type") == 0), {"description": "the CPU"})
    return Device("CPU", str(cpu["description"]), "CPU")


def other_device(plan: Plan, device: Device | None) -> str | None:
    """Why `device` is not the plan's spec's card (module docstring), or None where it is or
    may be (no device known: the user's own --server)."""
    if device is None:
        return None
    model = plan.hardware.cards[0].model
    if device.kind == "GPU" and (same_card(model, device.name) or card(model) is None):
        return None
    return f"timed on {device.label}, but the spec's card is {model!r}"


def check_device(plan: Plan, device: Device | None, allowed: bool) -> str | None:
    """other_device's reason, or a PlacerError where it is another device and not allowed."""
    reason = other_device(plan, device)
    if reason and not allowed:
        raise PlacerError(f"bench: {reason}: its tok/s say nothing of the card's. Bench on "
                          "the card, or --allow-other-device to compare the options by their "
                          "ratios to each other (no prediction error is reported then)")
    return reason


def default_prompt_tokens(device: Device | None) -> int:
    """Prompt tokens where --max-prompt-tokens is not given (module docstring)."""
    return SOFTWARE_PROMPT_TOKENS if device is not None and device.kind == "CPU" \
        else GPU_PROMPT_TOKENS
