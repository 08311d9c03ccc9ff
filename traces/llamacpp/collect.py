"""`placer collect --gguf`: the routing of a GGUF recorded through llama.cpp itself.

Each document runs as its own sequence in llama.cpp (`runner.LlamaCpp`, CPU backend): in
score mode one llama_decode of its tokens (rows phase `decode`, as the Hugging Face
collector's score mode); in generate mode its prompt (`prefill` rows) then greedy decoding,
each generated token fed back a `decode` row, until `max_new_tokens` or an end token;
`max_tokens` cuts the last sequence's rows to it, as the Hugging Face collector does. The
trace files are the Hugging Face collector's (`traces.collecting.collect`): same schema,
metadata, run ids and refusals, without gate weights. Documents are tokenized by the Hugging Face
tokenizer at `tokenizer` when given (the ids `placer collect --model` would use), else by
llama.cpp's own tokenizer and chat template from the GGUF.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from traces.collecting.collect import (
    DECODE,
    PREFILL,
    CollectOptions,
    CollectResult,
    ModelIdentity,
    _Progress,
    check_options,
    encode_document,
    keep_rows,
    load_tokenizer,
)
from traces.collecting.corpora import Corpus, Document, random_corpus
from traces.collecting.runs import check_request, collect_meta, refuse_duplicates
from traces.errors import TraceError
from traces.llamacpp.runner import MAX_CONTEXT, EngineOptions, LlamaCpp
from traces.storing.writer import TraceWriter


def collect_gguf(gguf: Path, corpora: list[Corpus], out_dir: Path, identity: ModelIdentity,
                 options: CollectOptions = CollectOptions(), *,
                 random_tokens: int | None = None) -> list[CollectResult]:
    """Run the GGUF over every corpus (plus `random_tokens` uniform random token ids, tag
    `random`, in documents of `max_length`) and write one trace file per corpus."""
    check_options(options)
    if options.max_length + options.max_new_tokens + 8 > MAX_CONTEXT:
        raise TraceError(f"--max-length {options.max_length} and --max-new-tokens "
                         f"{options.max_new_tokens} ask llama.cpp for more than {MAX_CONTEXT} "
                         "tokens of context")
    out_dir = check_request(corpora, out_dir, identity, random_tokens)
    tokenizer = (load_tokenizer(options.tokenizer, options.tokenizer)
                 if options.tokenizer is not None else None)
    engine = EngineOptions(str(gguf), n_ctx=options.max_length + options.max_new_tokens + 8,
                           n_batch=options.max_length + 8, n_expert_used=identity.top_k)
    with LlamaCpp(engine) as llama:
        if random_tokens:
            special = set(tokenizer.all_special_ids) if tokenizer is not None else set()
            size = len(tokenizer) if tokenizer is not None else llama.n_vocab
            corpora = [*corpora, random_corpus(
                random_tokens, vocab=[i for i in range(size) if i not in special],
                doc_length=options.max_length, seed=options.seed)]
        refuse_duplicates(out_dir, corpora, identity, options)
        out_dir.mkdir(parents=True, exist_ok=True)
        results = [_collect_corpus(llama, tokenizer, corpus, out_dir, identity, options)
                   for corpus in corpora]
        llama.close()
    return results


def _tokens(llama: LlamaCpp, tokenizer, doc: Document, options: CollectOptions) -> list[int]:
    if doc.token_ids is not None:
        ids = list(doc.token_ids)
    elif tokenizer is not None:
        ids = encode_document(doc, tokenizer, options.mode == "generate")
    elif doc.messages is not None:
        ids = llama.tokenize(chat=list(doc.messages), max_tokens=options.max_length)
    else:
        ids = llama.tokenize(text=doc.text, max_tokens=options.max_length)
    return ids[:options.max_length]


def _collect_corpus(llama: LlamaCpp, tokenizer, corpus: Corpus, out_dir: Path,
                    identity: ModelIdentity, options: CollectOptions) -> CollectResult:
    meta = collect_meta(out_dir, corpus, identity, options, weights=False, engine="llama.cpp")
    run_id, base = meta["run_id"], meta["seq_id_base"]
    layers = np.asarray(identity.moe_layers, dtype=np.int16)
    path = out_dir / f"{corpus.tag}-{run_id:08x}.parquet"
    tokens = sequences = 0
    new = options.max_new_tokens if options.mode == "generate" else 0
    with TraceWriter(path, tag=corpus.tag, top_k=identity.top_k, meta=meta) as writer, \
            _Progress(corpus, options) as advance:
        for doc in corpus.documents():
            if options.max_tokens is not None and tokens >= options.max_tokens:
                break
            ids = _tokens(llama, tokenizer, doc, options)
            if options.max_tokens is not None:
                ids = ids[:options.max_tokens - tokens]
            if not ids:
                continue
            run = llama.run(ids, new)
            _check(run.layers, run.experts, identity)
            n, num_layers = keep_rows(tokens, len(run.tokens), options.max_tokens), len(layers)
            phase = np.full(n, DECODE, dtype=np.int32)
            if options.mode == "generate":
                phase[:run.prompt] = PREFILL
            writer.write(np.full(n * num_layers, base + sequences, dtype=np.int64),
                         np.repeat(np.arange(n, dtype=np.int32), num_layers),
                         np.repeat(run.tokens[:n], num_layers), np.repeat(phase, num_layers),
                         np.tile(layers, n), run.experts[:n].reshape(n * num_layers, -1), None)
            tokens += n
            sequences += 1
            advance(1, n)
        if tokens == 0:
            raise TraceError(f"corpus {corpus.source} produced no tokens")
        writer.close()
    return CollectResult(corpus.tag, path, tokens, sequences, writer.rows)


def _check(layers: list[int], experts: np.ndarray, identity: ModelIdentity) -> None:
    if tuple(layers) != tuple(identity.moe_layers):
        raise TraceError(f"llama.cpp routes experts in layers {layers}, the inventory says "
                         f"{list(identity.moe_layers)}")
    if experts.shape[-1] != identity.top_k:
        raise TraceError(f"llama.cpp selects {experts.shape[-1]} experts per token, the "
                         f"inventory says top-k {identity.top_k}")
