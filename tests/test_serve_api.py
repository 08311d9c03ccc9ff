"""The HTTP layer of `placer serve` over a scripted engine (no model): replies and streams in
the OpenAI shapes, stop strings, every refusal a 4xx with an OpenAI error body, metrics."""

from __future__ import annotations

import json
from contextlib import nullcontext

import pytest
from fastapi.testclient import TestClient

from placer.runtime.counters import StagingCounters
from placer.serve.app import Served, build_app
from placer.serve.engine import Sampling, Update
from placer.serve.metrics import ServerMetrics
from placer.serve.openai_api import TextStream

LETTERS = "abcdefghij"
TOKENS = [0, 1, 2, 3, 4, 5]  # "abcdef"


class Tokenizer:
    """One token per letter; no chat template (chats render as "role: content" lines)."""

    chat_template = None

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict:
        return {"input_ids": [ord(c) % 10 for c in text]}

    def decode(self, tokens: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(LETTERS[t] if t < 10 else "\ufffd" for t in tokens)


class Engine:
    """Generates TOKENS one by one; remembers the requests left before their end."""

    mode = "continuous"

    def __init__(self, healthy: bool = True) -> None:
        self.up = healthy
        self.left: list[str] = []
        self.asked: list[tuple[list[int], Sampling | None]] = []

    def healthy(self) -> bool:
        return self.up

    async def generate(self, prompt_ids, max_new_tokens, request_id, sampling=None):
        self.asked.append((prompt_ids, sampling))
        n = min(max_new_tokens, len(TOKENS) - len(prompt_ids) % 2)  # prompts end apart
        done = False
        try:
            for i in range(1, n + 1):
                done = i == n
                yield Update(TOKENS[:i], done)
        finally:
            if not done:
                self.left.append(request_id)

    def batch_request_ids(self):
        return None


def served(engine: Engine | None = None, context: int = 64) -> Served:
    counters = StagingCounters((0, 1), 2)
    counters.record(0, 1, nbytes=4096, copies=2, hits=1)
    return Served(engine or Engine(), Tokenizer(), "tiny", context,
                  ServerMetrics(counters, nullcontext()))


@pytest.fixture
def client() -> TestClient:
    return TestClient(build_app(served()))


def events(response) -> list[str]:
    return [line.removeprefix("data: ") for line in response.text.split("\n\n") if line]


def test_completion_whole_and_streamed_agree(client):
    whole = client.post("/v1/completions", json={"model": "tiny", "prompt": "hi",
                                                 "max_tokens": 4})
    assert whole.status_code == 200
    body = whole.json()
    assert body["object"] == "text_completion"
    assert body["choices"][0] | {} == {"index": 0, "text": "abcd", "finish_reason": "length",
                                       "logprobs": None}
    assert body["usage"] == {"prompt_tokens": 2, "completion_tokens": 4, "total_tokens": 6}
    streamed = client.post("/v1/completions", json={"model": "tiny", "prompt": "hi",
                                                    "max_tokens": 4, "stream": True})
    assert streamed.headers["content-type"].startswith("text/event-stream")
    chunks = events(streamed)
    assert chunks[-1] == "[DONE]"
    parsed = [json.loads(c) for c in chunks[:-1]]
    assert "".join(c["choices"][0]["text"] for c in parsed) == "abcd"
    assert parsed[-1]["choices"][0]["finish_reason"] == "length"


def test_stop_string_ends_the_completion_and_the_request():
    engine = Engine()
    client = TestClient(build_app(served(engine)))
    body = client.post("/v1/completions", json={"model": "tiny", "prompt": "hi",
                                                "max_tokens": 6, "stop": ["cd"]}).json()
    assert body["choices"][0]["text"] == "ab" and body["choices"][0]["finish_reason"] == "stop"
    assert len(engine.left) == 1  # generation stopped at the stop string


def test_chat_stream_has_role_content_finish_and_usage(client):
    response = client.post("/v1/chat/completions", json={
        "model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3,
        "stream": True, "stream_options": {"include_usage": True}})
    chunks = events(response)
    assert chunks[-1] == "[DONE]"
    parsed = [json.loads(c) for c in chunks[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in parsed)
    assert parsed[0]["choices"][0]["delta"]["role"] == "assistant"
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in parsed if c["choices"])
    assert text == "abc"
    assert parsed[-2]["choices"][0]["finish_reason"] == "length"
    assert parsed[-1]["choices"] == [] and parsed[-1]["usage"]["completion_tokens"] == 3
    whole = client.post("/v1/chat/completions", json={
        "model": "tiny", "messages": [{"role": "user", "content": [{"type": "text",
                                                                    "text": "hi"}]}]}).json()
    assert whole["choices"][0]["message"] == {"role": "assistant", "content": "abcdef"}
    assert whole["choices"][0]["finish_reason"] == "stop"  # ended before the context did


COMPLETION = {"model": "tiny", "prompt": "hi"}
BAD = [
    ("post", "/v1/completions", b"{not json", 400),
    ("post", "/v1/completions", b"[1, 2]", 400),
    ("post", "/v1/completions", b'{"model": "tiny", "prompt": "h\xffi"}', 400),  # not UTF-8
    ("post", "/v1/completions", b"[" * 100_000 + b"]" * 100_000, 400),
    ("post", "/v1/completions", b'{"model": "tiny", "prompt": "hi", "max_tokens": '
     + b"9" * 5000 + b"}", 400),
    ("post", "/v1/completions", b'{"model": "tiny", "prompt": "hi", "max_tokens": NaN}', 400),
    ("post", "/v1/completions", {"model": "tiny"}, 400),
    ("post", "/v1/completions", {**COMPLETION, "prompt": ""}, 400),
    ("post", "/v1/completions", {**COMPLETION, "prompt": ["a", ""]}, 400),
    ("post", "/v1/completions", {**COMPLETION, "prompt": []}, 400),
    ("post", "/v1/completions", {**COMPLETION, "prompt": ["a"] * 65}, 400),
    ("post", "/v1/completions", {**COMPLETION, "temperature": -0.5}, 400),
    ("post", "/v1/completions", {**COMPLETION, "top_p": 0}, 400),
    ("post", "/v1/completions", {**COMPLETION, "seed": 2**64}, 400),
    ("post", "/v1/completions", {**COMPLETION, "n": 2}, 400),
    ("post", "/v1/completions", {**COMPLETION, "max_tokens": 0}, 400),
    ("post", "/v1/completions", {**COMPLETION, "max_tokens": 63}, 400),
    ("post", "/v1/completions", {**COMPLETION, "prompt": "x" * 64}, 400),
    ("post", "/v1/completions", {**COMPLETION, "stop": ["a", "b", "c", "d", "e"]}, 400),
    ("post", "/v1/completions", {**COMPLETION, "model": "other"}, 404),
    ("post", "/v1/chat/completions", {"model": "tiny", "messages": []}, 400),
    ("post", "/v1/chat/completions", {"model": "tiny", "messages": [
        {"role": "wizard", "content": "hi"}]}, 400),
    ("post", "/v1/chat/completions", {"model": "tiny", "messages": [
        {"role": "user", "content": [{"type": "image_url", "image_url": "x"}]}]}, 400),
    ("get", "/v1/completions", None, 405),
    ("get", "/v2/nothing", None, 404),
]


@pytest.mark.parametrize(("method", "path", "body", "status"), BAD,
                         ids=[f"{m} {p} {s} #{i}" for i, (m, p, _, s) in enumerate(BAD)])
def test_a_bad_request_gets_a_4xx_with_an_openai_error(client, method, path, body, status):
    kwargs = {"content": body} if isinstance(body, bytes) else {"json": body}
    response = client.request(method.upper(), path, **({} if body is None else kwargs))
    assert response.status_code == status
    error = response.json()["error"]
    assert isinstance(error["message"], str) and error["message"]
    assert error["type"] == "invalid_request_error"


def test_an_engine_that_stopped_is_a_503(client):
    client = TestClient(build_app(served(Engine(healthy=False))))
    assert client.get("/health").status_code == 503
    response = client.post("/v1/completions", json=COMPLETION)
    assert response.status_code == 503 and response.json()["error"]["type"] == "server_error"


def test_models_health_and_metrics(client):
    assert client.get("/v1/models").json()["data"][0]["id"] == "tiny"
    assert client.get("/health").json()["status"] == "ok"
    client.post("/v1/completions", json={**COMPLETION, "max_tokens": 5})
    text = client.get("/metrics").text
    assert 'placer_staged_bytes_total{card="1"} 4096.0' in text
    assert 'placer_staged_bytes_total{card="0"} 0.0' in text
    assert 'placer_staging_copies_total{card="1"} 2.0' in text
    assert 'placer_cache_hits_total{card="1"} 1.0' in text
    assert "placer_generated_tokens_total 5.0" in text
    assert 'placer_requests_total{endpoint="completions",status="ok"} 1.0' in text


def test_metrics_show_what_was_prefetched_where_the_runtime_prefetches():
    """A runtime that prefetches adds its counters by card; one that does not adds none."""
    counters = StagingCounters((0, 1), 2, prefetching=True)
    counters.record_ahead(1, 0, {"prefetched": 3, "useful": 1, "late": 1, "wasted": 1})
    counters.ahead_bytes[1, 0] += 3072
    text = TestClient(build_app(Served(Engine(), Tokenizer(), "tiny", 64, ServerMetrics(
        counters, nullcontext())))).get("/metrics").text
    assert 'placer_prefetched_total{card="0"} 3.0' in text
    assert 'placer_prefetch_late_total{card="0"} 1.0' in text
    assert 'placer_prefetch_bytes_total{card="0"} 3072.0' in text
    assert 'placer_prefetch_wasted_total{card="1"} 0.0' in text
    plain = TestClient(build_app(served())).get("/metrics").text
    assert "placer_prefetch" not in plain


def test_text_stream_holds_back_an_incomplete_character_and_a_stop_prefix():
    stream = TextStream(Tokenizer(), ["cx", "bcd"])
    assert stream.feed([0], False) == "a"
    assert stream.feed([0, 10], False) == ""  # ends in an incomplete character: wait
    assert stream.feed([0, 10, 1], False) == "\ufffd"  # "b" may begin "bcd"
    assert stream.feed([0, 10, 1, 2], False) == ""  # "bc" may begin "bcd", "c" "cx"
    assert stream.feed([0, 10, 1, 2, 4], False) == "bce" and not stream.stopped
    assert stream.feed([0, 10, 1, 2, 4, 1, 2, 3], False) == "" and stream.stopped
    assert stream.sent == "a\ufffdbce"
    last = TextStream(Tokenizer(), ["cd"])
    assert last.feed([0, 1, 2], False) == "ab" and last.feed([0, 1, 2], True) == "c"


def test_a_body_past_the_limit_is_a_413_before_it_is_read(client):
    """A body past MAX_BODY is refused by its Content-Length, or, sent chunked without one,
    as it arrives: a hostile client cannot make the server hold gigabytes."""
    from placer.serve.app import MAX_BODY

    def chunks():
        for _ in range(64):
            yield b" " * (1 << 20)

    for kwargs in ({"content": b" " * (MAX_BODY + 1)}, {"content": chunks()}):
        response = client.post("/v1/completions", headers={"content-type": "application/json"},
                               **kwargs)
        assert response.status_code == 413, response.text
        assert response.json()["error"]["message"].startswith("the request body is")
    assert client.post("/v1/completions", json=COMPLETION).status_code == 200


def test_a_list_of_prompts_gets_one_choice_each_whole_and_streamed():
    engine = Engine()
    client = TestClient(build_app(served(engine)))
    body = client.post("/v1/completions", json={"model": "tiny", "prompt": ["hi", "hey"],
                                                "max_tokens": 6}).json()
    assert [(c["index"], c["text"], c["finish_reason"]) for c in body["choices"]] == [
        (0, "abcdef", "length"), (1, "abcde", "stop")]
    assert body["usage"] == {"prompt_tokens": 5, "completion_tokens": 11, "total_tokens": 16}
    assert [ids for ids, _ in engine.asked] == [[4, 5], [4, 1, 1]]
    streamed = client.post("/v1/completions", json={
        "model": "tiny", "prompt": ["hi", "hey"], "max_tokens": 6, "stream": True,
        "stream_options": {"include_usage": True}})
    chunks = [json.loads(c) for c in events(streamed)[:-1]]
    texts = {0: "", 1: ""}
    for c in chunks[:-1]:
        texts[c["choices"][0]["index"]] += c["choices"][0]["text"]
    assert texts == {0: "abcdef", 1: "abcde"}
    assert chunks[-1]["usage"]["completion_tokens"] == 11


@pytest.mark.parametrize(("asked", "sampling"), [
    ({}, None), ({"temperature": 0}, None), ({"temperature": 0, "top_p": 0.5}, None),
    ({"temperature": 0.7, "seed": 5}, Sampling(0.7, 1.0, 5)),
    ({"top_p": 0.9, "seed": -3}, Sampling(1.0, 0.9, -3)),
    ({"temperature": 1.3, "top_p": 0.8, "seed": 0}, Sampling(1.3, 0.8, 0))])
def test_sampling_reaches_the_engine_and_temperature_0_is_greedy(asked, sampling):
    engine = Engine()
    client = TestClient(build_app(served(engine)))
    for path, body in (("/v1/completions", COMPLETION), ("/v1/chat/completions", {
            "model": "tiny", "messages": [{"role": "user", "content": "hi"}]})):
        assert client.post(path, json={**body, **asked, "max_tokens": 2}).status_code == 200
    assert [s for _, s in engine.asked] == [sampling, sampling]


def test_sampling_without_a_seed_draws_one():
    engine = Engine()
    client = TestClient(build_app(served(engine)))
    for _ in range(2):
        client.post("/v1/completions", json={**COMPLETION, "temperature": 0.5})
    seeds = [s.seed for _, s in engine.asked]
    assert seeds[0] != seeds[1] and all(s.temperature == 0.5 for _, s in engine.asked)


@pytest.mark.parametrize(("field", "raw"), [
    ("temperature", "2.5"), ("temperature", "-0.1"), ("temperature", "Infinity"),
    ("temperature", "NaN"), ("temperature", "1e999"), ("top_p", "0"), ("top_p", "1.5"),
    ("top_p", "-Infinity"), ("top_p", "NaN"), ("stop", '["\\udfff"]'),
    ("user", '"\\ud800 alone"')])
def test_a_sampling_value_the_openai_api_refuses_is_a_400(field, raw):
    """Sent as raw JSON (Python's parser reads Infinity and NaN), to both endpoints: each a
    400 in OpenAI's shape, the engine never asked."""
    engine = Engine()
    client = TestClient(build_app(served(engine)))
    for head in ('"prompt": "hi"', '"messages": [{"role": "user", "content": "hi"}]',
                 '"prompt": "\\udc00 lone"',
                 '"messages": [{"role": "user", "content": "\\ud800"}]'):
        path = "/v1/chat/completions" if "messages" in head else "/v1/completions"
        for text in (f'{{"model": "tiny", {head}, "max_tokens": 2, "{field}": {raw}}}',
                     f'{{"model": "tiny", {head}, "max_tokens": 2}}'):
            response = client.post(path, content=text,
                                   headers={"content-type": "application/json"})
            if "\\ud" in head or text.endswith(f"{raw}}}"):
                assert response.status_code == 400, (text, response.text)
                assert response.json()["error"]["type"] == "invalid_request_error"
            else:
                assert response.status_code == 200, (text, response.text)
    assert len(engine.asked) == 2  # the two valid requests, and nothing else


def test_a_temperature_below_greedy_below_is_greedy():
    """1e-300 is a temperature the API allows: it decodes greedily (dividing by it would
    overflow the logits to inf and the softmax to NaN)."""
    engine = Engine()
    client = TestClient(build_app(served(engine)))
    reply = client.post("/v1/completions", json={**COMPLETION, "temperature": 1e-300,
                                                 "max_tokens": 2})
    assert reply.status_code == 200 and engine.asked[0][1] is None


def test_a_megabyte_stop_string_costs_time_linear_in_the_text_generated():
    """The held-back end and the match are one KMP state per stop string: feeding a stream
    with a 1 MB stop string (whose first characters the text keeps matching) token by
    token takes about what it takes with a short one, not a rescan of the stop string per
    token."""
    import time

    def run(stop: str) -> float:
        stream = TextStream(Tokenizer(), [stop, "j"])
        tokens = [0, 1, 2] * 300  # "abcabc...": matches a prefix of "abcabc..." each time
        start = time.perf_counter()
        for n in range(1, len(tokens) + 1):
            stream.feed(tokens[:n], False)
        stream.feed(tokens, True)
        assert stream.sent == "abc" * 300 and not stream.stopped
        return time.perf_counter() - start

    short = run("abcx")
    long = run("abc" * 350_000 + "x")  # about 1 MB
    assert long < 20 * short + 0.5, (long, short)
