"""`placer serve`: load a placed model, start its engine, answer HTTP until told to stop.

The address is bound before the model loads (a taken port fails at once); the engine starts
and is probed (placer.serve.engine), the runtime's counters are zeroed, one line says where
the server listens, and uvicorn serves the app (placer.serve.app). SIGTERM or SIGINT stop
accepting connections, let the requests in flight finish (at most `DRAIN_SECONDS`); then the
engine stops and the command exits 0.
"""

from __future__ import annotations

import asyncio
import gc
import signal
import socket
import time
from collections.abc import Callable
from pathlib import Path

from placer.errors import PlacerError
from placer.runtime.placed_model import PlacedModel, load_placed_model
from placer.serve.app import Served, build_app
from placer.serve.engine import Engine, context_of, start_engine
from placer.serve.metrics import ServerMetrics
from placer.serve.openai_api import encode_text
from placer.serve.steps import ForwardGate

DRAIN_SECONDS = 120
PROBE_PROMPT = "The experts of a mixture"


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on (host, port), or a PlacerError (port 0: any free port)."""
    if not 0 <= port <= 65535:
        raise PlacerError(f"--port must be in 0..65535, got {port}")
    try:
        info = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror as exc:
        raise PlacerError(f"--host {host}: {exc.strerror}") from None
    sock = socket.socket(info[0], socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(info[4])
    except OSError as exc:
        sock.close()
        raise PlacerError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    sock.listen(128)
    return sock


def serve(placed: Path, checkpoint: Path, *, host: str = "127.0.0.1", port: int = 8000,
          device: str = "auto", cache_slots: int | None = None, batching: str = "auto",
          kv_tokens: int = 16384, max_prompt_tokens: int | None = None,
          prefetch: bool | None = None, announce: Callable[[str], None] = print) -> None:
    """Serve `placed` (see module docstring); `announce` gets the ready line. A prompt may
    hold `max_prompt_tokens` tokens (None: the model's context; never more); `prefetch`:
    whether the runtime prefetches (None: as the plan decided; placer/runtime/prefetch.py)."""
    if max_prompt_tokens is not None and max_prompt_tokens < 1:
        raise PlacerError(f"--max-prompt-tokens must be at least 1, got {max_prompt_tokens}")
    sock = bind(host, port)
    try:
        loaded = load_placed_model(placed, checkpoint, device=device, cache_slots=cache_slots,
                                   prefetch=prefetch)
        engine, fallback = start_engine(loaded.model,
                                        encode_text(loaded.tokenizer, PROBE_PROMPT), batching,
                                        kv_tokens=kv_tokens)
        try:
            stop_at = run_server(sock, host, loaded, engine, fallback, kv_tokens,
                                 max_prompt_tokens, announce)
        finally:
            gc.freeze()  # see the module docstring
            engine.stop(timeout=DRAIN_SECONDS)
        took = "" if stop_at is None else f" {time.monotonic() - stop_at:.2f} s after the signal"
        announce(f"placer serve: stopped{took}")
    finally:
        sock.close()


def run_server(sock: socket.socket, host: str, loaded: PlacedModel, engine: Engine,
               fallback: str | None, kv_tokens: int, max_prompt_tokens: int | None,
               announce: Callable[[str], None]) -> float | None:
    """Serve on `sock` until SIGTERM or SIGINT, and drain; when the signal came (monotonic)."""
    import uvicorn

    gate = ForwardGate(loaded.model)
    with gate:
        loaded.runtime.counters.reset()  # the probe is not traffic
    served = Served(engine, loaded.tokenizer, loaded.checkpoint.name,
                    context_of(loaded.model, kv_tokens),
                    ServerMetrics(loaded.runtime.counters, gate), fallback, max_prompt_tokens)

    address = sock.getsockname()
    announce(f"placer serve: http://{host}:{address[1]} serving {served.model_id} "
             f"({engine.mode} batching{'; ' + fallback if fallback else ''}; prompts of at "
             f"most {served.prompt_cap()} tokens; cache slots per "
             f"card {loaded.runtime.cache.slots.tolist()} ({loaded.runtime.cache.name}); device "
             f"{loaded.device})")
    config = uvicorn.Config(build_app(served), log_level="warning",
                            timeout_graceful_shutdown=DRAIN_SECONDS)
    server = draining_server(config, announce)
    try:
        with stop_signals():
            server.run(sockets=[sock])
    finally:
        gate.close()
    return server.stop_at


def draining_server(config: object, announce: Callable[[str], None]) -> object:
    """A uvicorn server that says, on SIGTERM or SIGINT, how many requests are in flight and
    how long it lets them finish (DRAIN_SECONDS; uvicorn cancels what is left after that)."""
    import uvicorn

    class Draining(uvicorn.Server):
        stop_at: float | None = None

        def handle_exit(self, sig: int, frame: object) -> None:
            if self.stop_at is None:
                self.stop_at = time.monotonic()
                name = signal.Signals(sig).name
                try:  # counted once the loop's current step is done (why: in_flight)
                    asyncio.get_running_loop().call_soon_threadsafe(self.say, name)
                except RuntimeError:  # not serving yet
                    self.say(name)
            super().handle_exit(sig, frame)

        def say(self, name: str) -> None:
            busy = in_flight(self.server_state.connections)
            announce(f"placer serve: {name}: no request in flight, stopping" if not busy
                     else f"placer serve: {name}: finishing {busy} request"
                          f"{'s' if busy != 1 else ''} in flight (at most {DRAIN_SECONDS} "
                          "s; a second Ctrl-C stops at once), then stopping")

    return Draining(config)


def in_flight(connections: set) -> int:
    """Requests whose response is not complete: a connection's current request cycle
    (uvicorn 0.55's h11 and httptools protocols, `cycle.response_complete`). Counted from the
    event loop, never inside the signal handler: Python runs that handler between two
    bytecodes of whatever the loop is doing, which can be the moment after a reply's last
    bytes were written and before its cycle is marked complete (a busy machine's client then
    has the reply and sends SIGTERM first). Not the server's task set either: a request's
    task outlives its response by a moment."""
    return sum(1 for c in connections
               if getattr(c, "cycle", None) is not None and not c.cycle.response_complete)


class stop_signals:
    """SIGTERM and SIGINT only stop uvicorn (which handles them while it serves and raises
    them again once it has drained): after that, the command returns normally."""

    def __enter__(self) -> None:
        self.saved = {sig: signal.signal(sig, lambda *_: None)
                      for sig in (signal.SIGTERM, signal.SIGINT)}

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self.saved.items():
            signal.signal(sig, handler)
