"""Driver 1 of `placer bench --engine llamacpp`: the bundled binding, llama.cpp b11669 from
the cyllama-vulkan 0.7.0 wheel in `.venv-llama` (traces/llamacpp/runner.py), on Vulkan's
first device (Mesa's software device where there is no GPU).

Each pass starts a worker that loads the GGUF with the option's flags (every layer on the
GPU, the option's host layers' expert tensors in host memory by the `-ot` pattern export
prints, `--moe-cache-mib` as bytes, `-ts`), feeds every sequence (teacher forced: the same
tokens in every option and trial) and frees the context, which makes the cache log its
totals. A recording pass runs with the eval callback that reads each layer's selected
experts and the cache's fetches; a timed pass runs without any callback (the scheduler then
runs each graph split whole, as llama-server does), each decode token timed to
`llama_synchronize`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from placer.errors import PlacerError
from traces.collecting.corpora import Document
from traces.errors import TraceError
from traces.llamacpp.cache import SLOTS, TOTALS
from traces.llamacpp.runner import EngineOptions, LlamaCpp

BUILD = "b11669"
SOURCE = "cyllama-vulkan 0.7.0 (llama.cpp b11669), Vulkan device 0"


@dataclass(frozen=True)
class Pass:
    """One option's pass over the sequences: decode_s [sequence][token] seconds; routing
    [(prompt tokens, experts [T, L, k])] when recorded; the cache's logged totals
    {"ubatch <= 8" | "ubatch  > 8": [hits, misses, uploaded MiB]} and slots per group
    [(layers, type, slots)]; alignment: the GPU buffer alignment."""

    decode_s: list[list[float]]
    routing: list[tuple[int, np.ndarray]] | None
    totals: dict[str, list]
    slots: list[tuple[int, str, int]]
    alignment: int | None


@dataclass(frozen=True)
class BenchEngine:
    """What every pass shares: the GGUF, the router's k, threads and the sizes."""

    gguf: str
    top_k: int
    threads: int
    n_ctx: int
    n_batch: int


class BindingDriver:
    """Passes through the bundled llama.cpp."""

    name = "binding"
    build = BUILD
    source = SOURCE

    def __init__(self, engine: BenchEngine) -> None:
        self.engine = engine

    def _options(self, host_layers: tuple[int, ...], cache_mib: int,
                 tensor_split: tuple[float, ...] | None, record: bool,
                 gpu: bool = True) -> EngineOptions:
        e = self.engine
        return EngineOptions(e.gguf, threads=e.threads, n_gpu_layers=-1 if gpu else 0,
                             moe_cache_bytes=cache_mib << 20, n_ctx=e.n_ctx, n_batch=e.n_batch,
                             n_expert_used=e.top_k, host_layers=host_layers or None,
                             tensor_split=tensor_split, record=record)

    def sequences(self, docs: list[Document], max_prompt: int, max_new_tokens: int
                  ) -> list[tuple[int, list[int]]]:
        """Each prompt tokenized by the GGUF's tokenizer (chat template for messages), all
        cut to one length, the shortest's or `max_prompt` tokens (every prefill is then one
        ubatch of the same size: b11669 on Mesa's software Vulkan device was seen to crash,
        SIGSEGV, when a sequence's prefill was larger than the one before after single-token
        decodes), and its greedy continuation (CPU backend): (prompt tokens, the tokens fed:
        the prompt, then each generated token but the last)."""
        out = []
        try:
            with LlamaCpp(self._options((), 0, None, True, gpu=False)) as llama:
                prompts = []
                for doc in docs:
                    ids = (llama.tokenize(chat=list(doc.messages), max_tokens=max_prompt)
                           if doc.messages is not None
                           else llama.tokenize(text=doc.text or "", max_tokens=max_prompt))
                    if not ids:
                        raise PlacerError(f"--prompts: prompt {len(prompts) + 1} has no "
                                          "tokens")
                    prompts.append(ids)
                length = min(len(p) for p in prompts)
                for ids in prompts:
                    run = llama.run(ids[:length], max_new_tokens)
                    out.append((length, [int(t) for t in run.tokens]))
                llama.close()
        except TraceError as exc:
            raise PlacerError(str(exc)) from None
        return out

    def run(self, host_layers: tuple[int, ...], cache_mib: int,
            tensor_split: tuple[float, ...] | None, sequences: list[tuple[int, list[int]]],
            record: bool) -> Pass:
        """One pass of `sequences` under the option (module docstring)."""
        decode, routing = [], []
        try:
            with LlamaCpp(self._options(host_layers, cache_mib, tensor_split, record)) as llama:
                for prompt, tokens in sequences:
                    fed = llama.feed(tokens, prompt)
                    decode.append(fed.decode_s)
                    if record:
                        routing.append((prompt, fed.experts))
                closed = llama.close()
        except TraceError as exc:
            raise PlacerError(str(exc)) from None
        text = "".join(closed["log"])
        totals = {m[0]: [int(m[1]), int(m[2]), float(m[3])] for m in TOTALS.findall(text)}
        slots = [(int(n), t, int(s)) for n, t, s in SLOTS.findall(text)]
        return Pass(decode, routing if record else None, totals, slots, closed["alignment"])
