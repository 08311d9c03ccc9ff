"""Running a real Hugging Face MoE model over corpora and writing its routing as traces.

`collect()` loads the checkpoint with transformers (local files only), hooks its experts
modules (`traces.collecting.capture`), and for each corpus writes one trace file
`<out>/<tag>-<run_id>.parquet` (format: `traces.storing.schema`).

Modes:
- `score`: documents are right-padded into batches and run through one forward pass; every
  real token's routing is recorded with phase `decode`.
- `generate`: documents are prompts, left-padded; `model.generate` decodes greedily up to
  `max_new_tokens`. Prompt tokens are `prefill` rows; every generated token fed back through
  the model is a `decode` row, until the sequence's end-of-sequence token.

Padding tokens (attention mask 0) are never recorded. `max_tokens` bounds the recorded
tokens of each corpus exactly: the last batch's documents are trimmed to it, and its rows
(sorted by sequence and position; in generate mode prompt then generated tokens) are cut
to it, so the last sequence recorded may end early, as a prefix of itself (`keep_rows`).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from traces.choices import DTYPES, MODES
from traces.collecting.corpora import Corpus, Document, random_corpus
from traces.collecting.runs import (
    CollectOptions,
    CollectResult,
    check_request,
    collect_meta,
    refuse_duplicates,
)
from traces.errors import TraceError, bar_stream, first_line
from traces.options import available_memory, check_rules, kv_bytes_per_token
from traces.storing.schema import PHASES, ModelIdentity
from traces.storing.writer import TraceWriter

if TYPE_CHECKING:  # torch loads in seconds: only a run that collects imports it
    from traces.collecting.capture import RouterCapture, Routing

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
PREFILL, DECODE = PHASES.index("prefill"), PHASES.index("decode")
# Where the speculative routing is taken (traces.collecting.capture): the input of the
# previous MoE layer's block, one MoE layer ahead.
SPECULATIVE_POINT = {"point": "moe_input", "depth": 1}


@dataclass(frozen=True)
class _Tokens:
    """The recorded tokens of one batch, sorted by (seq_id, pos): 1-D arrays of length N,
    `experts` [N, L, k] int16, `weights` [N, L, k] float32 or None and `speculative`
    [N, L, k] int16 (capture.Routing.speculative, per token)."""

    seq_id: np.ndarray
    pos: np.ndarray
    token: np.ndarray
    phase: np.ndarray
    experts: np.ndarray
    weights: np.ndarray | None
    speculative: np.ndarray

    def head(self, n: int) -> _Tokens:
        """The first `n` tokens (every column cut alike): whole sequences, then a prefix of
        the one the cut falls in."""
        return _Tokens(self.seq_id[:n], self.pos[:n], self.token[:n], self.phase[:n],
                       self.experts[:n], None if self.weights is None else self.weights[:n],
                       self.speculative[:n])


def keep_rows(recorded: int, n: int, max_tokens: int | None) -> int:
    """How many of `n` new tokens, in (sequence, position) order, to record after `recorded`
    so that a corpus holds at most `max_tokens` (--max-tokens) of them."""
    return n if max_tokens is None else max(0, min(n, max_tokens - recorded))


def check_options(options: CollectOptions) -> None:
    """TraceError for an option out of range."""
    if options.mode not in MODES:
        raise TraceError(f"--mode must be one of {', '.join(MODES)}, got {options.mode!r}")
    if options.dtype not in DTYPES:
        raise TraceError(f"--dtype must be one of {', '.join(DTYPES)}, got {options.dtype!r}")
    check_rules({name: getattr(options, name) for name in
                 ("batch_size", "max_length", "max_new_tokens", "max_tokens")}, "collect")


def load_tokenizer(model_dir: Path, tokenizer: Path | None):
    """The checkpoint's tokenizer (or the one at `tokenizer`), or a TraceError if none."""
    from transformers import AutoTokenizer

    path = Path(tokenizer) if tokenizer is not None else Path(model_dir)
    if not path.is_dir() or not any((path / f).is_file() for f in TOKENIZER_FILES):
        hint = "" if tokenizer is not None else "; pass --tokenizer PATH"
        raise TraceError(f"no tokenizer in {path} (none of {', '.join(TOKENIZER_FILES)}){hint}")
    try:
        tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError, TypeError, KeyError) as exc:
        raise TraceError(f"cannot load the tokenizer in {path}: {first_line(exc, 200)}"
                         ) from None
    return tok


