"""Prompts into tokens for `placer serve` (placer.serve.prompts), over a scripted tokenizer:
a prompt over the cap is refused having tokenized about the cap's worth of it, one that fits
is tokenized whole as `placer run` does, and a long prompt being counted holds a short one up
for at most one piece (issue #53)."""

from __future__ import annotations

import asyncio
import dataclasses
import time

import httpx
import pytest
from test_serve_api import Tokenizer, served

from placer.serve.app import build_app
from placer.serve.openai_api import ApiError
from placer.serve.prompts import PIECE_CHARS, Prompts, pieces


class Recording(Tokenizer):
    """One token per character; remembers the length of every text it tokenized, and takes
    `seconds_per_char` over each (sleeping, as a fast tokenizer's Rust code runs without
    the GIL)."""

    def __init__(self, seconds_per_char: float = 0.0) -> None:
        self.lengths: list[int] = []
        self.seconds_per_char = seconds_per_char

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict:
        self.lengths.append(len(text))
        time.sleep(len(text) * self.seconds_per_char)
        return {"input_ids": ([9] if add_special_tokens else []) + super().__call__(text)[
            "input_ids"]}


def test_pieces_cover_the_text_cut_before_whitespace():
    text = "word " * 10_000 + "x" * 40_000
    cut = list(pieces(text))
    assert "".join(cut) == text
    assert all(len(p) <= PIECE_CHARS for p in cut)
    assert all(p.startswith(" ") for p in cut[1:3])  # cut where the tokenizer splits
    assert max(len(p) for p in cut[-3:]) == PIECE_CHARS  # no whitespace: cut at the size


def test_a_prompt_over_the_cap_is_refused_after_about_the_caps_worth():
    tokenizer = Recording()
    prompts = Prompts(tokenizer, cap=100)
    with pytest.raises(ApiError) as refused:
        asyncio.run(prompts.text("a " * 2_000_000))
    assert refused.value.status == 400 and refused.value.param == "prompt"
    assert "over 100 tokens" in refused.value.message and "\n" not in refused.value.message
    assert "--max-prompt-tokens" in refused.value.message
    assert sum(tokenizer.lengths) <= PIECE_CHARS  # of 4 MB: one piece was counted

    big = Prompts(Recording(), cap=50_000)  # a cap of several pieces: counted piece by piece
    with pytest.raises(ApiError):
        asyncio.run(big.text("a" * 1_000_000))
    assert sum(big.tokenizer.lengths) <= 50_000 + 2 * PIECE_CHARS


def test_a_prompt_within_the_cap_is_tokenized_whole():
    tokenizer = Recording()
    text = "abc " * 10_000  # 40,000 characters: counted in pieces first
    ids = asyncio.run(Prompts(tokenizer, cap=40_001).text(text))
    assert ids == tokenizer(text)["input_ids"]  # special tokens and all, as placer run
    assert tokenizer.lengths[-2] == len(text)
    with pytest.raises(ApiError, match="the prompt is 40001 tokens: at most 40000"):
        asyncio.run(Prompts(tokenizer, cap=40_000).text(text))  # the whole count decides
    chat = asyncio.run(Prompts(tokenizer, cap=100).messages([{"role": "user",
                                                              "content": "hi"}]))
    assert chat == tokenizer("user: hi")["input_ids"]


def test_a_short_prompt_waits_for_one_piece_of_a_long_one_not_all_of_it():
    """A 1 MB prompt takes ~0.5 s to count piece by piece before it is refused; a short
    request sent meanwhile is answered within a few pieces' time (all of it, before)."""
    tokenizer = Recording(seconds_per_char=1e-6)  # ~16 ms a piece
    app = build_app(dataclasses.replace(served(context=10_000_000), tokenizer=tokenizer,
                                        max_prompt_tokens=500_000))

    async def go() -> tuple[float, float, int]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            start = time.monotonic()
            big = asyncio.create_task(client.post("/v1/completions", json={
                "model": "tiny", "prompt": "ab " * 333_334, "max_tokens": 2}))
            await asyncio.sleep(0.1)
            asked = time.monotonic()
            small = await client.post("/v1/completions", json={"model": "tiny",
                                                               "prompt": "hi", "max_tokens": 2})
            took = time.monotonic() - asked
            assert small.status_code == 200, small.text
            refused = await big
            return took, time.monotonic() - start, refused.status_code

    took, whole, status = asyncio.run(go())
    assert status == 400
    assert took < 0.25 < whole, (took, whole)
