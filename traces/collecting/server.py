'''Collecting routing through a running inference server (`placer collect --server URL`).

Every document of a corpus is sent, as prompt token ids, to a server started with routed
expert return enabled; greedy decoding; the routing it returns becomes trace rows
(`traces.storing.schema`): prompt tokens `prefill`, generated tokens fed back `decode`, one sequence
per request, in corpus order (sequence n = document n), exactly as `placer collect --mode
generate` numbers and tags them (and tokenizes them: `traces.collecting.collect._encode`,
chat template with the generation prompt). The rows come from the engine that will serve, for
a model of any size; they carry no gate weights.

SGLang (read from kvcache-ai/sglang commit 04653fa88f5ce4ea83632c4ad436343db6bc8324, an
SGLang fork that keeps upstream's routed-experts code; upstream sgl-project/sglang
`python/sglang/srt/layers/moe/routed_experts_capturer.py` at
d4d0fc58371761f9f0da007a4ef4f0ad2bd19658 has the same buffers):
- server flag `--enable-return-routed-experts` (`srt/server_args.py`); request
  `POST /generate` (`srt/entrypoints/http_server.py::generate_request`) with a
  `GenerateReqInput` body (`srt/managers/io_struct.py`): `input_ids` (list of token ids),
  `sampling_params` {"max_new_tokens", "temperature": 0 = greedy}, `return_routed_experts`:
  true, `stream`: false.
- response (`srt/managers/tokenizer_manager.py::_handle_batch_output`): {"text",
  "output_ids", "meta_info": {"prompt_tokens", "completion_tokens", "finish_reason", ...,
  "routed_experts"}}; `routed_experts` is the base64 text of the raw bytes of an int32
  tensor (`srt/managers/detokenizer_manager.py::_extract_routed_experts`,
  `pybase64.b64encode(t.numpy().tobytes())`; the capturer's own
  `extract_routed_experts_from_meta_info` decodes it with np.frombuffer(dtype=int32)).
- which tokens: `scheduler_output_processor_mixin.py::maybe_collect_routed_experts` calls
  `get_routed_experts(req_pool_idx, seqlen=len(origin_input_ids) + len(output_ids))`, which
  returns the host cache at `req_to_token[:seqlen - 1]`: every prompt token and every output
  token but the last (never fed back), in position order. Shape (seqlen - 1,
  num_hidden_layers, width): the host cache keeps `num_experts_per_tok` columns (the device
  buffer's extra `num_fused_shared_experts` columns are cut in `_sync_fwd_experts_buffer_DtoH`;
  a reply with top_k + shared columns, should a version keep them, is accepted and cut to the
  first top_k, the routed ones). Layers without routed experts are never written (zeros)
  and are dropped here: rows keep the model's MoE layers only. placer sends no
  `routed_experts_start_len` (0: from the first prompt token). A reply with fewer rows is
  refused; one with more (sglang-kt 0.7.2's speculative decoding past the stop) keeps the
  rows of the returned tokens; `traces.importers.sglang_http.decode_routed_experts` decodes
  it, as it does the saved replies of `placer traces import --format sglang-http`.
The ids are what the router selected (logical ids) when the server runs without expert
parallel redundancy (`--ep-num-redundant-experts` 0).

vLLM (server flag `--enable-return-routed-experts`): `POST /v1/completions` with a
`CompletionRequest` body (`vllm/entrypoints/openai/completion/protocol.py` at
002032ee2b18e1f7bd924ec47b62504ba3866063): `prompt` as a list of token ids, `max_tokens`,
`temperature` 0 (greedy), `return_token_ids` true (the reply's `choices[0].token_ids` are the
output ids), `stream` false, `routed_experts_prompt_start` 0 (no prompt row skipped).
With `--endpoint chat`, `POST /v1/chat/completions` instead (vLLM 0.33.0
`entrypoints/openai/chat_completion/protocol.py`: the same `routed_experts` per choice): the
document goes as `messages` (a text document as one user message), the server applies its
chat template, `truncate_prompt_tokens` = --max-length with `truncation_side` "right" keeps
the first tokens as placer's own encoding does, and the prompt ids come back as the reply's
`prompt_token_ids`.
The reply (`vllm/entrypoints/openai/completion/serving.py` at
030ea52effcb05071543c8c42b8f0145e94cee43, `request_output_to_completion_response`) has
`choices[i].routed_experts = numpy2base64(output.routed_experts)`: base64 of a NumPy `.npy`
file, so its header carries the shape and dtype (vllm-project/router PR #184 describes it as
(num_tokens - 1, num_hidden_layers, num_experts_per_tok), uint8/uint16; the capturer,
`vllm/model_executor/layers/fused_moe/routed_experts_capturer.py`, keeps
[tokens, num_hidden_layers, num_experts_per_tok] int32 logical ids). placer reads the header
and checks the shape against the model; rows past prompt + output - 1 (a row for the last
output token, which is never fed back) are dropped.
'''

