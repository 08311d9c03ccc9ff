"""`placer serve` under prompts of megabytes (issue #53): a real server on 127.0.0.1, its
address space bounded as the issue's was, given 1-4 MB prompts and 3-token completions at
once. Before, two 4 MB prompts at once aborted it (`memory allocation of 142606352 bytes
failed` in the tokenizer), one took 11-15 s and left it 0.6 GB larger, and a 3-token
completion sent beside a 2 MB prompt took 3.6-8 s instead of 0.03-0.3 s. Now every large
prompt is a 400 within a second, the small ones are answered as fast as alone (within
max(SMALL_BOUND_S, 10 x alone)), and the server's memory ends where it began."""

from __future__ import annotations

import math
import re
import resource
import statistics
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from test_serve import Server, placed, start_server  # noqa: F401 (placed: a fixture)

pytest_plugins = ["fixtures_models"]

CAP = 200  # --max-prompt-tokens of the server here (the tiny model's context is 512)
HEADROOM = 1 << 30  # address space the server may add after its start: the 4 GB
# limit left its server 1.1 GB over the 2.9 GB it took to start
SMALL_BOUND_S = 2.0  # a 3-token completion beside large prompts: below this or 10 x alone
MB4 = "a " * 2_000_000  # 4,000,000 bytes: a body under the 4 MiB limit


def status_kb(pid: int, field: str) -> int:
    return int(re.search(rf"^{field}:\s+(\d+) kB", Path(f"/proc/{pid}/status").read_text(),
                         re.M)[1])


@pytest.fixture(scope="module")
def server(placed) -> Iterator[Server]:  # noqa: F811
    """A server with a prompt cap of CAP tokens, its address space bounded to what it took
    to start + HEADROOM (RLIMIT_AS, as `ulimit -v`)."""
    server = start_server(placed[1], placed[0], "--max-prompt-tokens", str(CAP))
    pid = server.process.pid
    limit = max(status_kb(pid, "VmPeak"), status_kb(pid, "VmSize")) * 1024 + HEADROOM
    resource.prlimit(pid, resource.RLIMIT_AS, (limit, limit))
    yield server
    assert server.stop() == 0


def complete(server: Server, prompt: str, tokens: int = 3, timeout: float = 60
             ) -> tuple[float, httpx.Response]:
    """(seconds, response) of a completion."""
    start = time.monotonic()
    response = httpx.post(f"{server.url}/v1/completions", timeout=timeout, json={
        "model": server.model, "prompt": prompt, "max_tokens": tokens})
    return time.monotonic() - start, response


def alone(server: Server) -> float:
    """The median seconds of a 3-token completion with nothing else asked."""
    took = []
    for i in range(3):
        seconds, response = complete(server, f"To be, or not to be {i}")
        assert response.status_code == 200, response.text
        took.append(seconds)
    return statistics.median(took)


def refused_over_cap(response: httpx.Response) -> None:
    assert response.status_code == 400, response.text[:300]
    message = response.json()["error"]["message"]
    assert "\n" not in message and (f"at most {CAP}" in message or f"over {CAP}" in message)
    assert "--max-prompt-tokens" in message, message


def test_a_prompt_over_the_cap_is_a_quick_400_and_the_server_answers_after(server):
    seconds, response = complete(server, MB4)
    refused_over_cap(response)
    assert seconds < 5, seconds  # 11-15 s before: tokenized whole, then refused
    _, response = complete(server, "word " * 150)  # ~300 tokens: fits the context, not CAP
    refused_over_cap(response)
    assert "at most 200" in response.json()["error"]["message"]
    response = httpx.post(f"{server.url}/v1/chat/completions", timeout=60, json={
        "model": server.model, "messages": [{"role": "user", "content": MB4}]})
    refused_over_cap(response)
    assert response.json()["error"]["param"] == "messages"
    _, response = complete(server, "To be, or not to be")
    assert response.status_code == 200 and response.json()["usage"]["completion_tokens"] == 3


@pytest.mark.parametrize("after_s", [0.05, 1.0])
def test_a_3_token_completion_beside_a_2_mb_prompt_is_as_quick_as_alone(server, after_s):
    """The issue's case: 3.59 s (8.26 s on a busy 2-core box) for a 3-token completion sent
    1 s after a 2 MB prompt, which it waited behind."""
    bound = max(SMALL_BOUND_S, 10 * alone(server))
    with ThreadPoolExecutor(1) as pool:
        large = pool.submit(complete, server, "a " * 1_000_000)
        time.sleep(after_s)
        seconds, response = complete(server, "To be, or not to be")
        refused_over_cap(large.result()[1])
    assert response.status_code == 200, response.text
    assert seconds < bound, (seconds, bound)


def test_large_and_small_requests_interleaved_leave_the_server_alive_and_quick(server):
    """4 large prompts (4, 2, 4 and 1 MB) and 12 3-token completions from 6 threads, each
    sent 50 ms after the last: every large one a 400, every small one answered, their p95
    (nearest rank) within max(SMALL_BOUND_S, 10 x alone); the server alive after, its RSS
    within 100 MB of before (0.6 GB more after one 4 MB prompt before). Under 30 s."""
    pid = server.process.pid
    bound = max(SMALL_BOUND_S, 10 * alone(server))
    before = status_kb(pid, "VmRSS")
    large = iter([MB4, "b " * 1_000_000, MB4, "c " * 500_000])
    asks = [next(large) if i % 4 == 0 else f"To be, or not to be {i}" for i in range(16)]
    start = time.monotonic()
    with ThreadPoolExecutor(6) as pool:
        futures = []
        for prompt in asks:
            futures.append(pool.submit(complete, server, prompt))
            time.sleep(0.05)
        results = [(prompt, *f.result()) for prompt, f in zip(asks, futures, strict=True)]
    took = time.monotonic() - start
    small = []
    for prompt, seconds, response in results:
        if len(prompt) > 100:
            refused_over_cap(response)
        else:
            assert response.status_code == 200, response.text
            assert response.json()["usage"]["completion_tokens"] == 3
            small.append(seconds)
    p95 = sorted(small)[math.ceil(0.95 * len(small)) - 1]
    assert p95 < bound, (p95, bound, sorted(small))
    assert took < 30, took
    assert server.process.poll() is None
    assert httpx.get(f"{server.url}/health", timeout=10).status_code == 200
    _, response = complete(server, "To be, or not to be")
    assert response.status_code == 200
    assert status_kb(pid, "VmRSS") - before < 100_000, (before, status_kb(pid, "VmRSS"))
