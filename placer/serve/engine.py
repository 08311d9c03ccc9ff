"""What generates for `placer serve` and `placer bench`: requests in, tokens out, greedily
unless a request samples.

Two engines with one asyncio interface (`Engine.generate` yields every update of a request):

- `ContinuousEngine`: transformers' continuous batching (`model.init_continuous_batching`)
  on the placed model itself: concurrent requests share every forward, the paged KV cache is
  transformers', and so is the scheduler. It runs the attention implementations continuous
  batching takes (sdpa, eager as `paged|eager`, flash); the model keeps the one it was
  loaded with (no switch to flash, whose sums differ), and CUDA graphs stay off (a layer with
  cold experts syncs with the host).
- `SerialEngine`: one request at a time through `model.generate`, in a worker thread. The
  fallback where continuous batching cannot run the architecture.

`start_engine("auto")` starts continuous batching and checks it on a short probe: it must
generate, and greedily the same tokens as `model.generate` (what `placer run` prints). If it
fails either way the serial engine serves instead, and the reason is kept for `/health`.

A request that samples (`Sampling`: temperature, top-p, seed) runs through `model.generate`
with do_sample, its temperature and top-p warpers, after `torch.manual_seed(seed)`: the same
seed gives the same tokens. Continuous batching has no per-request seed (its draws share one
generator across the batch), so under it sampled requests go to a serial worker beside it;
the two never compute at once (a gate around every forward of the model), and where
continuous batching switched the attention implementation to its paged form, the worker's
forwards run with the model's own. `placer bench` and the exactness tests stay greedy.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import queue
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from placer.errors import PlacerError

BATCHING = ("auto", "continuous", "serial")
PROBE_TOKENS = 4
CPU_PAGE = 32            # KV tokens a page holds on a CPU (transformers sizes it on a GPU)
CPU_BATCH_TOKENS = 256   # query tokens one continuous-batching forward takes on a CPU
GPU_KV_SHARE = 0.5       # of free GPU memory for the KV cache: staging needs the rest


class EngineClosed(Exception):
    """The engine takes no more requests (it is stopping, or its generation loop died)."""


@dataclass(frozen=True)
class Sampling:
    """How a request samples: temperature > 0, top-p in (0, 1], the seed of its draws."""

    temperature: float
    top_p: float
    seed: int


@dataclass(frozen=True)
class Update:
    """A request's progress: every token generated so far; `finished` once it ends."""

    tokens: list[int]
    finished: bool
    error: str | None = None


class Engine(Protocol):
    mode: str

    def start(self) -> None: ...

    def stop(self, timeout: float | None = None) -> None: ...

    def healthy(self) -> bool: ...

    def generate(self, prompt_ids: list[int], max_new_tokens: int, request_id: str,
                 sampling: Sampling | None = None) -> AsyncIterator[Update]: ...

    def batch_request_ids(self) -> list[str] | None: ...


def context_of(model: Any, kv_tokens: int) -> int:
    """Tokens one request may hold: the model's positions, and on a CPU the KV cache's
    (`kv_tokens`; on a GPU transformers sizes the cache, and queues what does not fit)."""
    positions = getattr(model.config, "max_position_embeddings", None) or kv_tokens
    return min(positions, kv_tokens) if model.device.type == "cpu" else positions


def generation_config(model: Any, max_new_tokens: int = 16,
                      sampling: Sampling | None = None) -> Any:
    """The model's own generation config (its eos tokens), made greedy, or sampling with
    `sampling`'s temperature and top-p only (no top-k, whatever the model's config says)."""
    import copy

    config = copy.deepcopy(model.generation_config)
    config.do_sample = sampling is not None
    config.max_new_tokens = max_new_tokens
    if config.pad_token_id is None:
        config.pad_token_id = model.config.pad_token_id
    for name in ("temperature", "top_p", "top_k"):
        setattr(config, name, None)
    if sampling is not None:
        config.temperature, config.top_p, config.top_k = sampling.temperature, sampling.top_p, 0
    return config