from __future__ import annotations

import base64
import binascii
import http.client
import signal
import urllib.parse
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from dataclasses import asdict, dataclass
from pathlib import Path
from time import perf_counter, sleep

import numpy as np

from traces.choices import ENDPOINTS, ENGINES
from traces.collecting.collect import (
    DECODE,
    PREFILL,
    CollectOptions,
    CollectResult,
    _encode,
    keep_rows,
    load_tokenizer,
)
from traces.collecting.corpora import Corpus
from traces.collecting.http import Connections, HTTPStatus
from traces.collecting.runs import check_out_dir, run_meta
from traces.errors import TraceError, bar_stream
from traces.importers.common import token_ids
from traces.importers.npfiles import npy_from_bytes
from traces.importers.sglang_http import decode_routed_experts
from traces.importers.vllm import moe_routing
from traces.storing.schema import ModelIdentity
from traces.storing.writer import TraceWriter

RETRY_STATUS = frozenset({500, 502, 503, 504})
MAX_TIMEOUT_S = 86400.0    # a reply a day late is no reply
REPLY_SLACK = 1 << 20      # bytes a reply may hold besides its routing (text, ids, metadata)


@dataclass(frozen=True)
class ServerOptions:
    """How to talk to the server; see `placer collect --help`."""

    max_new_tokens: int = 32
    max_length: int = 512
    max_tokens: int | None = None  # a corpus's rows, the reply that reaches it cut to it
    concurrency: int = 4
    retries: int = 3           # further tries of a request after a connection error or 5xx
    backoff_s: float = 0.5     # wait before retry i: backoff_s * 2**i
    timeout_s: float = 600.0   # per request
    progress: bool = True
    tokenizer: Path | None = None
    endpoint: str = "completions"  # vllm only: ENDPOINTS


Prompt = list[int] | list[dict]  # token ids, or chat messages (vLLM's chat endpoint)


@dataclass(frozen=True)
class Reply:
    """One request's routing: P prompt tokens, O output tokens; `experts` [P + O - 1,
    MoE layers, k] int16 for the prompt and every output token but the last."""

    prompt: list[int]
    output: list[int]
    experts: np.ndarray


def check_server_options(url: str, engine: str, options: ServerOptions) -> str:
    """The base URL without a trailing slash; a TraceError for an option out of range."""
    if engine not in ENGINES:
        raise TraceError(f"--engine must be one of {', '.join(ENGINES)}, got {engine!r}")
    if options.endpoint not in ENDPOINTS:
        raise TraceError(f"--endpoint must be one of {', '.join(ENDPOINTS)}, got "
                         f"{options.endpoint!r}")
    if options.endpoint != "completions" and engine != "vllm":
        raise TraceError(f"--endpoint {options.endpoint} is for --engine vllm (SGLang's "
                         "routed experts come through /generate)")
    check_url(url)
    if not 0 < options.timeout_s < MAX_TIMEOUT_S:  # NaN fails both
        raise TraceError(f"--request-timeout must be > 0 and < {MAX_TIMEOUT_S:g} seconds, got "
                         f"{options.timeout_s}")
    for name in ("max_new_tokens", "max_length", "concurrency", "max_tokens"):
        value = getattr(options, name)
        if value is not None and value < 1:
            raise TraceError(f"--{name.replace('_', '-')} must be >= 1")
    return url.rstrip("/")


