"""What identifies one collect run and the trace file it writes, and the checks every
collector (Hugging Face, llama.cpp, a server) makes of its output directory before it writes:
no other model's traces there, no sample collected twice, a run id not used there yet."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path

from traces.collecting.corpora import Corpus
from traces.errors import TraceError
from traces.storing.dataset import scan
from traces.storing.schema import KIND_COUNTS, KIND_TOKENS, SEQ_ID_SHIFT, ModelIdentity


@dataclass(frozen=True)
class CollectOptions:
    """How to run the model; see `placer collect --help`."""

    mode: str = "score"
    batch_size: int = 8
    max_length: int = 512
    max_new_tokens: int = 32
    max_tokens: int | None = None
    device: str = "auto"
    dtype: str = "auto"
    seed: int = 0
    weights: bool = True
    tokenizer: Path | None = None
    progress: bool = True


@dataclass(frozen=True)
class CollectResult:
    """One written trace file."""

    tag: str
    path: Path
    tokens: int
    sequences: int
    rows: int


def check_out_dir(out_dir: Path, fingerprint: str) -> None:
    """Refuse an output directory that holds imported counts or traces of another model."""
    if not out_dir.exists():
        return
    if not out_dir.is_dir():
        raise TraceError(f"--out {out_dir} exists and is not a directory")
    td = scan(out_dir)
    if td.kind == KIND_COUNTS:
        raise TraceError(f"{out_dir} holds imported counts; collect into another directory")
    if td.kind == KIND_TOKENS and td.model["fingerprint"] != fingerprint:
        raise TraceError(f"{out_dir} holds traces of another model (fingerprint "
                         f"{td.model['fingerprint'][:16]}, this model {fingerprint[:16]}); "
                         f"collect into another directory")


# What makes two traces the same sample of traffic: a second file of one in a directory
# would count every one of its sequences twice in the profile.
SAME_SAMPLE = ("fingerprint", "corpus_sha256", "tag", "mode")


def refuse_duplicate(out_dir: Path, meta: dict) -> None:
    """TraceError if a trace in `out_dir` holds the sample `meta` (a trace's metadata, or at
    least its SAME_SAMPLE keys and `corpus`) describes: same model, corpus bytes, tag, mode."""
    if not Path(out_dir).is_dir():
        return
    td = scan(out_dir)
    key = {k: meta.get(k) for k in SAME_SAMPLE}
    for path, found in zip(td.files, td.metas, strict=True):
        if {k: found.get(k) for k in SAME_SAMPLE} == key:
            raise TraceError(f"{path} already holds corpus {meta.get('corpus')} (tag "
                             f"{key['tag']}, mode {key['mode']}) from this model: collecting it "
                             "again would count it twice; remove that file or collect into "
                             "another directory")


def check_request(corpora: list[Corpus], out_dir: Path, identity: ModelIdentity,
                  random_tokens: int | None) -> Path:
    """What every collector checks before it loads a model (its options checked already):
    that `out_dir` holds no other model's traces, that there is something to collect,
    distinct tags."""
    out_dir = Path(out_dir)
    check_out_dir(out_dir, identity.fingerprint)
    if not corpora and not random_tokens:
        raise TraceError("nothing to collect: give --corpus PATH or --random-tokens N")
    tags = [c.tag for c in corpora] + (["random"] if random_tokens else [])
    if len(set(tags)) != len(tags):
        raise TraceError(f"corpus tags must be distinct, got {tags}; set them with --tag")
    return out_dir


def refuse_duplicates(out_dir: Path, corpora: list[Corpus], identity: ModelIdentity,
                      options: CollectOptions) -> None:
    """refuse_duplicate for every corpus, before a model is loaded (each corpus's run checks
    again with its full metadata)."""
    for corpus in corpora:
        refuse_duplicate(out_dir, {"fingerprint": identity.fingerprint, "corpus": corpus.source,
                                   "corpus_sha256": corpus.sha256, "tag": corpus.tag,
                                   "mode": options.mode})


def run_meta(out_dir: Path, corpus: Corpus, identity: ModelIdentity, run: dict, *, mode: str,
             weights: bool, max_length: int, max_new_tokens: int | None, seed: int | None,
             **extra: object) -> dict:
    """The metadata of one corpus's trace file, for every collector: its run id (from the
    model, the corpus and `run`, what else identifies the run: options, engine, server URL;
    unused in `out_dir`) and sequence id base, the model, corpus and how it ran, then `extra`
    (engine="llama.cpp"; server=URL, estimated=...). Refused if `out_dir` already holds it."""
    run_id = run_id_of(out_dir, {"fingerprint": identity.fingerprint, "corpus": corpus.sha256,
                                 "tag": corpus.tag, **run})
    meta = {"kind": KIND_TOKENS, **asdict(identity), "tag": corpus.tag, "corpus": corpus.source,
            "corpus_sha256": corpus.sha256, "mode": mode, "run_id": run_id,
            "seq_id_base": run_id << SEQ_ID_SHIFT, "weights": weights,
            "max_length": max_length, "max_new_tokens": max_new_tokens, "seed": seed, **extra}
    refuse_duplicate(out_dir, meta)
    return meta


# Options that change how a run shows, not what it records: not part of its identity, so
# the same collection with and without a progress bar has the same run id and sequence ids.
UNIDENTIFYING = ("progress",)


def collect_meta(out_dir: Path, corpus: Corpus, identity: ModelIdentity,
                 options: CollectOptions, weights: bool, **engine: str) -> dict:
    """run_meta of a collector that runs the model itself (Hugging Face, llama.cpp) with
    `options`; `engine` (e.g. engine="llama.cpp") is part of both the run's identity and the
    metadata."""
    run = {k: v for k, v in asdict(options).items() if k not in UNIDENTIFYING}
    return run_meta(out_dir, corpus, identity,
                    {**run, **engine, "tokenizer": str(options.tokenizer)},
                    mode=options.mode, weights=weights, max_length=options.max_length,
                    max_new_tokens=options.max_new_tokens if options.mode == "generate" else None,
                    seed=options.seed, **engine)


def run_id_of(out_dir: Path, run: dict) -> int:
    """A 31-bit id from what identifies a run (`run`: model fingerprint, corpus, options, ...,
    JSON-able), bumped until unused in `out_dir`."""
    ident = json.dumps(run, sort_keys=True, default=str)
    run_id = int(hashlib.sha256(ident.encode()).hexdigest()[:8], 16) & 0x7FFFFFFF
    used = {m.get("run_id") for m in scan(out_dir).metas}
    while run_id in used:
        run_id = (run_id + 1) & 0x7FFFFFFF
    return run_id
