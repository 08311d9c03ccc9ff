"""`placer collect --server`: against stub SGLang and vLLM servers the test starts on 127.0.0.1.

The stubs serve a tiny DeepSeek-V3 checkpoint (layer 0 dense, one shared expert) with
transformers through the engines' exact HTTP shapes. SGLang, read from kvcache-ai/sglang
commit 04653fa88f5ce4ea83632c4ad436343db6bc8324:
- `POST /generate` (`python/sglang/srt/entrypoints/http_server.py::generate_request`), body
  fields `input_ids`, `sampling_params.max_new_tokens`, `sampling_params.temperature`,
  `return_routed_experts`, `stream` (`srt/managers/io_struct.py::GenerateReqInput`);
- reply {"text", "output_ids", "meta_info"} (`srt/managers/tokenizer_manager.py::
  _handle_batch_output`), `meta_info.routed_experts` = base64 of the raw int32 bytes
  (`srt/managers/detokenizer_manager.py::_extract_routed_experts`) of the capturer's host
  cache at the request's first seqlen - 1 token slots, seqlen = prompt + output tokens
  (`srt/layers/moe/routed_experts_capturer.py::get_routed_experts`), shape (tokens,
  num_hidden_layers, top_k); dense layers are never written (zeros).
vLLM: `POST /v1/completions` with `prompt` (token ids), `max_tokens`, `temperature`,
`return_token_ids` (`vllm/entrypoints/openai/completion/protocol.py` at
002032ee2b18e1f7bd924ec47b62504ba3866063); reply `choices[0].token_ids` and
`choices[0].routed_experts` = base64 of a .npy of the routed experts
(`completion/serving.py` at 030ea52effcb05071543c8c42b8f0145e94cee43, `numpy2base64`; shape
(num_tokens - 1, layers, k), uint8 where ids fit, as vllm-project/router PR #184 describes it);
with `--endpoint chat`, `POST /v1/chat/completions` (vLLM 0.33.0 chat_completion/protocol.py:
`messages`, `truncate_prompt_tokens`, reply `prompt_token_ids` and the same per-choice
`routed_experts`).
Greedy decoding runs through RouterCapture; the routing placer writes must equal
`placer collect --mode generate` on the same model and prompts, token by token.
"""

from __future__ import annotations

import base64
import io
import json
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from traces.collecting.corpora import Corpus
from traces.collecting.runs import run_id_of, run_meta
from traces.collecting.server import ServerOptions
from traces.storing.schema import SEQ_ID_SHIFT, ModelIdentity

pytest_plugins = ["fixtures_models"]  # trace_models, trace_data, placer_run

MAX_NEW = 6
REQUEST_LIMIT = 60  # every stub refuses to answer more requests than this (bounded loops)


@pytest.fixture(scope="module")
def model(trace_models: dict[str, Path]) -> Path:
    """The session's tiny DeepSeek-V3: 3 layers (layer 0 dense), 8 experts, top-2, 1 shared."""
    return trace_models["deepseek_v3"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory, trace_data) -> Path:
    """Five real chat prompts."""
    path = tmp_path_factory.mktemp("corpus") / "chat.jsonl"
    path.write_text("".join(trace_data.chat.read_text().splitlines(keepends=True)[:5]))
    return path


class Generator:
    """Greedy decoding of one prompt at a time with the experts' routing captured."""

    def __init__(self, model_dir: Path) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        from traces.collecting.capture import RouterCapture

        self.torch = torch
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True,
                                                          dtype="auto").eval()
        self.capture = RouterCapture(self.model, weights=False)
        config = self.model.config
        self.num_layers, self.top_k = config.num_hidden_layers, config.num_experts_per_tok
        self.eos = [int(config.eos_token_id)]
        self.lock = threading.Lock()

    def __call__(self, prompt: list[int], max_new_tokens: int) -> tuple[list[int], np.ndarray]:
        """(output ids, routed experts [P + O - 1, num_hidden_layers, top_k] int32)."""
        torch = self.torch
        with self.lock, self.capture, torch.inference_mode():
            self.capture.take()
            ids = torch.tensor([prompt])
            out = self.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                                      max_new_tokens=max_new_tokens, do_sample=False,
                                      pad_token_id=0, eos_token_id=self.eos, top_p=None,
                                      top_k=None, temperature=None)
            calls = self.capture.take()
        output = out[0, len(prompt):].tolist()
        if self.eos[0] in output:
            output = output[:output.index(self.eos[0]) + 1]
        routed = np.concatenate([c.experts for c in calls], axis=1)  # [MoE layers, rows, k]
        fed = len(prompt) + len(output) - 1
        experts = np.zeros((fed, self.num_layers, self.top_k), dtype=np.int32)
        experts[:, list(self.capture.layers)] = routed[:, :fed].transpose(1, 0, 2)
        return output, experts