def check_url(url: str) -> None:
    """A TraceError unless `url` is http(s)://HOST[:PORT][/...] with a host name DNS can
    carry (labels of 1..63 characters, 253 in all) or an IP literal."""
    expected = f"--server {url[:80]!r}: expected http://HOST:PORT"
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018 (parsing the port is the check)
    except ValueError as exc:
        raise TraceError(f"{expected} ({exc})") from None
    host = parts.hostname
    if parts.scheme not in ("http", "https") or not host:
        raise TraceError(expected)
    if ":" in host:  # an IPv6 literal, checked by urlsplit
        return
    try:
        ascii_host = host.encode("idna")
    except UnicodeError:
        ascii_host = b""
    if not 0 < len(ascii_host) <= 253 or not all(0 < len(label) <= 63 for label in
                                                ascii_host.rstrip(b".").split(b".")):
        raise TraceError(f"{expected} (the host name {host[:40]!r}... is not one DNS can "
                         "carry: labels of 1..63 characters, 253 in all)")


def collect_from_server(url: str, engine: str, tokenizer_dir: Path, corpora: list[Corpus],
                        out_dir: Path, identity: ModelIdentity,
                        options: ServerOptions = ServerOptions(), *,
                        shared_experts: int = 0, estimated: bool = False
                        ) -> list[CollectResult]:
    """Send every corpus to the server and write one trace file per corpus into `out_dir`.
    `shared_experts`: the model's shared experts (a server may return their columns too)."""
    base_url = check_server_options(url, engine, options)
    out_dir = Path(out_dir)
    check_out_dir(out_dir, identity.fingerprint)
    if not corpora:
        raise TraceError("nothing to collect: give --corpus PATH")
    tags = [c.tag for c in corpora]
    if len(set(tags)) != len(tags):
        raise TraceError(f"corpus tags must be distinct, got {tags}; set them with --tag")
    tokenizer = load_tokenizer(tokenizer_dir, options.tokenizer)
    kind = (SGLangClient if engine == "sglang" else
            VLLMChatClient if options.endpoint == "chat" else VLLMClient)
    client = kind(base_url, identity, options, shared_experts)
    out_dir.mkdir(parents=True, exist_ok=True)
    return [_collect_corpus(client, tokenizer, corpus, out_dir, identity, options, engine,
                            estimated) for corpus in corpora]


