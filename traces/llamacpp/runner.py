"""Running llama.cpp from placer: the worker (`worker.py`) in the side environment.

placer runs under Python 3.11; the llama.cpp build it uses (the `cyllama-vulkan` wheel,
llama.cpp b11669 with its expert cache) is a Python 3.12 wheel, so `make llama-env` installs
it into `.venv-llama` (Python 3.12) and placer starts `worker.py` with that interpreter as a
subprocess, one JSON request and reply per line (protocol in worker.py's docstring).
`PLACER_LLAMA_PYTHON` names another interpreter that has the wheel.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from traces.errors import TraceError

REPO = Path(__file__).resolve().parents[2]
SIDE_PYTHON = REPO / ".venv-llama" / "bin" / "python"
WORKER = Path(__file__).with_name("worker.py")
KERNELS = Path(__file__).with_name("kernels.py")


@dataclass(frozen=True)
class EngineOptions:
    """How llama.cpp runs the GGUF. `n_gpu_layers` 0 runs on the CPU backend only; a GPU
    run (layers offloaded, or a cache) uses Vulkan's first device (`GGML_VK_VISIBLE_DEVICES`
    defaults to 0, Mesa's software device where there is no GPU). `host_experts` keeps every
    `*_exps` tensor in host memory (`-ot exps=CPU`); `moe_cache_bytes` is
    `--moe-cache-mib N` x 2^20. `n_expert_used` only sizes the fetch records."""

    gguf: str
    threads: int = max(1, min(8, os.cpu_count() or 1))
    n_gpu_layers: int = 0
    host_experts: bool = False
    moe_cache_bytes: int = 0
    n_ctx: int = 4096
    n_batch: int = 512
    n_expert_used: int = 1


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


def side_python() -> Path:
    """The side environment's interpreter, or a TraceError saying how to make it."""
    path = Path(os.environ.get("PLACER_LLAMA_PYTHON") or SIDE_PYTHON)
    if not path.is_file():
        raise TraceError(f"no llama.cpp environment ({path} is missing): run `make llama-env`")
    return path


class LlamaCpp:
    """A worker process holding one model and context; use as a context manager."""

    def __init__(self, options: EngineOptions) -> None:
        self.options = options
        gguf = Path(options.gguf)
        if not gguf.is_file():
            raise TraceError(f"no GGUF file at {gguf}")
        env = dict(os.environ)
        env.setdefault("GGML_VK_VISIBLE_DEVICES", "0")
        self.proc = subprocess.Popen(
            [str(side_python()), str(WORKER), json.dumps(asdict(options))], env=env,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.n_vocab = int(self._reply()["n_vocab"])

    def __enter__(self) -> LlamaCpp:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def _reply(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait()
            err = [x for x in self.proc.stderr.read().splitlines() if x.strip()]
            raise TraceError(f"llama.cpp's worker exited {self.proc.returncode} on "
                             f"{self.options.gguf}: {err[-1] if err else 'no message'}")
        reply = json.loads(line)
        if "error" in reply:
            self.proc.wait()
            raise TraceError(f"llama.cpp on {self.options.gguf}: {reply['error']}")
        return reply

    def _ask(self, request: dict) -> dict:
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        return self._reply()

    def tokenize(self, text: str | None = None, chat: list[dict] | None = None) -> list[int]:
        """Token ids by llama.cpp's own tokenizer: `text` with the model's BOS, or `chat`
        messages through the model's chat template with the generation prompt."""
        return self._ask({"op": "tokenize", "text": text, "chat": chat})["tokens"]

    def run(self, tokens: list[int], max_new_tokens: int = 0) -> Run:
        """Decode `tokens` as a fresh sequence (one llama_decode), then greedily generate up
        to `max_new_tokens`, feeding back each but the last (none after an end token)."""
        r = self._ask({"op": "run", "tokens": [int(t) for t in tokens],
                       "max_new_tokens": int(max_new_tokens)})
        experts = np.asarray(r["experts"], dtype=np.int16).reshape(
            len(r["tokens"]), len(r["layers"]), -1)
        return Run(np.asarray(r["tokens"], dtype=np.int64), r["prompt"], r["generated"],
                   r["layers"], experts, r["fetches"])

    def close(self) -> dict:
        """Free the context and model: {"log": the cache's log lines, "alignment": the GPU
        buffer alignment or None}."""
        reply = self._ask({"op": "close"})
        self.proc.wait()
        return reply


def time_expert(hidden: int, inter: int, ggml_type: str, tokens: tuple[int, ...], pool: int,
                threads: int, rounds: int, min_calls: int, min_s: float,
                budget_s: float) -> list[list[float]]:
    """Wall seconds of one cold expert (`kernels.py`) in `ggml_type` over each token count of
    `tokens`, computed by llama.cpp's CPU kernels: [len(tokens)][rounds] seconds."""
    args = {"hidden": hidden, "inter": inter, "type": ggml_type, "tokens": list(tokens),
            "pool": pool, "threads": threads, "rounds": rounds, "min_calls": min_calls,
            "min_s": min_s, "budget_s": budget_s}
    done = subprocess.run([str(side_python()), str(KERNELS), json.dumps(args)],
                          capture_output=True, text=True)
    lines = done.stdout.strip().splitlines()
    reply = json.loads(lines[-1]) if lines else {}
    if "seconds" not in reply:
        err = reply.get("error") or next(
            (x for x in reversed(done.stderr.splitlines()) if x.strip()), "no message")
        raise TraceError(f"llama.cpp's expert timing ({ggml_type} {hidden}x{inter}) failed: "
                         f"{err}")
    return reply["seconds"]
