"""The OpenAI API as `placer serve` speaks it: requests checked, prompts encoded, replies and
stream chunks built, text decoded as tokens arrive.

Decoding is greedy (what `placer run` does, and what the placement's cost model replays)
unless a request samples: `temperature` above 0 (or absent with `top_p` below 1, OpenAI's
default temperature being 1) samples through transformers' generation (its temperature and
top-p logits warpers), reproducibly for a given `seed` (a fresh one where none is given);
`temperature` 0 is greedy whatever `top_p` says. `n` must be 1. A completion's `prompt` may
be a list of prompts (at most MAX_PROMPTS): one choice each, by index. `stop` strings end a
completion (finish_reason "stop"); reaching `max_tokens` ends it with "length". Everything
else a client may send (`user`, `logprobs` ...) is accepted and ignored.
"""

from __future__ import annotations

import secrets
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from placer.serve.engine import Sampling
from traces.collect import encode_document
from traces.corpora import Document

DEFAULT_MAX_TOKENS = 16  # OpenAI's default for completions
MAX_PROMPTS = 64  # prompts in one completion request
MAX_SEED = 2**63 - 1


class ApiError(Exception):
    """A request the server refuses: HTTP `status`, OpenAI error `kind` and `param`."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error",
                 param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.kind, self.param = status, message, kind, param

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param,
                          "code": None}}


class StreamOptions(BaseModel):
    include_usage: bool = False


class _Request(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0)
    top_p: float | None = Field(default=None, gt=0, le=1)
    n: int = Field(default=1, ge=1)
    seed: int | None = Field(default=None, ge=-MAX_SEED, le=MAX_SEED)
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None

    @field_validator("stop")
    @classmethod
    def _stops(cls, value: str | list[str] | None) -> str | list[str] | None:
        if isinstance(value, list) and (len(value) > 4 or not all(value)):
            raise ValueError("at most 4 stop strings, none empty")
        return value

    def stops(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    def check_choices(self) -> None:
        """ApiError unless the request asks for one choice (per prompt)."""
        if self.n != 1:
            raise ApiError(400, "placer serve returns one choice per prompt: n must be 1",
                           param="n")

    def sampling(self) -> Sampling | None:
        """How to sample (see module docstring); None: greedily."""
        temperature = 1.0 if self.temperature is None else self.temperature
        top_p = 1.0 if self.top_p is None else self.top_p
        if temperature == 0 or (self.temperature is None and top_p == 1):
            return None
        return Sampling(temperature, top_p,
                        secrets.randbits(63) if self.seed is None else self.seed)


class CompletionRequest(_Request):
    prompt: str | list[str]

    def texts(self) -> list[str]:
        """The prompts, one choice each (a list of 1..MAX_PROMPTS, none empty)."""
        prompts = [self.prompt] if isinstance(self.prompt, str) else self.prompt
        if not 1 <= len(prompts) <= MAX_PROMPTS:
            raise ApiError(400, f"give 1 to {MAX_PROMPTS} prompts, not {len(prompts)}",
                           param="prompt")
        if not all(prompts):
            raise ApiError(400, "a prompt is empty", param="prompt")
        return prompts


class Message(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: str | list[dict[str, Any]]

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        if not all(p.get("type") == "text" and isinstance(p.get("text"), str)
                   for p in self.content):
            raise ApiError(400, "only text content parts are served", param="messages")
        return "".join(p["text"] for p in self.content)


class ChatRequest(_Request):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)

    def limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


def encode_text(tokenizer: Any, text: str) -> list[int]:
    """A completion prompt's token ids, as `placer run` and `placer collect` tokenize text."""
    return list(encode_document(Document(text=text), tokenizer, False))


def encode_messages(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    """A chat's token ids as `placer collect` renders chats, with the generation prompt."""
    return list(encode_document(Document(messages=tuple(messages)), tokenizer, True))


@dataclass
class TextStream:
    """Decodes a request's tokens as they arrive: `feed` returns the new text, cut at the
    first stop string; it holds back an incomplete last character and an end that may be
    the start of a stop string, until the next tokens (or the last) settle them."""

    tokenizer: Any
    stops: list[str]
    sent: str = ""
    stopped: bool = False
    tokens: list[int] = field(default_factory=list)

    def feed(self, tokens: list[int], final: bool) -> str:
        self.tokens = tokens
        text = self.tokenizer.decode(tokens, skip_special_tokens=True)
        cut = min((i for i in (text.find(s) for s in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            text, self.stopped = text[:cut], True
        elif not final:
            if text.endswith("\ufffd"):
                return ""
            text = text[:len(text) - self._stop_prefix(text)]
        if not text.startswith(self.sent):  # a retokenized prefix: wait for it to settle
            return ""
        new, self.sent = text[len(self.sent):], text
        return new

    def _stop_prefix(self, text: str) -> int:
        """The length of the longest end of `text` that begins a stop string."""
        return max((n for stop in self.stops for n in range(len(stop) - 1, 0, -1)
                    if text.endswith(stop[:n])), default=0)


def finish_reason(stream: TextStream, max_tokens: int) -> str:
    return "length" if not stream.stopped and len(stream.tokens) >= max_tokens else "stop"


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


@dataclass(frozen=True)
class Reply:
    """The envelope of one reply (or stream) to one request."""

    chat: bool
    model: str
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    created: int = field(default_factory=lambda: int(time.time()))

    def _envelope(self, chunk: bool) -> dict:
        kind = "chat.completion" if self.chat else "text_completion"
        return {"id": f"{'chatcmpl' if self.chat else 'cmpl'}-{self.id}",
                "object": f"{kind}.chunk" if chunk and self.chat else kind,
                "created": self.created, "model": self.model}

    def whole(self, choices: list[tuple[str, str]], used: dict) -> dict:
        """The reply: one choice per (text, finish reason), indexed in order."""
        out = []
        for index, (text, reason) in enumerate(choices):
            choice: dict = {"index": index, "finish_reason": reason}
            if self.chat:
                choice["message"] = {"role": "assistant", "content": text}
            else:
                choice |= {"text": text, "logprobs": None}
            out.append(choice)
        return {**self._envelope(False), "choices": out, "usage": used}

    def chunk(self, text: str | None, reason: str | None = None, *, role: bool = False,
              index: int = 0) -> dict:
        """A stream chunk of choice `index`: new text (or, first in a chat, the role), or
        the finish."""
        choice: dict = {"index": index, "finish_reason": reason}
        if self.chat:
            choice["delta"] = {"role": "assistant", "content": ""} if role else \
                ({} if text is None else {"content": text})
        else:
            choice |= {"text": text or "", "logprobs": None}
        return {**self._envelope(True), "choices": [choice]}

    def usage_chunk(self, used: dict) -> dict:
        return {**self._envelope(True), "choices": [], "usage": used}