class Client:
    """One request per prompt, retried on connection errors, timeouts and 5xx; each reply
    bounded in time (`timeout_s` for the whole of it) and size (max_reply_bytes); `route`
    and `parse` are the engine's. `connections.close_all()` stops every request in flight."""

    route = ""

    def __init__(self, base_url: str, identity: ModelIdentity, options: ServerOptions,
                 shared_experts: int) -> None:
        self.url = f"{base_url}{self.route}"
        self.identity, self.options, self.shared_experts = identity, options, shared_experts
        self.connections = Connections()

    def generate(self, prompt: Prompt) -> Reply:
        return self.parse(prompt, self.post_json(self.body(prompt),
                                                 self.max_reply_bytes(prompt)))

    def max_reply_bytes(self, prompt: Prompt) -> int:
        """The most bytes a reply to `prompt` may hold: twice the base64 of int32 routing for
        its tokens (chat messages: max_length, where the server cuts them) + max_new_tokens,
        every decoder layer, top-k and shared columns, and 24 bytes of ids per token, plus
        REPLY_SLACK."""
        chat = bool(prompt) and isinstance(prompt[0], dict)
        ident = self.identity
        rows = (self.options.max_length if chat else len(prompt)) + self.options.max_new_tokens
        routing = rows * ident.num_layers * (ident.top_k + self.shared_experts) * 4
        return REPLY_SLACK + 2 * (routing * 4 // 3 + 24 * rows)

    def post_json(self, body: dict, max_bytes: int) -> object:
        """POST `body` and decode the JSON reply, retrying `options.retries` times on a
        connection error, a timeout or a 5xx status with exponential backoff."""
        options, last = self.options, ""
        for attempt in range(options.retries + 1):
            if attempt:
                sleep(options.backoff_s * 2 ** (attempt - 1))
            try:  # Connections.post_json refuses to start once stopped
                return self.connections.post_json(self.url, body, options.timeout_s, max_bytes)
            except HTTPStatus as exc:
                last = str(exc)
                if exc.code not in RETRY_STATUS:
                    raise TraceError(f"{self.url}: {last}") from None
            except (OSError, http.client.HTTPException) as exc:
                last = " ".join(str(exc).split()) or type(exc).__name__
        raise TraceError(f"{self.url}: no answer after {options.retries + 1} tries ({last})")

    def prompts(self, corpus: Corpus, tokenizer) -> Iterator[Prompt]:
        """What is sent for each document: its token ids, as `placer collect --mode generate`
        encodes them."""
        return _encode(corpus, tokenizer, CollectOptions(mode="generate",
                                                         max_length=self.options.max_length))

    def body(self, prompt: Prompt) -> dict:
        raise NotImplementedError

    def parse(self, prompt: Prompt, response: object) -> Reply:
        raise NotImplementedError

class SGLangClient(Client):
    """SGLang's `POST /generate` (module docstring)."""

    route = "/generate"

    def body(self, prompt: list[int]) -> dict:
        return {"input_ids": prompt, "return_routed_experts": True, "stream": False,
                "sampling_params": {"max_new_tokens": self.options.max_new_tokens,
                                    "temperature": 0.0}}

    def parse(self, prompt: list[int], response: object) -> Reply:
        if not isinstance(response, dict) or not {"output_ids", "meta_info"} <= response.keys():
            raise TraceError(f"{self.url}: the response has no output_ids and meta_info "
                             "(is this an SGLang server?)")
        output = generated_ids(response["output_ids"], f"{self.url}: output_ids")
        meta = response["meta_info"]
        encoded = meta.get("routed_experts") if isinstance(meta, dict) else None
        if not isinstance(encoded, str):
            raise TraceError(f"{self.url}: meta_info has no routed_experts; start the server "
                             "with --enable-return-routed-experts")
        try:
            routed = decode_routed_experts(encoded, len(prompt), len(output), self.identity,
                                           self.shared_experts, start=0)
        except TraceError as exc:
            raise TraceError(f"{self.url}: {exc}") from None
        return Reply(prompt, output, routed.experts.astype(np.int16))


class VLLMClient(Client):
    """vLLM's OpenAI-compatible `POST /v1/completions` (module docstring)."""

    route = "/v1/completions"

    def body(self, prompt: list[int]) -> dict:
        return {"prompt": prompt, "max_tokens": self.options.max_new_tokens,
                "temperature": 0.0, "return_token_ids": True, "stream": False,
                "routed_experts_prompt_start": 0}

    def parse(self, prompt: list[int], response: object) -> Reply:
        return self.routed(prompt, *self.choice(response))

    def choice(self, response: object) -> tuple[dict, list[int]]:
        """(choices[0], its output token ids) of a reply."""
        try:
            choice = response["choices"][0]
            output = choice["token_ids"]
        except (TypeError, KeyError, IndexError):
            raise TraceError(f"{self.url}: the response has no choices[0].token_ids (is this "
                             "a vLLM server?)") from None
        return choice, generated_ids(output, f"{self.url}: choices[0].token_ids")

    def routed(self, prompt: list[int], choice: dict, output: list[int]) -> Reply:
        """The reply of `prompt` from choices[0]'s routed experts."""
        encoded = choice.get("routed_experts")
        if not isinstance(encoded, str):
            raise TraceError(f"{self.url}: choices[0] has no routed_experts; start the server "
                             "with --enable-return-routed-experts")
        try:
            raw = base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError):
            raise TraceError(f"{self.url}: choices[0].routed_experts is not base64 of a .npy "
                             "array") from None
        routed = npy_from_bytes(raw, f"{self.url}: choices[0].routed_experts")
        if not np.issubdtype(routed.dtype, np.integer):
            raise TraceError(f"{self.url}: routed experts of dtype {routed.dtype}, expected "
                             "integers")
        return self.fit(routed, prompt, output)

    def fit(self, routed: np.ndarray, prompt: list[int], output: list[int]) -> Reply:
        """The reply from `routed` [tokens, num_hidden_layers, width]: the first P + O - 1
        tokens, the model's MoE layers, the first top_k columns; a TraceError if the shape
        or the ids do not fit the model, checked as the vLLM file importer checks a file
        (traces.importers.vllm.moe_routing: no routed expert in a dense layer)."""
        ident, tokens = self.identity, len(prompt) + len(output) - 1
        widths = (ident.top_k, ident.top_k + self.shared_experts)
        if (routed.ndim != 3 or routed.shape[0] not in (tokens, tokens + 1)
                or routed.shape[1] != ident.num_layers or routed.shape[2] not in widths):
            raise TraceError(
                f"{self.url}: routed experts of shape {list(routed.shape)} for {tokens} routed "
                f"tokens; this model needs [{tokens}, {ident.num_layers} layers, top-k "
                f"{ident.top_k}]: the server runs another model")
        try:
            experts = moe_routing(routed[:tokens], ident, "choices[0].routed_experts", widths)
        except TraceError as exc:
            raise TraceError(f"{self.url}: {exc}: the server runs another model") from None
        return Reply(prompt, output, experts.astype(np.int16))