def load_model(model_dir: Path, device: str, dtype: str):
    """The checkpoint as a transformers causal LM in eval mode on `device`."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        model = AutoModelForCausalLM.from_pretrained(
            model_dir, local_files_only=True,
            dtype="auto" if dtype == "auto" else getattr(torch, dtype))
    except (OSError, ValueError, KeyError) as exc:
        raise TraceError(f"transformers cannot load {model_dir}: {first_line(exc, 200)}"
                         ) from None
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    return model.to(device).eval()


def check_generation_memory(model, options: CollectOptions, device: str) -> None:
    """TraceError, before anything is run, where generate mode's --max-new-tokens take more
    key/value cache for one sequence (traces.options.kv_bytes_per_token, a floor) than
    `device` has available: a count bounded by what it allocates, not a generation that runs
    until memory is gone."""
    if options.mode != "generate":
        return
    config = model.config.to_dict()
    config.update(getattr(model.config, "get_text_config", lambda: model.config)().to_dict())
    per_token = kv_bytes_per_token(config, model.dtype.itemsize)
    free = available_memory(device)
    if per_token * options.max_new_tokens > free:
        raise TraceError(f"--max-new-tokens {options.max_new_tokens}: their key/value cache "
                         f"alone takes {per_token} bytes a token, "
                         f"{per_token * options.max_new_tokens / 2**30:.3g} GiB for one "
                         f"sequence, more than the {free / 2**30:.3g} GiB available on {device}")


def resolve_device(device: str) -> str:
    """`auto` -> cuda when present, else cpu."""
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def collect(model_dir: Path, corpora: list[Corpus], out_dir: Path, identity: ModelIdentity,
            options: CollectOptions = CollectOptions(), *,
            random_tokens: int | None = None) -> list[CollectResult]:
    """Run the model over every corpus (plus `random_tokens` uniform random token ids, tag
    `random`, in documents of `max_length`) and write one trace file per corpus."""
    import torch

    check_options(options)
    out_dir = check_request(corpora, out_dir, identity, random_tokens)
    tokenizer = load_tokenizer(model_dir, options.tokenizer)
    if random_tokens:
        special = set(tokenizer.all_special_ids)
        vocab = [i for i in range(len(tokenizer)) if i not in special]
        corpora = [*corpora, random_corpus(random_tokens, vocab=vocab,
                                           doc_length=options.max_length, seed=options.seed)]
    refuse_duplicates(out_dir, corpora, identity, options)  # before loading the model
    device = resolve_device(options.device)
    torch.manual_seed(options.seed)
    model = load_model(model_dir, device, options.dtype)
    check_generation_memory(model, options, device)
    from traces.collecting.capture import RouterCapture

    capture = RouterCapture(model, weights=options.weights, speculative=True)
    if capture.layers != tuple(identity.moe_layers):
        raise TraceError(f"the model routes experts in layers {list(capture.layers)}, the "
                         f"inventory says {list(identity.moe_layers)}")
    out_dir.mkdir(parents=True, exist_ok=True)
    results = []
    with capture, torch.inference_mode():
        for corpus in corpora:
            results.append(_collect_corpus(model, tokenizer, capture, corpus, out_dir, identity,
                                           options, device))
    return results


def _collect_corpus(model, tokenizer, capture: RouterCapture, corpus: Corpus, out_dir: Path,
                    identity: ModelIdentity, options: CollectOptions,
                    device: str) -> CollectResult:
    meta = {**collect_meta(out_dir, corpus, identity, options, weights=options.weights),
            "speculative": SPECULATIVE_POINT}
    run_id, base = meta["run_id"], meta["seq_id_base"]
    layers = np.asarray(identity.moe_layers, dtype=np.int16)
    path = out_dir / f"{corpus.tag}-{run_id:08x}.parquet"
    budget = options.max_tokens
    tokens = sequences = 0
    with TraceWriter(path, tag=corpus.tag, top_k=identity.top_k, meta=meta) as writer, \
            _Progress(corpus, options) as advance:
        for batch in _batches(_encode(corpus, tokenizer, options), options.batch_size):
            if budget is not None:
                if tokens >= budget:
                    break
                # a prompt's tokens are recorded before what it generates: the documents
                # past the budget's prompts would be cut away below
                batch = _trim(batch, budget - tokens)
            ids = base + sequences + np.arange(len(batch), dtype=np.int64)
            if options.mode == "score":
                rows = _score(model, capture, batch, ids, tokenizer, device)
            else:
                rows = _generate(model, capture, batch, ids, tokenizer, device, options)
            _check_top_k(rows, identity)
            rows = rows.head(keep_rows(tokens, len(rows.seq_id), budget))
            n, num_layers = len(rows.seq_id), len(layers)
            writer.write(np.repeat(rows.seq_id, num_layers), np.repeat(rows.pos, num_layers),
                         np.repeat(rows.token, num_layers), np.repeat(rows.phase, num_layers),
                         np.tile(layers, n), rows.experts.reshape(n * num_layers, -1),
                         None if rows.weights is None
                         else rows.weights.reshape(n * num_layers, -1),
                         rows.speculative.reshape(n * num_layers, -1))
            tokens += n
            sequences += len(np.unique(rows.seq_id))
            advance(len(batch), n)
        if tokens == 0:
            raise TraceError(f"corpus {corpus.source} produced no tokens")
        writer.close()
    return CollectResult(corpus.tag, path, tokens, sequences, writer.rows)


def _check_top_k(rows: _Tokens, identity: ModelIdentity) -> None:
    k = rows.experts.shape[-1]
    if k != identity.top_k:
        raise TraceError(f"the model's routers select {k} experts per token, the inventory "
                         f"says top-k {identity.top_k}")


def _encode(corpus: Corpus, tokenizer, options: CollectOptions) -> Iterator[list[int]]:
    """Token ids of each non-empty document, at most `max_length` of them."""
    generation_prompt = options.mode == "generate"
    for doc in corpus.documents():
        ids = encode_document(doc, tokenizer, generation_prompt)[:options.max_length]
        if ids:
            yield ids


def encode_document(doc: Document, tokenizer, generation_prompt: bool) -> list[int]:
    """A document's token ids: its own, or its text (document_text) tokenized."""
    if doc.token_ids is not None:
        return list(doc.token_ids)
    text, special = document_text(doc, tokenizer, generation_prompt)
    return tokenizer(text, add_special_tokens=special)["input_ids"]


