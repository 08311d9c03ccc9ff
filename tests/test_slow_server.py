"""`placer collect --server` against servers that misbehave (issue 27): a reply bounded as a
whole in time and in size, malformed replies refused in one line, Ctrl-C and SIGTERM stop a
collect with requests in flight at once and leave nothing behind, and the vLLM reply checked
as the vLLM file importer checks a file. Every server runs on 127.0.0.1 (tests/raw_server.py),
bounded in connections and in time."""

from __future__ import annotations

import base64
import io
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from cli_errors import assert_one_line_error
from importer_files import MOE_LAYERS, NUM_LAYERS, TOP_K, random_routing, write_config
from raw_server import drip, http_reply, once, raw_server, replying, silence, stream
from test_startup import default_sigint

from placer.checkpoint.tiny import build_tiny_model
from traces.collecting.server import ServerOptions, SGLangClient
from traces.errors import TraceError
from traces.storing.schema import ModelIdentity

REPO = Path(__file__).resolve().parent.parent
IDENTITY = ModelIdentity("0" * 64, num_layers=2, moe_layers=(0, 1), experts_per_layer=8,
                         top_k=2)


def client(url: str, timeout_s: float = 1.0) -> SGLangClient:
    return SGLangClient(url, IDENTITY, ServerOptions(timeout_s=timeout_s, retries=0,
                                                     progress=False), 0)


@pytest.mark.parametrize("part", ["status line", "body"])
def test_a_reply_that_drips_is_cut_at_its_deadline(part: str) -> None:
    """One byte every 0.1 s never trips a socket timeout of 1 s: the whole reply must."""
    reply = http_reply(b'{"output_ids": [1]}' + b" " * 200)
    answer = drip(reply, 0.1) if part == "status line" else \
        lambda conn, seen: once(reply[:-200])(conn, seen) and drip(b" " * 200, 0.1)(conn, seen)
    with raw_server(answer) as (url, seen):
        with pytest.raises(TraceError, match=r"no answer after 1 tries \(no complete reply "
                                             r"within 1 s\)"):
            client(url).generate([1, 2, 3])
    assert seen.sent < len(reply)  # the client hung up before the server was done


@pytest.mark.parametrize("how", ["Content-Length", "streamed"])
def test_a_reply_larger_than_its_routing_could_be_is_refused(how: str) -> None:
    limit = client("http://x").max_reply_bytes([1, 2, 3])
    if how == "Content-Length":
        answer = once(http_reply(b"{}", length=10**9))
        needle = f"a reply of 1000000000 bytes; the routing of this request needs at most {limit}"
    else:  # no length announced: read until it passes the limit, then hang up
        answer = stream(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n", b" " * 65536, 1024)
        needle = f"a reply of more than {limit} bytes"
    with raw_server(answer) as (url, seen):
        with pytest.raises(TraceError, match=needle):
            client(url).generate([1, 2, 3])
    assert seen.sent < 64 * 2**20


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory, prose: list[str]) -> Path:
    return build_tiny_model("qwen3_moe", tmp_path_factory.mktemp("slow") / "model",
                            texts=prose[:200])


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    path = tmp_path / "chat.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in
                            ["To be, or not to be", "Friends, Romans, countrymen"]))
    return path


def collect(cli, url: str, model: Path, corpus: Path, out: Path, *extra: object,
            engine: str = "sglang"):
    return cli("collect", "--server", url, "--engine", engine, "--model", model, "--corpus",
               corpus, "--out", out, "--no-progress", "--concurrency", 1, "--max-new-tokens", 2,
               "--request-timeout", 5, *extra, ok=False)


def test_a_garbage_status_line_is_one_line(cli, model: Path, corpus: Path, tmp_path: Path,
                                           monkeypatch) -> None:
    import traces.collecting.server

    monkeypatch.setattr(traces.collecting.server, "sleep", lambda s: None)
    with raw_server(once(b"garbage\r\nmore garbage\r\n\r\n")) as (url, seen):
        result = collect(cli, url, model, corpus, tmp_path / "o")
    assert_one_line_error(result, "no answer after 4 tries (garbage)")
    assert seen.requests == 4 and not (tmp_path / "o").exists()


def sglang_without_output(body: dict) -> dict:
    prompt = len(body["input_ids"])
    routed = np.zeros((prompt - 1, IDENTITY.num_layers, IDENTITY.top_k), np.int32) + [0, 1]
    return {"text": "", "output_ids": [], "meta_info": {
        "prompt_tokens": prompt, "completion_tokens": 0,
        "routed_experts": base64.b64encode(routed.tobytes()).decode()}}