class VLLMChatClient(VLLMClient):
    """vLLM's `POST /v1/chat/completions` (module docstring): messages in, the server's own
    prompt token ids back."""

    route = "/v1/chat/completions"

    def prompts(self, corpus: Corpus, tokenizer) -> Iterator[Prompt]:
        for doc in corpus.documents():
            if doc.messages is not None:
                yield list(doc.messages)
            elif doc.text is not None and doc.text.strip():
                yield [{"role": "user", "content": doc.text}]
            elif doc.token_ids is not None:
                raise TraceError(f"corpus {corpus.source} holds token ids, not text: send it "
                                 "through --endpoint completions")

    def body(self, prompt: Prompt) -> dict:
        return {"messages": prompt, "max_tokens": self.options.max_new_tokens,
                "temperature": 0.0, "return_token_ids": True, "stream": False,
                "routed_experts_prompt_start": 0,
                "truncate_prompt_tokens": self.options.max_length, "truncation_side": "right"}

    def parse(self, prompt: Prompt, response: object) -> Reply:
        choice, output = self.choice(response)
        try:
            ids = response["prompt_token_ids"]
        except (TypeError, KeyError):
            raise TraceError(f"{self.url}: the response has no prompt_token_ids (send "
                             "return_token_ids to vLLM >= 0.33)") from None
        return self.routed(token_ids(ids, f"{self.url}: prompt_token_ids"), choice, output)