def document_text(doc: Document, tokenizer, generation_prompt: bool) -> tuple[str, bool]:
    """The text a document of text or messages tokenizes as, and whether the tokenizer adds
    its special tokens: its text with them, or its messages through the chat template
    without them (with the generation prompt when asked; no template: "role: content" lines,
    with them)."""
    if doc.messages is None:
        return doc.text, True
    messages = list(doc.messages)
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(messages, tokenize=False,
                                             add_generation_prompt=generation_prompt), False
    return "\n".join(f"{m['role']}: {m['content']}" for m in messages), True


def _batches(docs: Iterator[list[int]], size: int) -> Iterator[list[list[int]]]:
    batch: list[list[int]] = []
    for doc in docs:
        batch.append(doc)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def _trim(batch: list[list[int]], budget: int) -> list[list[int]]:
    """The documents of `batch`, cut so that they hold at most `budget` tokens."""
    out = []
    for doc in batch:
        if budget <= 0:
            break
        out.append(doc[:budget])
        budget -= len(out[-1])
    return out


def _pad(batch: list[list[int]], pad_id: int, left: bool):
    """input_ids and attention_mask [B, T] int64 numpy arrays."""
    width = max(len(d) for d in batch)
    ids = np.full((len(batch), width), pad_id, dtype=np.int64)
    mask = np.zeros((len(batch), width), dtype=np.int64)
    for b, doc in enumerate(batch):
        cols = slice(width - len(doc), width) if left else slice(0, len(doc))
        ids[b, cols] = doc
        mask[b, cols] = 1
    return ids, mask


def _pad_id(tokenizer) -> int:
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    return 0 if pad is None else int(pad)


def _one_call(calls: list[Routing], expected: int) -> Routing:
    if len(calls) != 1 or calls[0].experts.shape[1] != expected:
        raise RuntimeError(f"expected one experts call of {expected} rows, got "
                           f"{[c.experts.shape[1] for c in calls]}")
    return calls[0]


def _score(model, capture: RouterCapture, batch: list[list[int]], seq_ids: np.ndarray,
           tokenizer, device: str) -> _Tokens:
    import torch

    ids, mask = _pad(batch, _pad_id(tokenizer), left=False)
    capture.take()
    model(input_ids=torch.from_numpy(ids).to(device),
          attention_mask=torch.from_numpy(mask).to(device), use_cache=False)
    routing = _one_call(capture.take(), ids.size)
    b, t = np.nonzero(mask)
    flat = b * ids.shape[1] + t
    return _Tokens(seq_id=seq_ids[b], pos=t.astype(np.int32), token=ids[b, t],
                   phase=np.full(len(b), DECODE, dtype=np.int32),
                   experts=routing.experts[:, flat].transpose(1, 0, 2),
                   weights=None if routing.weights is None
                   else routing.weights[:, flat].transpose(1, 0, 2),
                   speculative=routing.speculative[:, flat].transpose(1, 0, 2))


def _eos_ids(model, tokenizer) -> list[int]:
    eos = model.generation_config.eos_token_id
    if eos is None:
        eos = tokenizer.eos_token_id
    if eos is None:
        return []
    return [int(e) for e in (eos if isinstance(eos, list) else [eos])]