def vllm_without_output(body: dict) -> dict:
    buffer = io.BytesIO()
    np.save(buffer, np.zeros((len(body["prompt"]) - 1, 2, 2), np.int32) + [0, 1])
    return {"choices": [{"index": 0, "text": "", "token_ids": [],
                         "routed_experts": base64.b64encode(buffer.getvalue()).decode()}]}


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_a_reply_without_a_generated_token_is_refused(cli, model: Path, corpus: Path,
                                                      tmp_path: Path, engine: str) -> None:
    make = sglang_without_output if engine == "sglang" else vllm_without_output
    with raw_server(replying(make)) as (url, _):
        result = collect(cli, url, model, corpus, tmp_path / "o", engine=engine)
    assert_one_line_error(result, "no generated token")
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("output_ids", [["5", "6"], None, [[5], [6]], [2**40, 6], [True]])
def test_output_ids_that_are_not_token_ids_are_refused(cli, model: Path, corpus: Path,
                                                       tmp_path: Path, output_ids) -> None:
    def reply(body: dict) -> dict:
        made = sglang_without_output(body)
        made["output_ids"] = output_ids
        return made

    with raw_server(replying(reply)) as (url, _):
        result = collect(cli, url, model, corpus, tmp_path / "o")
    assert_one_line_error(result, "/generate: output_ids: expected a list of token ids")
    assert not (tmp_path / "o").exists()


def test_a_vllm_npy_claiming_terabytes_is_refused(cli, model: Path, corpus: Path,
                                                  tmp_path: Path) -> None:
    """The .npy inside a vLLM reply says its own shape: np.load of a buffer allocates what
    the header claims before reading (here 10**12 rows), so the header is checked first."""
    from test_hostile_files import npy_claiming

    raw = npy_claiming(tmp_path / "r.npy", (10**12, 2, 2), "<i4").read_bytes()
    reply = {"choices": [{"index": 0, "text": "", "token_ids": [5, 6],
                          "routed_experts": base64.b64encode(raw).decode()}]}
    with raw_server(replying(lambda body: reply)) as (url, _):
        result = collect(cli, url, model, corpus, tmp_path / "o", engine="vllm")
    assert_one_line_error(result, "choices[0].routed_experts: its header claims",
                          "the file holds 64")


def test_vllm_routing_in_a_dense_layer_is_refused_by_the_server_client_and_the_importer(
        cli, model: Path, corpus: Path, tmp_path: Path) -> None:
    """One check for both (traces.importers.vllm.moe_routing): decoder layer 0 of the
    config's model is dense, and vLLM never writes a routed expert there."""
    config = write_config(tmp_path / "config")
    rng = np.random.default_rng(0)

    def routed(tokens: int) -> np.ndarray:
        out = np.zeros((tokens, NUM_LAYERS, TOP_K), np.int32)
        out[:, list(MOE_LAYERS)] = random_routing(rng, tokens)
        out[:, 0] = [3, 4]  # a routed expert in the dense layer
        return out

    def reply(body: dict) -> dict:
        buffer = io.BytesIO()
        np.save(buffer, routed(len(body["prompt"]) + 1))
        return {"choices": [{"index": 0, "text": "", "token_ids": [5, 6],
                             "routed_experts": base64.b64encode(buffer.getvalue()).decode()}]}

    with raw_server(replying(reply)) as (url, _):
        result = cli("collect", "--server", url, "--engine", "vllm", "--config", config,
                     "--tokenizer", model, "--corpus", corpus, "--out", tmp_path / "o",
                     "--no-progress", "--concurrency", 1, "--max-new-tokens", 2, ok=False)
    needle = "decoder layers [0] hold routed experts, expected none there"
    assert_one_line_error(result, needle)
    np.save(tmp_path / "req.npy", routed(6))
    assert_one_line_error(cli("traces", "import", tmp_path / "req.npy", "--format", "vllm",
                              "--config", config, "--out", tmp_path / "i", ok=False), needle)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_stops_collect_with_a_request_in_flight(model: Path, corpus: Path,
                                                         tmp_path: Path, signum: int) -> None:
    """The server never answers; the request timeout is ten minutes. The signal must end
    the collect at once (the requests in flight are closed), in one line, with nothing
    written; 60 s is only the guard against a hang."""
    out = tmp_path / "o"
    with raw_server(silence) as (url, seen):
        proc = subprocess.Popen(
            [sys.executable, "-m", "placer", "collect", "--server", url, "--engine", "sglang",
             "--model", model, "--corpus", corpus, "--out", out, "--no-progress",
             "--request-timeout", "600"],
            cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, stderr=subprocess.PIPE,
            stdout=subprocess.DEVNULL, text=True, preexec_fn=default_sigint)
        try:
            assert seen.first.wait(120), "the collect sent no request"
            proc.send_signal(signum)
            _, stderr = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    name = signal.Signals(signum).name
    assert proc.returncode == 128 + signum, (proc.returncode, stderr)
    assert stderr == f"error: interrupted by {name}; nothing partial was left behind\n"
    assert not out.exists()


def test_requests_run_in_threads_that_leave_the_signals_to_the_main_thread() -> None:
    """A signal the kernel gave to a worker blocked on a silent server would wake nothing
    (Python runs handlers in the main thread only): the workers block SIGINT and SIGTERM,
    and the main thread does not."""
    from traces.collecting import server

    class Masks:
        def generate(self, prompt: object) -> set:
            return signal.pthread_sigmask(signal.SIG_BLOCK, [])

        class connections:  # noqa: N801 - what _replies closes when it ends
            @staticmethod
            def close_all() -> None:
                pass

    (mask,) = server._replies(Masks(), iter([[1]]), concurrency=1)
    assert {signal.SIGINT, signal.SIGTERM} <= mask
    assert not {signal.SIGINT, signal.SIGTERM} & signal.pthread_sigmask(signal.SIG_BLOCK, [])
