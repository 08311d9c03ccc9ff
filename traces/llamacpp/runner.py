"""Running llama.cpp from placer: the worker (`worker.py`) in the side environment.

placer runs under Python 3.11; the llama.cpp build it uses (the `cyllama-vulkan` wheel,
llama.cpp b11669 with its expert cache) is a Python 3.12 wheel, so `make llama-env` installs
it into `.venv-llama` (Python 3.12) and placer starts `worker.py` with that interpreter as a
subprocess: a JSON request line on its stdin, a reply frame on a channel of its own
(channel.py; protocol in worker.py's docstring). `PLACER_LLAMA_PYTHON` names another
interpreter that has the wheel.

Sizes are bounded here, before they cross: the context and batch (uint32 fields of
`llama_context_params`) at MAX_CONTEXT tokens, so `--max-length 2**32` is refused instead
of wrapping to 8; a text to tokenize for at most N tokens is cut to N x TOKEN_BYTES bytes
first (no token of a GGUF vocabulary seen here is longer than that), so a 200 MB corpus
line sends 128 KiB for `--max-length 512`, not 200 MB; a sequence longer than the batch or
the context is refused before it is sent.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from traces.errors import TraceError
from traces.llamacpp.channel import Worker

REPO = Path(__file__).resolve().parents[2]
SIDE_PYTHON = REPO / ".venv-llama" / "bin" / "python"
WORKER = Path(__file__).with_name("worker.py")
KERNELS = Path(__file__).with_name("kernels.py")
DEVICES = Path(__file__).with_name("devices.py")
MAX_CONTEXT = 1 << 22  # tokens of context or batch llama.cpp is asked for (4M: beyond
#                        every GGUF's trained context, far below uint32's wrap)
TOKEN_BYTES = 256      # the longest token a text is assumed to hold, for cutting it


@dataclass(frozen=True)
class EngineOptions:
    """How llama.cpp runs the GGUF. `n_gpu_layers` 0 runs on the CPU backend only; a GPU
    run (layers offloaded, or a cache) uses Vulkan's first device (`GGML_VK_VISIBLE_DEVICES`
    defaults to 0, Mesa's software device where there is no GPU). `host_experts` keeps every
    `*_exps` tensor in host memory (`-ot exps=CPU`); `moe_cache_bytes` is
    `--moe-cache-mib N` x 2^20. `n_expert_used` only sizes the fetch records. `host_layers`
    keeps the expert tensors of those decoder layers only in host memory (`-ot` with the
    pattern export prints); `tensor_split` is `-ts`. `record` false runs without the eval
    callback that records routing and fetches (for timing: see worker.py)."""

    gguf: str
    threads: int = max(1, min(8, os.cpu_count() or 1))
    n_gpu_layers: int = 0
    host_experts: bool = False
    moe_cache_bytes: int = 0
    n_ctx: int = 4096
    n_batch: int = 512
    n_expert_used: int = 1
    host_layers: tuple[int, ...] | None = None
    tensor_split: tuple[float, ...] | None = None
    record: bool = True


@dataclass(frozen=True)
class Run:
    """One sequence through llama.cpp: `tokens` [T] fed (the prompt's `prompt` tokens, then
    each generated token fed back), `experts` [T, L, k] int16 the selection of each token at
    each MoE layer `layers` [L] (router order), `fetches` the cache's fetches in order."""

    tokens: np.ndarray
    prompt: int
    generated: list[int]
    layers: list[int]
    experts: np.ndarray
    fetches: list[dict]


@dataclass(frozen=True)
class Fed:
    """One given token sequence through llama.cpp (`LlamaCpp.feed`): the prompt's seconds,
    each following token's decode seconds, and with recording its routing (as Run)."""

    prefill_s: float
    decode_s: list[float]
    layers: list[int] | None
    experts: np.ndarray | None
    fetches: list[dict] | None


def side_python() -> Path:
    """The side environment's interpreter, or a TraceError saying how to make it."""
    path = Path(os.environ.get("PLACER_LLAMA_PYTHON") or SIDE_PYTHON)
    if not path.is_file():
        raise TraceError(f"no llama.cpp environment ({path} is missing): run `make llama-env`")
    return path


def check_context(n_ctx: int, n_batch: int, what: str = "the context") -> None:
    """TraceError unless 1 <= n_batch and n_ctx <= MAX_CONTEXT tokens."""
    if not 1 <= n_batch <= MAX_CONTEXT or not 1 <= n_ctx <= MAX_CONTEXT:
        raise TraceError(f"{what} asks llama.cpp for a context of {n_ctx} and a batch of "
                         f"{n_batch} tokens: each must be 1 .. {MAX_CONTEXT}")


def side_env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("GGML_VK_VISIBLE_DEVICES", "0")
    return env


