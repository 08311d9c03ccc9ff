"""The HTTP face of `placer serve`: an OpenAI-compatible FastAPI app over an engine.

    POST /v1/completions        {"model", "prompt" (one or a list), "max_tokens", "stop",
                                 "stream", "temperature", "top_p", "seed"}
    POST /v1/chat/completions   {"model", "messages", "max_tokens", "stop", "stream",
                                 "temperature", "top_p", "seed"}
    GET  /v1/models             the one model served
    GET  /health                200 while the engine generates, 503 once it cannot
    GET  /metrics               Prometheus text (placer.serve.metrics)

Streams are server-sent events, `data: <chunk JSON>` each, the last `data: [DONE]`. Every
refusal is a 4xx with an OpenAI error body, `{"error": {"message", "type", "param",
"code"}}`: a body that is not JSON or not the schema, an unknown model, a prompt that does
not fit the context, more than one choice per prompt (see placer.serve.openai_api); an
unknown path is a 404 and a wrong method a 405, in the same shape. A client that leaves
mid-stream cancels its request.

Nothing long runs on the event loop: the model computes in the engine's threads, prompts are
rendered and tokenized on a worker thread, bounded in tokens and in the memory they take
(placer.serve.prompts), and a reply's text is decoded and matched against its stop strings
incrementally (placer.serve.openai_api.TextStream), so `/health` and other clients are
answered while a request runs.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing, asynccontextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException

from placer.serve.engine import Engine, EngineClosed, Sampling
from placer.serve.metrics import ServerMetrics
from placer.serve.openai_api import (
    DEFAULT_MAX_TOKENS,
    ApiError,
    ChatRequest,
    CompletionRequest,
    Reply,
    TextStream,
    finish_reason,
    usage,
)
from placer.serve.prompts import Prompts

Request_ = TypeVar("Request_", ChatRequest, CompletionRequest)


@dataclass
class Served:
    """What the app serves: the engine, the tokenizer, the model's id and context length,
    the metrics, why continuous batching is not serving (None when it is), and the most
    tokens a prompt may hold (None: the context's)."""

    engine: Engine
    tokenizer: Any
    model_id: str
    max_context: int
    metrics: ServerMetrics
    fallback: str | None = None
    max_prompt_tokens: int | None = None

    def prompt_cap(self) -> int:
        return min(self.max_prompt_tokens or self.max_context, self.max_context)


@dataclass(frozen=True)
class Job:
    """One accepted prompt of a request: its tokens, its limit, its stop strings, how it
    samples (None: greedily), its reply envelope (shared by a request's prompts) and its
    choice's index there."""

    endpoint: str
    prompt_ids: list[int]
    max_tokens: int
    stops: list[str]
    reply: Reply
    sampling: Sampling | None = None
    index: int = 0


MAX_BODY = 4 << 20  # bytes of a request body; a prompt that fits any context is far smaller


class BodyLimit:
    """ASGI middleware: a request body past MAX_BODY bytes is a 413 before it is all in
    memory (the JSON parser reads a whole body), by its Content-Length or, for a chunked
    body, as it arrives."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope["headers"]).get(b"content-length", b"0")
        if not length.isdigit() or int(length) > MAX_BODY:
            refusal = ApiError(413, f"the request body is {length.decode(errors='replace')} "
                                    f"bytes; at most {MAX_BODY}")
            await JSONResponse(refusal.body(), status_code=413)(scope, receive, send)
            return
        seen = 0

        async def counted() -> dict:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > MAX_BODY:  # FastAPI passes an HTTPException from reading the body on
                raise HTTPException(413, f"the request body is past {MAX_BODY} bytes")
            return message

        await self.app(scope, counted, send)


def build_app(served: Served) -> FastAPI:
    prompts = Prompts(served.tokenizer, served.prompt_cap())

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        yield
        prompts.close()

    app = FastAPI(title="placer serve", docs_url=None, redoc_url=None, openapi_url=None,
                  lifespan=lifespan)
    install_error_handlers(app)
    app.add_middleware(BodyLimit)

    @app.get("/health")
    async def health() -> JSONResponse:
        ok = served.engine.healthy()
        return JSONResponse({"status": "ok" if ok else "unavailable",
                             "batching": served.engine.mode, "fallback": served.fallback},
                            status_code=200 if ok else 503)

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{"id": served.model_id, "object": "model",
                                            "created": 0, "owned_by": "placer"}]}

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(served.metrics.registry),
                        media_type=CONTENT_TYPE_LATEST)

    @app.post("/v1/completions", response_model=None)
    async def completions(body: CompletionRequest) -> Response:
        texts = check(served, body).texts()
        ids = [await prompts.text(text) for text in texts]
        jobs = accept(served, body, "completions", ids, body.max_tokens)
        return await answer(served, jobs, body)

    @app.post("/v1/chat/completions", response_model=None)
    async def chat(body: ChatRequest) -> Response:
        messages = [{"role": m.role, "content": m.text()}
                    for m in check(served, body).messages]
        ids = await prompts.messages(messages)
        jobs = accept(served, body, "chat", [ids], body.limit())
        return await answer(served, jobs, body)

    return app


def install_error_handlers(app: FastAPI) -> None:
    """Every refusal in OpenAI's error shape (see module docstring)."""

    @app.exception_handler(ApiError)
    async def api_error(_request: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
        message = f"{where}: {first['msg']}" if where else first["msg"]
        return JSONResponse(ApiError(400, message, param=where or None).body(),
                            status_code=400)

    @app.exception_handler(HTTPException)
    async def http_error(_request: Request, exc: HTTPException) -> JSONResponse:
        return JSONResponse(ApiError(exc.status_code, str(exc.detail)).body(),
                            status_code=exc.status_code, headers=exc.headers)


def check(served: Served, body: Request_) -> Request_:
    """`body`, or an ApiError for what it asks that is refused whatever its prompts: checked
    before they are tokenized."""
    body.check_choices()
    if body.model != served.model_id:
        raise ApiError(404, f"model {body.model!r} is not served here (GET /v1/models: "
                            f"{served.model_id!r})", param="model")
    return body


def accept(served: Served, body: ChatRequest | CompletionRequest, endpoint: str,
           prompts: list[list[int]], max_tokens: int | None) -> list[Job]:
    """The request as one job per prompt, or an ApiError saying why it cannot be served."""
    reply, sampling = Reply(chat=endpoint == "chat", model=served.model_id), body.sampling()
    jobs = [accept_prompt(served, endpoint, prompt_ids, max_tokens)
            for prompt_ids in prompts]
    if not served.engine.healthy():
        raise ApiError(503, "the engine is not generating (see GET /health)",
                       kind="server_error")
    return [Job(endpoint, prompt_ids, limit, body.stops(), reply, sampling, index)
            for index, (prompt_ids, limit) in enumerate(jobs)]


def accept_prompt(served: Served, endpoint: str, prompt_ids: list[int],
                  max_tokens: int | None) -> tuple[list[int], int]:
    """A prompt and its token limit, or an ApiError: it must fit the context."""
    room = served.max_context - len(prompt_ids)
    if room < 1:
        raise ApiError(400, f"the prompt is {len(prompt_ids)} tokens: the context holds "
                            f"{served.max_context}", param="messages" if endpoint == "chat"
                       else "prompt")
    if max_tokens is None:
        max_tokens = room if endpoint == "chat" else min(DEFAULT_MAX_TOKENS, room)
    if max_tokens > room:
        raise ApiError(400, f"{len(prompt_ids)} prompt tokens + max_tokens {max_tokens} "
                            f"exceed the context of {served.max_context} tokens",
                       param="max_tokens")
    return prompt_ids, max_tokens


async def answer(served: Served, jobs: list[Job], body: ChatRequest | CompletionRequest
                 ) -> Response:
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return StreamingResponse(events(served, jobs, include_usage),
                                 media_type="text/event-stream")
    streams = [TextStream(served.tokenizer, job.stops) for job in jobs]

    async def text_of(job: Job, stream: TextStream) -> str:
        return "".join([piece async for piece in generate(served, job, stream)])

    try:
        texts = await asyncio.gather(*(text_of(j, s) for j, s in zip(jobs, streams,
                                                                    strict=True)))
    except EngineClosed as exc:
        raise ApiError(503, str(exc), kind="server_error") from None
    except RuntimeError as exc:
        raise ApiError(500, str(exc), kind="server_error") from None
    choices = [(text, finish_reason(s, j.max_tokens))
               for text, s, j in zip(texts, streams, jobs, strict=True)]
    return JSONResponse(jobs[0].reply.whole(choices, used(jobs, streams)))


def used(jobs: list[Job], streams: list[TextStream]) -> dict:
    """The usage of a request: its prompts' tokens and its completions', summed."""
    return usage(sum(len(j.prompt_ids) for j in jobs), sum(len(s.tokens) for s in streams))


async def generate(served: Served, job: Job, stream: TextStream) -> AsyncIterator[str]:
    """The request's text as it is generated (cut at a stop string), counted in the
    metrics; a RuntimeError if the engine failed the request."""
    metrics = served.metrics
    metrics.running.inc()
    status = "error"
    try:
        updates = served.engine.generate(job.prompt_ids, job.max_tokens, uuid.uuid4().hex,
                                         job.sampling)
        async with aclosing(updates):  # leaving early cancels the request in the engine
            async for update in updates:
                if update.error:
                    raise RuntimeError(f"generation failed: {update.error}")
                piece = stream.feed(update.tokens, update.finished)
                if piece:
                    yield piece
                if stream.stopped:
                    break
        status = "ok"
    finally:
        metrics.running.dec()
        metrics.requests.labels(job.endpoint, status).inc()
        metrics.prompt.inc(len(job.prompt_ids))
        metrics.generated.inc(len(stream.tokens))


def sse(obj: dict | str) -> str:
    return f"data: {obj if isinstance(obj, str) else json.dumps(obj)}\n\n"


async def events(served: Served, jobs: list[Job], include_usage: bool
                 ) -> AsyncIterator[str]:
    """The server-sent events of a streamed reply, the prompts' choices interleaved as their
    text comes (each chunk names its choice's index); a failure after the first event is an
    error event (the status line is sent), then [DONE]."""
    streams = [TextStream(served.tokenizer, job.stops) for job in jobs]
    reply = jobs[0].reply
    if reply.chat:
        yield sse(reply.chunk(None, role=True))
    chunks: asyncio.Queue = asyncio.Queue()

    async def produce(job: Job, stream: TextStream) -> None:
        """The job's chunks into `chunks`, as (chunk, whether it is the job's last)."""
        try:
            async for piece in generate(served, job, stream):
                await chunks.put((reply.chunk(piece, index=job.index), False))
            await chunks.put((reply.chunk(None, finish_reason(stream, job.max_tokens),
                                          index=job.index), True))
        except (EngineClosed, RuntimeError) as exc:
            await chunks.put((ApiError(500, str(exc), kind="server_error").body(), True))

    tasks = [asyncio.create_task(produce(j, s)) for j, s in zip(jobs, streams, strict=True)]
    try:
        finished = 0
        while finished < len(jobs):
            chunk, last = await chunks.get()
            finished += last
            yield sse(chunk)
        if include_usage:
            yield sse(reply.usage_chunk(used(jobs, streams)))
    finally:
        for task in tasks:
            task.cancel()
    yield sse("[DONE]")
