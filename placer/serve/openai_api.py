"""The OpenAI API as `placer serve` speaks it: requests checked, prompts encoded, replies and
stream chunks built, text decoded as tokens arrive.

Decoding is greedy (what `placer run` does, and what the placement's cost model replays)
unless a request samples: `temperature` above 0 (or absent with `top_p` below 1, OpenAI's
default temperature being 1) samples through transformers' generation (its temperature and
top-p logits warpers), reproducibly for a given `seed` (a fresh one where none is given);
`temperature` 0 (or below GREEDY_BELOW) is greedy whatever `top_p` says. Sampling values are
checked as the OpenAI API documents them: `temperature` a finite number in [0, 2], `top_p` in
(0, 1] (JSON's `Infinity` and `NaN`, which Python's parser reads, are refused), and every
string of a request valid Unicode (no lone surrogate); each refusal is a 400. `n` must be 1.
A completion's `prompt` may be a list of prompts (at most MAX_PROMPTS): one choice each, by
index. `stop` strings end a completion (finish_reason "stop"); reaching `max_tokens` ends it
with "length". Everything else a client may send (`user`, `logprobs` ...) is accepted and ignored.
"""

from __future__ import annotations

import secrets
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from placer.serve.engine import Sampling
from traces.collecting.collect import encode_document
from traces.collecting.corpora import Document

DEFAULT_MAX_TOKENS = 16  # OpenAI's default for completions
MAX_PROMPTS = 64  # prompts in one completion request
MAX_SEED = 2**63 - 1
# A temperature this low samples greedily (dividing logits by 1e-300 overflows them to inf
# and the softmax to NaN): vLLM's _SAMPLING_EPS, vllm/sampling_params.py (v0.6).
GREEDY_BELOW = 1e-5


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
    temperature: float | None = Field(default=None, ge=0, le=2, allow_inf_nan=False)
    top_p: float | None = Field(default=None, gt=0, le=1, allow_inf_nan=False)
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

    @model_validator(mode="after")
    def _unicode(self) -> _Request:
        """Every string of the request is valid Unicode: JSON's \\ud800 escapes decode to
        lone surrogates, which no tokenizer encodes."""
        bad = _lone_surrogate(self.model_dump())
        if bad is not None:
            raise ValueError(f"{bad}: a lone surrogate (\\ud800-\\udfff alone) is not "
                             "Unicode text")
        return self

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
        if temperature < GREEDY_BELOW or (self.temperature is None and top_p == 1):
            return None
        return Sampling(temperature, top_p,
                        secrets.randbits(63) if self.seed is None else self.seed)


def _lone_surrogate(value: Any, where: str = "") -> str | None:
    """Where in `value` (a request as plain data) a string holds a lone surrogate."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return where or "body"
        return None
    items = value.items() if isinstance(value, dict) else \
        enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        if isinstance(key, str) and _lone_surrogate(key) is not None:
            return where or "body"
        bad = _lone_surrogate(item, f"{where}.{key}" if where else str(key))
        if bad is not None:
            return bad
    return None


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


class StopMatcher:
    """Where a stop string ends in a text fed one character at a time: Knuth-Morris-Pratt,
    its failure table built lazily (only as far as the longest match so far), so a stop
    string of a megabyte costs nothing until the text matches that much of it, and each
    character costs amortized O(1): the whole is linear in the text generated."""

    def __init__(self, stop: str) -> None:
        self.stop = stop
        self.state = 0  # the longest end of the text fed that begins `stop`
        self._fail = [0]  # _fail[i]: the failure link of the prefix of length i + 1

    def _link(self, length: int) -> int:
        """The longest proper border of stop[:length] (length >= 1)."""
        fail, stop = self._fail, self.stop
        while len(fail) < length:
            j, k = len(fail), fail[-1]
            while k and stop[j] != stop[k]:
                k = fail[k - 1]
            fail.append(k + 1 if stop[j] == stop[k] else 0)
        return fail[length - 1]

    def feed(self, char: str) -> bool:
        """Advance by `char`; whether the text fed now ends with the stop string."""
        k = self.state
        while k and self.stop[k] != char:
            k = self._link(k)
        self.state = k + 1 if self.stop[k] == char else 0
        if self.state == len(self.stop):
            self.state = self._link(self.state)
            return True
        return False


@dataclass
class TextStream:
    """Decodes a request's tokens as they arrive: `feed` returns the new text, cut at the
    first stop string; it holds back an incomplete last character and an end that may be
    the start of a stop string, until the next tokens (or the last) settle them.

    Incremental, as vLLM's detokenizer is (vllm/transformers_utils/detokenizer_utils.py,
    detokenize_incrementally, v0.6): each feed decodes only the tokens since the last
    settled text with the few before them as context, and each new character passes once
    through every stop string's StopMatcher; nothing rescans the text or the stop strings."""

    tokenizer: Any
    stops: list[str]
    stopped: bool = False
    tokens: list[int] = field(default_factory=list)
    _sent: list[str] = field(default_factory=list)  # the pieces returned so far
    _held: str = ""  # settled text not returned yet: it may begin a stop string
    _prefix: int = 0  # tokens decoded as context before the unsettled ones
    _read: int = 0  # tokens whose text is settled
    _matchers: list[StopMatcher] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._matchers = [StopMatcher(stop) for stop in self.stops]

    @property
    def sent(self) -> str:
        """The text returned so far."""
        return "".join(self._sent)

    def feed(self, tokens: list[int], final: bool) -> str:
        if self.stopped:
            return ""
        self.tokens = tokens
        held = self._held + self._decode(tokens, final)
        for i in range(len(self._held), len(held)):
            ends = [len(m.stop) for m in self._matchers if m.feed(held[i])]
            if ends:  # the text ends at the start of the longest stop string ending here
                self.stopped, self._held = True, ""
                return self._send(held[:max(i + 1 - max(ends), 0)])
        keep = 0 if final else max((m.state for m in self._matchers), default=0)
        self._held = held[len(held) - keep:] if keep else ""
        return self._send(held[:len(held) - keep])

    def _send(self, piece: str) -> str:
        if piece:
            self._sent.append(piece)
        return piece

    def _decode(self, tokens: list[int], final: bool) -> str:
        """The text of the tokens past the settled ones ("" while it ends in an incomplete
        character, unless `final`)."""
        decode = self.tokenizer.decode
        before = decode(tokens[self._prefix:self._read], skip_special_tokens=True)
        text = decode(tokens[self._prefix:], skip_special_tokens=True)
        if len(text) <= len(before) or (text.endswith("\ufffd") and not final):
            return ""
        self._prefix, self._read = self._read, len(tokens)
        return text[len(before):]


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