class ContinuousEngine:
    """Continuous batching of concurrent requests (see module docstring)."""

    mode = "continuous"

    def __init__(self, model: Any, *, kv_tokens: int) -> None:
        self.model = model
        self.kv_tokens = kv_tokens
        self.manager: Any = None
        self.sampler: SerialEngine | None = None

    def start(self) -> None:
        from transformers import ContinuousBatchingConfig

        self.sampler = SerialEngine(self.model)  # before batching switches the attention
        self.sampler.start()

        if self.model.device.type == "cpu":  # transformers sizes the cache from GPU memory
            logging.getLogger("ContinuousBatchingLogger").setLevel(logging.CRITICAL)  # psutil
            sizes = {"num_blocks": -(-self.kv_tokens // CPU_PAGE), "page_size": CPU_PAGE,
                     "max_batch_tokens": CPU_BATCH_TOKENS}
        else:
            sizes = {"max_memory_percent": GPU_KV_SHARE}
        wanted = {"use_cuda_graph": False, "auto_switch_to_flash": False,
                  "use_async_batching": False, **sizes}
        known = {f.name for f in dataclasses.fields(ContinuousBatchingConfig)}
        config = ContinuousBatchingConfig(**{k: v for k, v in wanted.items() if k in known})
        self.manager = self.model.init_continuous_batching(
            generation_config=generation_config(self.model), continuous_batching_config=config)
        self.manager.start()

    def stop(self, timeout: float | None = None) -> None:
        if self.manager is not None and self.manager.is_running():
            self.manager.stop(block=True, timeout=timeout)
        if self.sampler is not None:
            self.sampler.stop(timeout)

    def healthy(self) -> bool:
        return self.manager is not None and self.manager.is_running()

    async def generate(self, prompt_ids: list[int], max_new_tokens: int, request_id: str,
                       sampling: Sampling | None = None) -> AsyncIterator[Update]:
        if sampling is not None and self.sampler is not None:
            async for update in self.sampler.generate(prompt_ids, max_new_tokens, request_id,
                                                      sampling):
                yield update
            return
        updates: asyncio.Queue = asyncio.Queue()
        self.manager.register_result_handler(request_id, updates.put_nowait)
        if not self.healthy() or self.manager.add_request(
                prompt_ids, request_id=request_id, max_new_tokens=max_new_tokens,
                streaming=True) is None:
            self._forget(request_id)
            raise EngineClosed("the generation loop is not running")
        done = False
        try:
            while not done:
                out = await updates.get()
                done = out.is_finished()
                yield Update(list(out.generated_tokens), done, out.error)
        finally:
            if not done:  # the client left: stop generating for it
                self.manager.cancel_request(request_id)
                self._forget(request_id)

    def _forget(self, request_id: str) -> None:
        """Drop the result handler of a request that will deliver no final result."""
        router = self.manager.output_router
        with router._lock:
            router.result_handlers.pop(request_id, None)

    def batch_request_ids(self) -> list[str] | None:
        """The requests of the forward being computed, in the order of its tokens (None
        where transformers' batch is not readable)."""
        try:
            states = self.manager.batch_processor.inputs_and_outputs.requests_in_batch
            return [s.state.request_id for s in states]
        except AttributeError:
            return None


@dataclass
class _Job:
    prompt_ids: list[int]
    max_new_tokens: int
    loop: asyncio.AbstractEventLoop
    updates: asyncio.Queue
    cancelled: threading.Event
    sampling: Sampling | None = None


class SerialEngine:
    """One request at a time through `model.generate` (see module docstring)."""

    mode = "serial"

    def __init__(self, model: Any) -> None:
        self.model = model
        self.jobs: queue.Queue[_Job | None] = queue.Queue()
        self.worker: threading.Thread | None = None
        self.closed = False
        self.current: str | None = None
        self.gate: OwnAttention | None = None

    def start(self) -> None:
        self.gate = OwnAttention(self.model)
        self.worker = threading.Thread(target=self._run, name="placer-serial", daemon=True)
        self.gate.worker = self.worker
        self.worker.start()

    def stop(self, timeout: float | None = None) -> None:
        self.closed = True
        self.jobs.put(None)
        if self.worker is not None:
            self.worker.join(timeout)
        if self.gate is not None:
            self.gate.close()

    def healthy(self) -> bool:
        return not self.closed and self.worker is not None and self.worker.is_alive()

    async def generate(self, prompt_ids: list[int], max_new_tokens: int, request_id: str,
                       sampling: Sampling | None = None) -> AsyncIterator[Update]:
        if not self.healthy():
            raise EngineClosed("the engine is stopping")
        job = _Job(prompt_ids, max_new_tokens, asyncio.get_running_loop(), asyncio.Queue(),
                   threading.Event(), sampling)
        self.jobs.put(job)
        done = False
        try:
            while not done:
                update = await job.updates.get()
                done = update.finished
                yield update
        finally:
            job.cancelled.set()

    def batch_request_ids(self) -> list[str] | None:
        return None

    def _run(self) -> None:
        for job in iter(self.jobs.get, None):
            if not job.cancelled.is_set():
                self._generate(job)

    def _generate(self, job: _Job) -> None:
        from transformers import StoppingCriteria, StoppingCriteriaList

        tokens: list[int] = []

        def send(update: Update) -> None:
            job.loop.call_soon_threadsafe(job.updates.put_nowait, update)

        class Streamer:  # transformers' BaseStreamer protocol: the prompt first, then tokens
            prompt_seen = False

            def put(self, value: torch.Tensor) -> None:
                if self.prompt_seen:
                    tokens.extend(int(t) for t in value.reshape(-1))
                    send(Update(list(tokens), False))
                self.prompt_seen = True

            def end(self) -> None:
                pass

        class Cancelled(StoppingCriteria):
            def __call__(self, input_ids: torch.Tensor, scores: Any, **kw: Any) -> torch.Tensor:
                return torch.full((input_ids.shape[0],), job.cancelled.is_set(),
                                  dtype=torch.bool, device=input_ids.device)

        try:
            with torch.no_grad():
                if job.sampling is not None:  # this worker is the only one drawing
                    torch.manual_seed(job.sampling.seed)
                self.model.generate(
                    torch.tensor([job.prompt_ids], device=self.model.device),
                    generation_config=generation_config(self.model, job.max_new_tokens,
                                                        job.sampling),
                    streamer=Streamer(), stopping_criteria=StoppingCriteriaList([Cancelled()]))
            send(Update(list(tokens), True))
        except Exception as exc:  # the request fails, the engine goes on
            send(Update(list(tokens), True, f"{type(exc).__name__}: {exc}"))


class OwnAttention:
    """One forward of the model at a time (hooks around its forward), and the forwards of
    `worker` (a serial engine beside continuous batching) with the attention implementation
    the model had when this was made: continuous batching switches eager to its paged form,
    which `model.generate` cannot run."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.own = model.config._attn_implementation
        self.worker: threading.Thread | None = None
        self.lock = threading.Lock()
        self.switched: str | None = None
        self._handles = [model.register_forward_pre_hook(self._begin),
                         model.register_forward_hook(self._end, always_call=True)]

    def _begin(self, *_: Any) -> None:
        self.lock.acquire()
        current = self.model.config._attn_implementation
        if threading.current_thread() is self.worker and current != self.own:
            self.switched = current
            self.model.set_attn_implementation(self.own)

    def _end(self, *_: Any) -> None:
        if self.switched is not None:
            self.model.set_attn_implementation(self.switched)
            self.switched = None
        self.lock.release()

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()


_probe_ids = itertools.count()


async def _collect(engine: Engine, prompt_ids: list[int], tokens: int) -> Update:
    last = Update([], False)
    async for update in engine.generate(prompt_ids, tokens, f"probe-{next(_probe_ids)}"):
        last = update
    return last


def greedy_tokens(model: Any, prompt_ids: list[int], tokens: int) -> list[int]:
    """What `model.generate` (as `placer run` calls it) generates greedily."""
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt_ids], device=model.device),
                             generation_config=generation_config(model, tokens))
    return out[0, len(prompt_ids):].tolist()


def probe(engine: Engine, prompt_ids: list[int], expected: list[int], timeout: float = 120.0
          ) -> str | None:
    """Why `engine` cannot serve (None: it can): from `prompt_ids` it must generate
    `expected`, the tokens `model.generate` gives."""
    try:
        got = asyncio.run(asyncio.wait_for(_collect(engine, prompt_ids, len(expected)),
                                           timeout))
    except (EngineClosed, TimeoutError) as exc:
        return f"{type(exc).__name__}: {exc or 'no answer'}"
    if got.error:
        return got.error
    if got.tokens != expected:
        return f"generated {got.tokens} where model.generate gives {expected}"
    return None


def start_engine(model: Any, prompt_ids: list[int], batching: str = "auto", *,
                 kv_tokens: int = 16384) -> tuple[Engine, str | None]:
    """A started engine for `model`, and why continuous batching is not serving (None
    when it is). `batching`: auto (continuous, else serial), continuous or serial."""
    if batching not in BATCHING:
        raise PlacerError(f"--batching must be one of {', '.join(BATCHING)}, got {batching!r}")
    if batching == "serial":
        engine = SerialEngine(model)
        engine.start()
        return engine, "--batching serial"
    expected = greedy_tokens(model, prompt_ids, PROBE_TOKENS)  # before batching switches
    engine = ContinuousEngine(model, kv_tokens=kv_tokens)      # the attention implementation
    try:
        engine.start()
        reason = probe(engine, prompt_ids, expected)
    except (ValueError, RuntimeError, NotImplementedError, TypeError, AttributeError) as exc:
        reason = f"{type(exc).__name__}: {exc}"  # a transformers without what it needs
    if reason is None:
        return engine, None
    engine.stop(timeout=10)
    if batching == "continuous":
        raise PlacerError(f"continuous batching cannot serve this model: {reason}")
    serial = SerialEngine(model)
    serial.start()
    return serial, f"continuous batching cannot serve this model ({reason})"
