"""The OpenAI API as `placer serve` speaks it: requests checked, prompts encoded, replies and
stream chunks built, text decoded as tokens arrive.

Only greedy decoding is served (what `placer run` does, and what the placement's cost model
replays): `temperature` must be 0 or absent, `top_p` 1 or absent, `n` 1. `stop` strings end
a completion (finish_reason "stop"); reaching `max_tokens` ends it with "length".
Everything else a client may send (`user`, `seed`, `logprobs` ...) is accepted and ignored.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from traces.collect import encode_document
from traces.corpora import Document

DEFAULT_MAX_TOKENS = 16  # OpenAI's default for completions


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

    def check_greedy(self) -> None:
        """ApiError unless the request asks for what the server does: greedy, one choice."""
        if self.temperature not in (None, 0):
            raise ApiError(400, "placer serve decodes greedily: temperature must be 0 or "
                                "absent", param="temperature")
        if self.top_p not in (None, 1):
            raise ApiError(400, "placer serve decodes greedily: top_p must be 1 or absent",
                           param="top_p")
        if self.n != 1:
            raise ApiError(400, "placer serve returns one choice: n must be 1", param="n")


class CompletionRequest(_Request):
    prompt: str | list[str]

    def text(self) -> str:
        prompts = [self.prompt] if isinstance(self.prompt, str) else self.prompt
        if len(prompts) != 1:
            raise ApiError(400, "one prompt per request", param="prompt")
        if not prompts[0]:
            raise ApiError(400, "the prompt is empty", param="prompt")
        return prompts[0]


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

    def whole(self, text: str, reason: str, used: dict) -> dict:
        choice: dict = {"index": 0, "finish_reason": reason}
        if self.chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice |= {"text": text, "logprobs": None}
        return {**self._envelope(False), "choices": [choice], "usage": used}

    def chunk(self, text: str | None, reason: str | None = None, *, role: bool = False
              ) -> dict:
        """A stream chunk: new text (or, first in a chat, the role), or the finish."""
        choice: dict = {"index": 0, "finish_reason": reason}
        if self.chat:
            choice["delta"] = {"role": "assistant", "content": ""} if role else \
                ({} if text is None else {"content": text})
        else:
            choice |= {"text": text or "", "logprobs": None}
        return {**self._envelope(True), "choices": [choice]}

    def usage_chunk(self, used: dict) -> dict:
        return {**self._envelope(True), "choices": [], "usage": used}