class LlamaCpp:
    """A worker process holding one model and context; use as a context manager."""

    def __init__(self, options: EngineOptions) -> None:
        self.options = options
        gguf = Path(options.gguf)
        if not gguf.is_file():
            raise TraceError(f"no GGUF file at {gguf}")
        check_context(options.n_ctx, options.n_batch)
        self.worker = Worker([str(side_python()), str(WORKER), json.dumps(asdict(options))],
                             f"llama.cpp's worker on {options.gguf}", side_env())
        try:
            self.n_vocab = int(self.worker.receive()["n_vocab"])
        except BaseException:
            self.worker.close()
            raise

    def __enter__(self) -> LlamaCpp:
        return self

    def __exit__(self, *exc: object) -> None:
        self.worker.close()

    def tokenize(self, text: str | None = None, chat: list[dict] | None = None,
                 max_tokens: int | None = None) -> list[int]:
        """Token ids by llama.cpp's own tokenizer: `text` with the model's BOS, or `chat`
        messages through the model's chat template with the generation prompt; with
        `max_tokens`, the first that many, the text (each message) cut to max_tokens x
        TOKEN_BYTES characters before it is sent."""
        if max_tokens is not None:
            keep = (max_tokens + 1) * TOKEN_BYTES
            text = text[:keep] if text is not None else None
            chat = [{**m, "content": str(m.get("content", ""))[:keep]} for m in chat] \
                if chat is not None else None
        ids = self.worker.ask({"op": "tokenize", "text": text, "chat": chat})["tokens"]
        return ids[:max_tokens] if max_tokens is not None else ids

    def run(self, tokens: list[int], max_new_tokens: int = 0) -> Run:
        """Decode `tokens` as a fresh sequence (one llama_decode), then greedily generate up
        to `max_new_tokens`, feeding back each but the last (none after an end token)."""
        if not 0 < len(tokens) <= self.options.n_batch or (
                len(tokens) + max_new_tokens > self.options.n_ctx):
            raise TraceError(f"a sequence of {len(tokens)} tokens and {max_new_tokens} new "
                             f"ones does not fit llama.cpp's batch of {self.options.n_batch} "
                             f"and context of {self.options.n_ctx}")
        r = self.worker.ask({"op": "run", "tokens": [int(t) for t in tokens],
                             "max_new_tokens": int(max_new_tokens)})
        experts = np.asarray(r["experts"], dtype=np.int16).reshape(
            len(r["tokens"]), len(r["layers"]), -1)
        return Run(np.asarray(r["tokens"], dtype=np.int64), r["prompt"], r["generated"],
                   r["layers"], experts, r["fetches"])

    def feed(self, tokens: list[int], prompt: int) -> Fed:
        """`tokens` as a fresh sequence, tokens[:prompt] in one llama_decode, then one token
        a decode, each timed (teacher forced: nothing is sampled)."""
        if not 0 < prompt <= min(len(tokens), self.options.n_batch) or (
                len(tokens) > self.options.n_ctx):
            raise TraceError(f"a sequence of {len(tokens)} tokens (prompt {prompt}) does not "
                             f"fit llama.cpp's batch of {self.options.n_batch} and context of "
                             f"{self.options.n_ctx}")
        r = self.worker.ask({"op": "feed", "tokens": [int(t) for t in tokens],
                             "prompt": int(prompt)})
        experts = None
        if "experts" in r:
            experts = np.asarray(r["experts"], dtype=np.int16).reshape(
                len(tokens), len(r["layers"]), -1)
        return Fed(float(r["prefill_s"]), [float(x) for x in r["decode_s"]], r.get("layers"),
                   experts, r.get("fetches"))

    def close(self) -> dict:
        """Free the context and model: {"log": the cache's log lines, "alignment": the GPU
        buffer alignment or None}."""
        reply = self.worker.ask({"op": "close"})
        self.worker.close()
        return reply


def devices() -> list[dict]:
    """The ggml devices the bundled llama.cpp sees here, without loading a model (devices.py:
    {"name", "description", "type", "software"} each; a second or so)."""
    with Worker([str(side_python()), str(DEVICES)], "llama.cpp's device list",
                side_env()) as worker:
        found = worker.receive().get("devices")
    if not isinstance(found, list):
        raise TraceError("llama.cpp's device list: the worker sent no devices")
    return found


def time_expert(hidden: int, inter: int, ggml_type: str, tokens: tuple[int, ...], pool: int,
                threads: int, rounds: int, min_calls: int, min_s: float,
                budget_s: float) -> list[list[float]]:
    """Wall seconds of one cold expert (`kernels.py`) in `ggml_type` over each token count of
    `tokens`, computed by llama.cpp's CPU kernels: [len(tokens)][rounds] seconds."""
    args = {"hidden": hidden, "inter": inter, "type": ggml_type, "tokens": list(tokens),
            "pool": pool, "threads": threads, "rounds": rounds, "min_calls": min_calls,
            "min_s": min_s, "budget_s": budget_s}
    with Worker([str(side_python()), str(KERNELS), json.dumps(args)],
                f"llama.cpp's expert timing ({ggml_type} {hidden}x{inter})") as worker:
        seconds = worker.receive().get("seconds")
    if not isinstance(seconds, list) or len(seconds) != len(tokens):
        raise TraceError(f"llama.cpp's expert timing ({ggml_type} {hidden}x{inter}) sent no "
                         f"times for {len(tokens)} token counts")
    return seconds