Respond = Callable[[dict], tuple[int, dict]]


def sglang_generate(generator: Generator, *, extra_layers: int = 0, id_shift: int = 0,
                    shared_columns: int = 0, extra_rows: int = 0) -> Respond:
    """SGLang's /generate reply; the keywords make it answer as another model would (or, with
    `extra_rows`, with rows for tokens that never ran)."""

    def respond(body: dict) -> tuple[int, dict]:
        assert body["return_routed_experts"] is True and body["stream"] is False
        assert body["sampling_params"]["temperature"] == 0
        prompt = body["input_ids"]
        output, experts = generator(prompt, body["sampling_params"]["max_new_tokens"])
        experts = experts + id_shift
        if extra_layers:
            experts = np.concatenate([experts, experts[:, :extra_layers]], axis=1)
        if extra_rows:
            experts = np.concatenate([experts, experts[-extra_rows:]], axis=0)
        if shared_columns:  # fused shared experts: ids after the routed ones (8, 9, ...)
            shared = 8 + np.arange(shared_columns, dtype=np.int32)
            experts = np.concatenate([experts, np.broadcast_to(
                shared, (*experts.shape[:2], shared_columns))], axis=2)
        meta = {"id": "stub", "finish_reason": {"type": "length"}, "prompt_tokens": len(prompt),
                "completion_tokens": len(output), "cached_tokens": 0,
                "routed_experts": base64.b64encode(
                    np.ascontiguousarray(experts, dtype=np.int32).tobytes()).decode()}
        return 200, {"text": "", "output_ids": output, "meta_info": meta}

    return respond


def vllm_completions(generator: Generator) -> Respond:
    """vLLM's /v1/completions reply, routed experts as a base64 .npy of uint8."""

    def respond(body: dict) -> tuple[int, dict]:
        assert body["return_token_ids"] is True and body["temperature"] == 0
        assert body["stream"] is False
        output, experts = generator(body["prompt"], body["max_tokens"])
        buffer = io.BytesIO()
        np.save(buffer, experts.astype(np.uint8))
        choice = {"index": 0, "text": "", "logprobs": None, "finish_reason": "length",
                  "stop_reason": None, "token_ids": output,
                  "routed_experts": base64.b64encode(buffer.getvalue()).decode()}
        usage = {"prompt_tokens": len(body["prompt"]), "completion_tokens": len(output)}
        return 200, {"id": "cmpl-stub", "object": "text_completion", "created": 0,
                     "model": "stub", "choices": [choice], "usage": usage}

    return respond