def _generate(model, capture: RouterCapture, batch: list[list[int]], seq_ids: np.ndarray,
              tokenizer, device: str, options: CollectOptions) -> _Tokens:
    """Prefill rows for the prompts, then one decode row per generated token fed back."""
    import torch

    pad = _pad_id(tokenizer)
    eos = _eos_ids(model, tokenizer)
    ids, mask = _pad(batch, pad, left=True)
    capture.take()
    out = model.generate(input_ids=torch.from_numpy(ids).to(device),
                         attention_mask=torch.from_numpy(mask).to(device),
                         max_new_tokens=options.max_new_tokens, do_sample=False,
                         pad_token_id=pad, eos_token_id=eos or None,
                         top_p=None, top_k=None, temperature=None)
    calls = capture.take()
    width = ids.shape[1]
    generated = out[:, width:].cpu().numpy()
    prefill = calls[0]
    if prefill.experts.shape[1] != ids.size or any(c.experts.shape[1] != len(batch)
                                                   for c in calls[1:]):
        raise RuntimeError("generate() called the experts with unexpected shapes: "
                           f"{[c.experts.shape[1] for c in calls]}")
    lengths = mask.sum(axis=1)
    b, t = np.nonzero(mask)
    parts = [(b, t - (width - lengths[b]), ids[b, t], np.full(len(b), PREFILL),
              prefill, b * width + t)]
    ended = np.zeros(len(batch), dtype=bool)
    for step, call in enumerate(calls[1:]):
        ended |= np.isin(generated[:, step], eos)
        alive = np.flatnonzero(~ended)
        parts.append((alive, lengths[alive] + step, generated[alive, step],
                      np.full(len(alive), DECODE), call, alive))
    seq = np.concatenate([p[0] for p in parts])
    pos = np.concatenate([p[1] for p in parts]).astype(np.int32)
    order = np.lexsort((pos, seq))
    experts = np.concatenate([p[4].experts[:, p[5]] for p in parts], axis=1)
    weights = (None if prefill.weights is None
               else np.concatenate([p[4].weights[:, p[5]] for p in parts], axis=1))
    speculative = np.concatenate([p[4].speculative[:, p[5]] for p in parts], axis=1)
    return _Tokens(seq_id=seq_ids[seq[order]], pos=pos[order],
                   token=np.concatenate([p[2] for p in parts])[order],
                   phase=np.concatenate([p[3] for p in parts]).astype(np.int32)[order],
                   experts=experts[:, order].transpose(1, 0, 2),
                   weights=None if weights is None else weights[:, order].transpose(1, 0, 2),
                   speculative=speculative[:, order].transpose(1, 0, 2))


class _Progress:
    """A rich progress bar on stderr (tokens/s, ETA); yields `advance(documents, tokens)`.

    It counts tokens when the total is known (`max_tokens`, random tokens), else documents;
    the total grows to the count where the count passes it (generate mode without
    `max_tokens`: random tokens count the prompts, the rows add generated tokens), and the
    bar ends at the true total."""

    def __init__(self, corpus: Corpus, options: CollectOptions) -> None:
        self.corpus, self.options = corpus, options

    def __enter__(self):
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
        )

        known = [n for n in (self.options.max_tokens, self.corpus.random_tokens) if n]
        total_tokens = min(known) if known else None
        self.by_tokens = total_tokens is not None
        self.start = time.perf_counter()
        self.tokens = 0
        self.bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                            TextColumn("{task.fields[rate]}"), TimeRemainingColumn(),
                            console=Console(file=bar_stream()), disable=not self.options.progress,
                            transient=False)
        self.bar.start()
        unit = "tokens" if self.by_tokens else "docs"
        self.task = self.bar.add_task(
            f"{self.corpus.tag} ({unit})", rate="",
            total=total_tokens if self.by_tokens else self.corpus.num_documents)
        return self.advance

    def advance(self, documents: int, tokens: int) -> None:
        self.tokens += tokens
        rate = self.tokens / max(time.perf_counter() - self.start, 1e-9)
        self.bar.update(self.task, advance=tokens if self.by_tokens else documents,
                        rate=f"{self.tokens} tok, {rate:,.0f} tok/s")
        task = self.bar.tasks[0]
        if task.total is not None and task.completed > task.total:
            # generate mode: random tokens count prompts, the rows add generated tokens too
            self.bar.update(self.task, total=task.completed)

    def __exit__(self, exc_type: type | None, *exc: object) -> None:
        if exc_type is None:  # done: the bar ends at what was recorded, not at the estimate
            self.bar.update(self.task, total=self.bar.tasks[0].completed)
        self.bar.stop()
