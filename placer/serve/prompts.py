"""A request's prompts into token ids for `placer serve`: bounded in tokens, in the memory
their tokenization takes, and in how long they hold other requests up.

A prompt may hold at most `cap` tokens (`placer serve --max-prompt-tokens`, at most the
model's context). A request body may hold 4 MiB of text, which a byte-level tokenizer makes
2 million tokens, and tokenizing that whole took 11 s and a gigabyte of memory (two at once
aborted the server: issue #53). So a prompt longer than PIECE_CHARS characters is first
counted in pieces of at most PIECE_CHARS, cut at whitespace, stopping as soon as the pieces
so far hold more than `cap` tokens (less PIECE_SLACK per piece, for what tokenizing across a
cut changes): it is refused then, with a 400 naming the limit, having tokenized at most about
`cap` tokens' worth of it. Only a prompt whose pieces fit is tokenized whole, exactly as
`placer run` and `placer collect` tokenize it (traces.collecting.collect.document_text), and
its count checked again.

All of it, a chat's template rendering included, runs on one worker thread of the app's
(`Prompts.pool`), one piece at a time in the order asked: the event loop and the engine's
threads keep running, one tokenization's memory is alive at a time (a fast tokenizer is not
reentrant either), and a short prompt waits for at most one piece of each longer prompt
being counted, never for the whole of one.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from placer.serve.openai_api import ApiError
from traces.collecting.collect import document_text
from traces.collecting.corpora import Document

PIECE_CHARS = 16384  # characters tokenized at once while counting: ~20-40 ms on a busy CPU
PIECE_SLACK = 4  # tokens one cut may add to a count (it adds none at whitespace, mostly)
CAP_OPTION = "placer serve --max-prompt-tokens"

T = TypeVar("T")


def pieces(text: str, size: int = PIECE_CHARS) -> Iterator[str]:
    """`text` in consecutive pieces of at most `size` characters, each cut just before the
    last whitespace of its second half where there is one (the cut tokenizers split at)."""
    start = 0
    while start < len(text):
        end = start + size
        if end < len(text):
            cut = max(text.rfind(c, start + size // 2, end) for c in " \n\t")
            end = cut if cut > start else end
        yield text[start:end]
        start = end


class Prompts:
    """The prompts of requests as token ids (see module docstring): `await text(...)`,
    `await messages(...)`, or an ApiError (400) for a prompt of more than `cap` tokens."""

    def __init__(self, tokenizer: Any, cap: int) -> None:
        self.tokenizer, self.cap = tokenizer, cap
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="placer-tokenize")

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(
            self.pool, functools.partial(fn, *args))

    async def text(self, text: str) -> list[int]:
        """A completion prompt's ids (the tokenizer's special tokens added)."""
        return await self._bounded(text, True, "prompt")

    async def messages(self, messages: list[dict[str, str]]) -> list[int]:
        """A chat's ids: the chat template (with the generation prompt) rendered, tokenized."""
        text, special = await self._run(document_text, Document(messages=tuple(messages)),
                                        self.tokenizer, True)
        return await self._bounded(text, special, "messages")

    async def _bounded(self, text: str, special: bool, param: str) -> list[int]:
        if len(text) > PIECE_CHARS:
            counted = read = 0
            for piece in pieces(text):
                counted += await self._run(self._count, piece) - PIECE_SLACK
                read += len(piece)
                if counted > self.cap:
                    raise ApiError(400, f"the prompt is over {self.cap} tokens, the most "
                                        f"a prompt may hold ({CAP_OPTION}): its first {read}"
                                        f" of {len(text)} characters hold at least {counted}",
                                   param=param)
        ids = await self._run(self._encode, text, special)
        if len(ids) > self.cap:
            raise ApiError(400, f"the prompt is {len(ids)} tokens: at most {self.cap}, the "
                                f"most a prompt may hold ({CAP_OPTION})", param=param)
        return ids

    def _count(self, piece: str) -> int:
        return len(self.tokenizer(piece, add_special_tokens=False)["input_ids"])

    def _encode(self, text: str, special: bool) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=special)["input_ids"])

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
