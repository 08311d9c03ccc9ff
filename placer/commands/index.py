"""The command line's table of contents: every top-level command's name and the first
paragraph of its help, as `placer --help` lists them. With it the listing needs none of the
command modules: `placer.commands.app` imports a command's module (and builds its options)
only when that command runs or shows its help. tests/test_startup.py checks the table against
the commands themselves (naming each entry whose help text has changed, with its new text).

A command NAME lives in `placer.commands.NAME`, whose `register(app)` adds it; GROUPS are the
names that are groups of commands (`placer hardware list`).
"""

from __future__ import annotations

COMMANDS: dict[str, str] = {
    "inspect": (
        "Read a checkpoint's config and safetensors headers, or a GGUF's metadata and tensor\n"
        "infos (never tensor bytes), and list its MoE layers, routed experts and their exact\n"
        "byte ranges."
    ),
    "probe": (
        "Measure each visible GPU's pinned host-to-device bandwidth and per-copy latency,\n"
        "and print a spec fragment. Exits non-zero where no GPU is visible. With --host,\n"
        "measure the host CPU as it runs cold experts and print the spec's host table. With\n"
        "--step, measure the decode step of --model and print the spec's \\[decode] table.\n"
        "With --hardware SPEC --out FILE, write SPEC with the measured table in its place.\n"
        "Every figure names the device it timed and its spread over repeats (NOISY where the\n"
        "repeats did not settle)."
    ),
    "plan": (
        "From a checkpoint (or a GGUF) and a corpus to a plan, its held-out evaluation and\n"
        "the command that runs it: collect, split, solve, evaluate, export, the functions the\n"
        "single commands run, each stage's output kept under --out."
    ),
    "collect": (
        "Record the routing of a real MoE checkpoint over sample traffic."
    ),
    "solve": (
        "Solve which experts stay pinned on each GPU and how many cache slots each layer\n"
        "keeps for staged ones, within a VRAM budget, from routing traces; the rest stay in\n"
        "pinned host memory and are staged when selected."
    ),
    "emit": (
        "Write card<N>.safetensors (resident pages), host<G>.safetensors (cold parts, one\n"
        "aligned range per expert) and manifest.json (last) for PLAN, streaming bytes from\n"
        "MODEL. Nothing is left behind on failure, SIGINT or SIGTERM; a second emit into the\n"
        "same --out while one runs is refused."
    ),
    "verify": (
        "Re-read every source and output range and compare them, check sha256s, that every\n"
        "routed expert is placed exactly once, that no card exceeds its budget, and that the\n"
        "manifest validates. Exit 1 on any difference, naming the tensor, expert and file."
    ),
    "evaluate": (
        "Replay held-out traffic against a placement as deployed (pinned pages and its cache\n"
        "of staged experts) and, at the same VRAM budget, layer offload, uniform, the static\n"
        "oracle (the best pinned set for this very traffic, no cache), lru and lfuda (the\n"
        "whole budget as per-layer LRU or LFUDA caches, nothing pinned: llama.cpp PR\n"
        "#27861's and BigRig 0.9.1's engine caches) and belady (the plan's pinned set "
        "and slots under\n"
        "Belady's offline-optimal replacement: the limit of any cache policy for that split);\n"
        "warn where the placement is predicted worse than layer offload or than lru."
    ),
    "run": (
        "Load the model with its routed experts taken from PLACED (resident pages on the\n"
        "device, cold pages in host memory, staged exactly when selected), generate\n"
        "greedily, and print the text and the staging counters."
    ),
    "serve": (
        "Serve PLACED over HTTP with the OpenAI API: POST /v1/completions and\n"
        "/v1/chat/completions (stream: true for server-sent events ending in\n"
        "`data: [DONE]`), GET /v1/models, /health and /metrics (Prometheus: placer_staged_bytes\n"
        "and the other staging counters by card, generated tokens, requests)."
    ),
    "bench": (
        "The paired campaign on this box: each PLACED directory serves the same prompts\n"
        "greedily (continuous batching, as `placer serve`) at each concurrency, --trials\n"
        "times. Measured: decode tokens/s over the steps in which every sequence decodes (95%\n"
        "interval over trials, of the log time per token: positive; none under 3 trials),\n"
        "time to first token, and the decode step (printed with the base step it implies;\n"
        "--spec-out writes that into a spec). The routing those steps served is replayed\n"
        "through `placer evaluate`'s cost model (plan's hardware spec, base step included),\n"
        "so measured and predicted see the same tokens (95% interval over prompts). Each\n"
        "arm's ratio to the first arm is shown for both."
    ),
    "schema": (
        "Print the JSON Schema every manifest.json is validated against (see\n"
        "docs/manifest.md)."
    ),
    "hardware": (
        "Hardware specs: list and show the presets that ship with placer (or a spec file), "
        "write one for your box from what you know of it (new), and the cards placer knows "
        "(cards)."
    ),
    "traces": (
        "Routing traces: summarize one (stats), split one into calibration and held-out "
        "traffic (split), import other engines' routing (import)."
    ),
    "export": (
        "A plan in serving engines' terms: SGLang's expert locations (sglang), TensorRT-LLM's "
        "static placement (trtllm), sglang-kt's GPU experts (ktransformers), llama.cpp's "
        "arguments (llamacpp)."
    ),
}
GROUPS = frozenset({"hardware", "traces", "export"})