def _collect_corpus(client: Client, tokenizer, corpus: Corpus, out_dir: Path,
                    identity: ModelIdentity, options: ServerOptions, engine: str,
                    estimated: bool) -> CollectResult:
    meta = run_meta(out_dir, corpus, identity, {"server": client.url, **asdict(options)},
                    mode=f"server-{engine}", weights=False, max_length=options.max_length,
                    max_new_tokens=options.max_new_tokens, seed=None, server=client.url,
                    estimated=estimated)
    run_id, base = meta["run_id"], meta["seq_id_base"]
    layers = np.asarray(identity.moe_layers, dtype=np.int16)
    path = out_dir / f"{corpus.tag}-{run_id:08x}.parquet"
    prompts = client.prompts(corpus, tokenizer)
    tokens = sequences = 0
    with TraceWriter(path, tag=corpus.tag, top_k=identity.top_k, meta=meta) as writer, \
            _Progress(corpus, options) as advance, \
            closing(_replies(client, prompts, options.concurrency)) as replies:
        for reply in replies:
            pos, token, phase = _rows(reply)
            n, num_layers = keep_rows(tokens, len(pos), options.max_tokens), len(layers)
            writer.write(np.full(n * num_layers, base + sequences, dtype=np.int64),
                         np.repeat(pos[:n], num_layers), np.repeat(token[:n], num_layers),
                         np.repeat(phase[:n], num_layers), np.tile(layers, n),
                         reply.experts[:n].reshape(n * num_layers, -1), None)
            tokens += n
            sequences += 1
            advance(n)
            if options.max_tokens is not None and tokens >= options.max_tokens:
                break
        if tokens == 0:
            raise TraceError(f"corpus {corpus.source} produced no tokens")
        writer.close()
    return CollectResult(corpus.tag, path, tokens, sequences, writer.rows)


def _replies(client: Client, prompts: Iterator[Prompt],
             concurrency: int) -> Iterator[Reply]:
    """The replies in prompt order, at most `concurrency` requests in flight (each in a
    worker that leaves SIGINT and SIGTERM to the main thread: `main_thread_signals`)."""
    pool = ThreadPoolExecutor(max_workers=concurrency, initializer=main_thread_signals)
    pending = []
    try:
        for prompt in prompts:
            pending.append(pool.submit(client.generate, prompt))
            if len(pending) >= concurrency:
                yield pending.pop(0).result()
        while pending:
            yield pending.pop(0).result()
    finally:  # on an error or an interrupt, stop the requests still in flight
        client.connections.close_all()
        pool.shutdown(wait=False, cancel_futures=True)


def main_thread_signals() -> None:
    """Block SIGINT and SIGTERM in this (worker) thread. The kernel hands a signal sent to
    the process to any thread that does not block it, and Python runs its handler only in
    the main thread, which a signal taken by a worker does not wake from a blocking wait:
    `collect --server` then waited on a silent server for the whole request timeout (about
    1 SIGINT in 30 under load). Blocked here, the signal goes to the main thread."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})


def generated_ids(value: object, where: str) -> list[int]:
    """The output token ids of a reply: token ids (traces.importers.common.token_ids), at
    least one (a request asks for max_new_tokens >= 1, and a reply without a generated
    token ran nothing the rows could be fed back from)."""
    ids = token_ids(value, where)
    if not ids:
        raise TraceError(f"{where}: no generated token (the request asked for at least one)")
    return ids


def _rows(reply: Reply) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(pos, token, phase) of the reply's P + O - 1 routed tokens, each [P + O - 1]."""
    fed = reply.prompt + reply.output[:-1]
    phase = np.full(len(fed), DECODE, dtype=np.int32)
    phase[:len(reply.prompt)] = PREFILL
    return np.arange(len(fed), dtype=np.int32), np.asarray(fed, dtype=np.int32), phase


class _Progress:
    """A rich progress bar on stderr over the corpus's documents; yields `advance(tokens)`."""

    def __init__(self, corpus: Corpus, options: ServerOptions) -> None:
        self.corpus, self.options = corpus, options

    def __enter__(self):
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

        self.start, self.tokens = perf_counter(), 0
        self.bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                            TextColumn("{task.fields[rate]}"), console=Console(file=bar_stream()),
                            disable=not self.options.progress)
        self.bar.start()
        self.task = self.bar.add_task(f"{self.corpus.tag} (requests)", rate="",
                                      total=self.corpus.num_documents)
        return self.advance

    def advance(self, tokens: int) -> None:
        self.tokens += tokens
        rate = self.tokens / max(perf_counter() - self.start, 1e-9)
        self.bar.update(self.task, advance=1, rate=f"{self.tokens} tok, {rate:,.0f} tok/s")

    def __exit__(self, *exc: object) -> None:
        self.bar.stop()