def vllm_chat(generator: Generator, tokenizer) -> Respond:
    """vLLM 0.33.0's /v1/chat/completions reply: the server templates the messages
    (add_generation_prompt, truncate_prompt_tokens from the right) and returns
    prompt_token_ids, choices[0].token_ids and choices[0].routed_experts (base64 .npy)."""

    def respond(body: dict) -> tuple[int, dict]:
        assert body["return_token_ids"] is True and body["temperature"] == 0
        assert body["routed_experts_prompt_start"] == 0 and body["truncation_side"] == "right"
        text = tokenizer.apply_chat_template(body["messages"], tokenize=False,
                                             add_generation_prompt=True)
        prompt = tokenizer(text, add_special_tokens=False)["input_ids"]
        prompt = prompt[:body["truncate_prompt_tokens"]]
        output, experts = generator(prompt, body["max_tokens"])
        buffer = io.BytesIO()
        np.save(buffer, experts.astype(np.uint8))
        choice = {"index": 0, "message": {"role": "assistant", "content": ""},
                  "finish_reason": "length", "token_ids": output,
                  "routed_experts": base64.b64encode(buffer.getvalue()).decode()}
        return 200, {"id": "chatcmpl-stub", "object": "chat.completion", "model": "stub",
                     "choices": [choice], "prompt_token_ids": prompt,
                     "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(output)}}

    return respond


class QuietServer(ThreadingHTTPServer):
    """A loopback server that says nothing when a client hangs up on a reply (collect closes
    the requests still in flight once it stops): its traceback would land in the output the
    tests read."""

    def handle_error(self, request: object, client_address: object) -> None:
        pass


@contextmanager
def stub_server(respond: Respond, route: str = "/generate") -> Iterator[tuple[str, list[dict]]]:
    """(URL, request bodies received) of a loopback server answering POST `route`."""
    received: list[dict] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            received.append(body)
            if self.path != route or len(received) > REQUEST_LIMIT:
                status, reply = 404, {"error": "no such route or too many requests"}
            else:
                status, reply = respond(body)
            data = json.dumps(reply).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    server = QuietServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                              daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", received
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@pytest.fixture(scope="module")
def generator(model: Path) -> Generator:
    return Generator(model)


@pytest.fixture(scope="module")
def local(model: Path, corpus: Path, tmp_path_factory: pytest.TempPathFactory,
          placer_run) -> Path:
    """`placer collect --mode generate` of the corpus, one prompt per batch (no padding)."""
    out = tmp_path_factory.mktemp("local") / "local"
    placer_run("collect", "--model", model, "--corpus", corpus, "--mode", "generate",
           "--max-new-tokens", MAX_NEW, "--max-length", 40, "--batch-size", 1,
           "--out", out, "--no-progress")
    return out


def _rows(trace_dir: Path) -> list[tuple]:
    """Every row as (sequence number, pos, phase, token, layer, experts), sorted."""
    files = sorted(trace_dir.glob("*.parquet"))
    assert len(files) == 1
    meta = json.loads(pq.read_schema(files[0]).metadata[b"placer"])
    table = pa.concat_tables([pq.read_table(f) for f in files])
    cols = {name: table.column(name).to_pylist() for name in table.column_names}
    return sorted((s - meta["seq_id_base"], p, ph, t, la, tuple(e)) for s, p, ph, t, la, e in zip(
        cols["seq_id"], cols["pos"], cols["phase"], cols["token"], cols["layer"],
        cols["experts"], strict=True))


@pytest.fixture(scope="module")
def collect_via(placer_run, model: Path, corpus: Path):
    """`collect_via(url, out, *extra, ok=True, engine="sglang")`: `placer collect --server
    url` of the corpus."""

    def run(url: str, out: Path, *extra, ok: bool = True, engine: str = "sglang"):
        return placer_run("collect", "--server", url, "--engine", engine, "--model", model,
                          "--corpus", corpus, "--max-new-tokens", MAX_NEW, "--max-length", 40,
                          "--out", out, "--no-progress", "--request-timeout", 20, *extra,
                          ok=ok)

    return run


@pytest.mark.parametrize("shared_columns", [0, 1])
def test_server_routing_equals_local_collect(generator, local, collect_via, tmp_path,
                                             shared_columns) -> None:
    with stub_server(sglang_generate(generator, shared_columns=shared_columns)) as (url, got):
        collect_via(url, tmp_path / "srv", "--concurrency", 2)
    assert len(got) == 5 and all(b["sampling_params"]["max_new_tokens"] == MAX_NEW
                                 for b in got)
    expected, actual = _rows(local), _rows(tmp_path / "srv")
    assert actual == expected and len(actual) > 2 * 5 * 10
    assert {r[4] for r in actual} == {1, 2}  # the dense layer 0 is dropped
    assert {r[2] for r in actual} == {"prefill", "decode"}
    assert_server_meta(tmp_path, local, f"{url}/generate")


def trace_meta(trace_dir: Path) -> dict:
    return json.loads(pq.read_schema(next(trace_dir.glob("*.parquet"))).metadata[b"placer"])


def assert_server_meta(tmp_path: Path, local: Path, url: str) -> None:
    """The metadata of the server trace in tmp_path/srv, key by key: the model and corpus as
    the local collect of the same corpus records them, the mode, the run id of the server's
    options and URL, no seed and no tokenizer, the server; as
    traces.collecting.runs.run_meta makes it."""
    meta, mine = trace_meta(tmp_path / "srv"), trace_meta(local)
    (tmp_path / "empty").mkdir()
    options = ServerOptions(max_new_tokens=MAX_NEW, max_length=40, concurrency=2,
                            timeout_s=20.0, progress=False)
    run_id = run_id_of(tmp_path / "empty", {
        "fingerprint": mine["fingerprint"], "corpus": mine["corpus_sha256"], "tag": mine["tag"],
        "server": url, **asdict(options)})
    written = {k: mine[k] for k in ("placer_version", "schema_version")}  # by TraceWriter
    same = ("kind", "fingerprint", "num_layers", "moe_layers", "experts_per_layer", "top_k",
            "tag", "corpus", "corpus_sha256", *written)
    assert meta == {**{k: mine[k] for k in same}, "mode": "server-sglang", "run_id": run_id,
                    "seq_id_base": run_id << SEQ_ID_SHIFT, "weights": False, "max_length": 40,
                    "max_new_tokens": MAX_NEW, "seed": None, "server": url, "estimated": False}
    identity = ModelIdentity(mine["fingerprint"], mine["num_layers"], tuple(mine["moe_layers"]),
                             mine["experts_per_layer"], mine["top_k"])
    corpus = Corpus(mine["tag"], "chat", mine["corpus_sha256"], 5, Path(mine["corpus"]))
    made = run_meta(tmp_path / "empty", corpus, identity, {"server": url, **asdict(options)},
                    mode="server-sglang", weights=False, max_length=40, max_new_tokens=MAX_NEW,
                    seed=None, server=url, estimated=False)
    assert meta == {**json.loads(json.dumps(made)), **written}


def test_vllm_server_routing_equals_local_collect(generator, local, collect_via,
                                                  tmp_path) -> None:
    with stub_server(vllm_completions(generator), "/v1/completions") as (url, got):
        collect_via(url, tmp_path / "srv", "--concurrency", 2, engine="vllm")
    assert len(got) == 5 and all(b["max_tokens"] == MAX_NEW for b in got)
    assert _rows(tmp_path / "srv") == _rows(local)


def test_vllm_chat_endpoint_equals_local_collect(generator, local, model, collect_via,
                                                tmp_path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model, local_files_only=True)
    with stub_server(vllm_chat(generator, tokenizer), "/v1/chat/completions") as (url, got):
        collect_via(url, tmp_path / "srv", "--endpoint", "chat", engine="vllm")
    assert len(got) == 5 and all(isinstance(b["messages"], list) for b in got)
    assert _rows(tmp_path / "srv") == _rows(local)
    wrong = collect_via(url, tmp_path / "x", "--endpoint", "chat", ok=False)
    assert wrong.exit_code == 1 and "--endpoint chat is for --engine vllm" in wrong.output


def test_collecting_the_same_corpus_twice_into_one_dir_is_refused(generator, collect_via,
                                                                  tmp_path) -> None:
    with stub_server(sglang_generate(generator)) as (url, _):
        collect_via(url, tmp_path / "srv")
        result = collect_via(url, tmp_path / "srv", ok=False)
    assert result.exit_code == 1 and "count it twice" in result.stderr
    assert len(list((tmp_path / "srv").glob("*.parquet"))) == 1


def test_max_tokens_cuts_the_reply_that_reaches_it_to_the_budget(generator, local, collect_via,
                                                                 tmp_path) -> None:
    expected = _rows(local)
    per_seq = np.bincount([r[0] for r in expected if r[4] == 1])  # tokens of each sequence
    budget = int(per_seq[0] + per_seq[1] // 2)  # reached inside the second sequence
    with stub_server(sglang_generate(generator)) as (url, _):
        collect_via(url, tmp_path / "srv", "--max-tokens", budget, "--concurrency", 3)
    kept = {(r[0], r[1]) for r in expected if r[0] == 0 or (r[0] == 1 and r[1] < per_seq[1] // 2)}
    assert _rows(tmp_path / "srv") == [r for r in expected if (r[0], r[1]) in kept]


@pytest.mark.parametrize(("kwargs", "words"), [
    ({"extra_layers": 1}, "3 layers, top-k 2]"), ({"id_shift": 8}, "expert ids in [8,")])
def test_a_server_running_another_model_is_refused(generator, collect_via, tmp_path, kwargs,
                                                   words) -> None:
    out = tmp_path / "srv"
    with stub_server(sglang_generate(generator, **kwargs)) as (url, _):
        result = collect_via(url, out, ok=False)
    assert result.exit_code == 1
    assert result.output.count("\n") == 1 and "another model" in result.output, result.output
    assert words in result.output
    assert not list(out.rglob("*.parquet*"))


def test_an_sglang_reply_with_rows_past_the_stop_keeps_the_returned_tokens(
        generator, local, collect_via, tmp_path) -> None:
    """sglang-kt 0.7.2 (schedule_batch.py: Req.seqlen = prompt + len(output_ids)) returns rows
    for tokens its speculative decoding accepted past the stop; the reply's own tokens'
    rows (traces.importers.sglang_http.decode_routed_experts) are exactly the local ones."""
    with stub_server(sglang_generate(generator, extra_rows=2)) as (url, _):
        collect_via(url, tmp_path / "srv")
    assert _rows(tmp_path / "srv") == _rows(local)


def test_a_failing_server_is_retried_then_refused_in_one_line(collect_via, tmp_path,
                                                              monkeypatch) -> None:
    import traces.collecting.server

    sleeps: list[float] = []
    monkeypatch.setattr(traces.collecting.server, "sleep", sleeps.append)
    out = tmp_path / "srv"
    with stub_server(lambda body: (503, {"error": "overloaded"})) as (url, got):
        result = collect_via(url, out, "--concurrency", 1, ok=False)
    assert result.exit_code == 1 and result.output.count("\n") == 1
    assert "no answer after 4 tries (HTTP 503" in result.output
    assert sleeps == [0.5, 1.0, 2.0] and len(got) == 4  # the first request and 3 retries
    assert not list(out.rglob("*.parquet*"))

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    sleeps.clear()
    refused = collect_via(f"http://127.0.0.1:{port}", out, "--concurrency", 1, ok=False)
    assert refused.exit_code == 1 and "no answer after 4 tries" in refused.output
    assert sleeps == [0.5, 1.0, 2.0]
    assert not list(out.rglob("*.parquet*"))


@pytest.mark.parametrize(("engine", "route", "reply"), [
    ("sglang", "/generate", {"text": "", "output_ids": [5], "meta_info": {"prompt_tokens": 3}}),
    ("vllm", "/v1/completions", {"choices": [{"index": 0, "text": "", "token_ids": [5]}]})])
def test_a_server_without_routed_experts_is_refused(collect_via, tmp_path, engine, route,
                                                    reply) -> None:
    with stub_server(lambda body: (200, reply), route) as (url, _):
        result = collect_via(url, tmp_path / "a", engine=engine, ok=False)
    assert result.exit_code == 1 and result.output.count("\n") == 1
    assert "no routed_experts; start the server with --enable-return-routed-experts" in \
        result.output


def test_a_config_alone_describes_the_served_model(generator, local, model, corpus, placer_run,
                                                   tmp_path) -> None:
    """A model too big for this box: its config.json and tokenizer are enough."""
    with stub_server(sglang_generate(generator)) as (url, _):
        placer_run("collect", "--server", url, "--engine", "sglang", "--config",
                   model / "config.json", "--tokenizer", model, "--corpus", corpus,
                   "--max-new-tokens", MAX_NEW, "--max-length", 40, "--out", tmp_path / "srv",
                   "--no-progress", "--request-timeout", 20)
    assert _rows(tmp_path / "srv") == _rows(local)
    meta = json.loads(pq.read_schema(next((tmp_path / "srv").glob("*.parquet")))
                      .metadata[b"placer"])
    assert meta["estimated"] is True and meta["moe_layers"] == [1, 2]
