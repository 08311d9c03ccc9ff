"""Sample traffic for `placer collect`: corpora read as streams of documents.

Formats (chosen by the file suffix):

- `.txt`: one document per block of lines separated by blank lines.
- `.jsonl`: one document per line, each line of its own form (a file may mix them): its text
  field (`text_field`, default `text`) if it has one, else a chat, `messages` (a list of
  `{"role", "content"}`, rendered with the tokenizer's chat template), else `turns` (a list of
  user messages, one conversation per line, as MT-Bench writes them). A field whose value is
  null counts as absent (a dataset of both forms, exported, has null columns). A line with
  none of them is one TraceError naming the file, the line and the fields it has.
- `.parquet`: one document per row of the `text_field` column.

Every corpus is UTF-8, decoded strictly (a .txt or .jsonl byte that is not UTF-8 is one
TraceError naming the file, line and byte offset; Parquet strings are checked by Arrow).

A corpus is validated and counted in one cheap pass when it is opened, so a missing field or
an empty file is reported before any model is loaded. Documents are then streamed.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from traces.errors import TraceError
from traces.formats.bounded import MAX_BLOCK, bounded_lines
from traces.formats.jsontext import decode_utf8, jsonl_lines, loads_json
from traces.storing.schema import check_tag, first_line

RANDOM_TAG = "random"
SUFFIXES = (".txt", ".jsonl", ".parquet")
JSONL_FORMS = ("jsonl-text", "chat", "turns")  # a .jsonl line's forms, in the order tried
MIXED = "mixed"  # the kind of a .jsonl whose lines take more than one form
MAX_FIELDS_SHOWN = 8  # field names a refused line's error lists
MAX_FIELD_SHOWN = 40  # characters of each


@dataclass(frozen=True)
class Document:
    """One sequence of traffic: exactly one of `text`, `messages` or `token_ids` is set;
    `turns` marks messages that are a `turns` line's user messages (one conversation)."""

    text: str | None = None
    messages: tuple[dict, ...] | None = None
    token_ids: tuple[int, ...] | None = None
    turns: bool = False


@dataclass(frozen=True)
class Corpus:
    """A validated corpus: `documents()` streams its `num_documents` documents.

    `kind` is one of text | jsonl-text | chat | turns | mixed | parquet | random (a .jsonl is
    mixed when its lines take more than one form; each document says its own); `sha256`
    identifies the file's bytes (for `random`, the generator's parameters).
    """

    tag: str
    kind: str
    sha256: str
    num_documents: int
    path: Path | None = None
    text_field: str = "text"
    random_tokens: int = 0
    doc_length: int = 0
    seed: int = 0
    vocab: tuple[int, ...] = ()

    @property
    def source(self) -> str:
        """The corpus file name, or `random`."""
        return self.path.name if self.path is not None else RANDOM_TAG

    def documents(self) -> Iterator[Document]:
        """Stream the documents in file order."""
        if self.kind == "random":
            yield from _random_documents(self)
        elif self.kind == "text":
            yield from (Document(text=t) for t in _text_blocks(self.path))
        elif self.kind == "parquet":
            yield from (Document(text=t) for t in _parquet_texts(self.path, self.text_field))
        else:
            for number, record in _jsonl_records(self.path):
                yield _jsonl_document(record, _jsonl_form(self.path, number, record,
                                                          self.text_field), self.text_field)


def open_corpus(path: Path, *, tag: str | None = None, text_field: str = "text") -> Corpus:
    """Validate the corpus at `path` (exists, known format, field present, not empty)."""
    path = Path(path)
    if not path.is_file():
        raise TraceError(f"corpus not found: {path}")
    suffix = path.suffix.lower()
    if suffix not in SUFFIXES:
        raise TraceError(f"corpus {path}: unknown format {suffix!r} (use {', '.join(SUFFIXES)})")
    tag = check_tag(tag if tag is not None else path.stem)
    if suffix == ".txt":
        kind, count = "text", sum(1 for _ in _text_blocks(path))
    elif suffix == ".parquet":
        kind, count = "parquet", _parquet_count(path, text_field)
    else:
        kind, count = _jsonl_scan(path, text_field)
    if count == 0:
        raise TraceError(f"corpus {path} is empty (no documents)")
    return Corpus(tag=tag, kind=kind, sha256=_file_sha256(path), num_documents=count,
                  path=path, text_field=text_field)


def random_corpus(num_tokens: int, *, vocab: list[int], doc_length: int, seed: int) -> Corpus:
    """Uniform random token ids from `vocab`: `num_tokens` in documents of `doc_length`."""
    if num_tokens < 1 or doc_length < 1:
        raise TraceError(f"--random-tokens and the document length must be >= 1, got "
                         f"{num_tokens} and {doc_length}")
    if not vocab:
        raise TraceError("the tokenizer has no non-special token ids to draw from")
    ident = json.dumps({"random_tokens": num_tokens, "doc_length": doc_length, "seed": seed,
                        "vocab": [len(vocab), vocab[0], vocab[-1]]}, sort_keys=True)
    return Corpus(tag=RANDOM_TAG, kind="random", sha256=hashlib.sha256(ident.encode()).hexdigest(),
                  num_documents=-(-num_tokens // doc_length), random_tokens=num_tokens,
                  doc_length=doc_length, seed=seed, vocab=tuple(vocab))


def _random_documents(corpus: Corpus) -> Iterator[Document]:
    vocab = np.asarray(corpus.vocab, dtype=np.int64)
    for i in range(corpus.num_documents):
        n = min(corpus.doc_length, corpus.random_tokens - i * corpus.doc_length)
        rng = np.random.default_rng([corpus.seed, i])
        yield Document(token_ids=tuple(int(t) for t in vocab[rng.integers(0, len(vocab), n)]))


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _text_blocks(path: Path) -> Iterator[str]:
    """The blocks of a .txt corpus, each line bounded (traces.formats.bounded) and decoded strictly:
    a byte that is not UTF-8 is a TraceError naming the file, the line and its byte offset."""
    block: list[str] = []
    size = 0
    for number, offset, raw in bounded_lines(path, "corpus", lambda n: f"corpus {path} line {n}"):
        line = decode_utf8(raw, f"corpus {path} line {number}", offset=offset)
        if line.strip():
            block.append(line.rstrip("\n").removesuffix("\r"))
            size += len(raw)
            if size > MAX_BLOCK:
                raise TraceError(f"corpus {path} line {number}: a document (lines up to a blank "
                                 f"one) longer than {MAX_BLOCK >> 20} MiB (at byte offset "
                                 f"{offset}); separate documents with blank lines")
        elif block:
            yield "\n".join(block)
            block, size = [], 0
    if block:
        yield "\n".join(block)


def _jsonl_records(path: Path) -> Iterator[tuple[int, dict]]:
    for number, line in jsonl_lines(path, lambda n: f"corpus {path} line {n}", "corpus"):
        record = loads_json(line, f"corpus {path} line {number}")
        if not isinstance(record, dict):
            raise TraceError(f"corpus {path} line {number}: not a JSON object")
        yield number, record


def _jsonl_form(path: Path, number: int, record: dict, text_field: str) -> str:
    """The form of a .jsonl line: its text field, else `messages`, else `turns`."""
    for form, field in zip(JSONL_FORMS, (text_field, "messages", "turns"), strict=True):
        if record.get(field) is not None:  # null: absent
            return form
    raise TraceError(f"corpus {path} line {number}: no field {text_field!r} (nor 'messages' / "
                     f"'turns'); fields: {_field_names(record)}; choose the text field with "
                     "--text-field")


def _field_names(record: dict) -> str:
    """The fields of a record, for one short line: sorted, a few, each clipped, escaped
    where not plain (a name may hold a newline), null values marked."""
    if not record:
        return "none"
    shown = []
    for name in sorted(record)[:MAX_FIELDS_SHOWN]:
        clipped = name[:MAX_FIELD_SHOWN]
        text = clipped if clipped.isprintable() and "," not in clipped and clipped == name \
            else json.dumps(clipped) + ("..." if clipped != name else "")
        shown.append(f"{text} (null)" if record[name] is None else text)
    if len(record) > MAX_FIELDS_SHOWN:
        shown.append(f"... ({len(record)} in all)")
    return ", ".join(shown)


def _jsonl_scan(path: Path, text_field: str) -> tuple[str, int]:
    """The kind of a .jsonl corpus (its lines' one form, or `mixed`) and its line count,
    every line checked."""
    forms: set[str] = set()
    count = 0
    for number, record in _jsonl_records(path):
        form = _jsonl_form(path, number, record, text_field)
        _jsonl_document(record, form, text_field, where=f"corpus {path} line {number}")
        forms.add(form)
        count += 1
    if len(forms) > 1:
        return MIXED, count
    return forms.pop() if forms else "jsonl-text", count


def _jsonl_document(record: dict, form: str, text_field: str, where: str = "corpus"
                    ) -> Document:
    if form == "jsonl-text":
        text = record[text_field]
        if not isinstance(text, str):
            raise TraceError(f"{where}: field {text_field!r} is not a string")
        return Document(text=text)
    if form == "turns":
        turns = record["turns"]
        if not isinstance(turns, list) or not all(isinstance(t, str) for t in turns):
            raise TraceError(f"{where}: 'turns' is not a list of strings")
        return Document(messages=tuple({"role": "user", "content": t} for t in turns),
                        turns=True)
    messages = record["messages"]
    if not isinstance(messages, list) or not all(
            isinstance(m, dict) and isinstance(m.get("content"), str) and "role" in m
            for m in messages):
        raise TraceError(f"{where}: 'messages' is not a list of {{role, content}} objects")
    return Document(messages=tuple({"role": m["role"], "content": m["content"]}
                                   for m in messages))


def _parquet_count(path: Path, text_field: str) -> int:
    try:
        schema = pq.read_schema(path)
    except (OSError, pa.ArrowException) as exc:  # ArrowInvalid: a file cut short, garbage
        raise TraceError(f"corpus {path}: not a readable Parquet file ({first_line(exc)})"
                         ) from None
    if text_field not in schema.names:
        raise TraceError(f"corpus {path}: no column {text_field!r} (columns: "
                         f"{', '.join(schema.names)}); choose one with --text-field")
    return sum(1 for _ in _parquet_texts(path, text_field))


def _parquet_texts(path: Path, text_field: str) -> Iterator[str]:
    try:
        for batch in pq.ParquetFile(path).iter_batches(columns=[text_field], batch_size=4096):
            for text in batch.column(0).to_pylist():
                if text is not None:
                    if not isinstance(text, str):
                        raise TraceError(f"corpus {path}: column {text_field!r} is not text")
                    yield text
    except (OSError, pa.ArrowException) as exc:  # a corrupt page, a bad dictionary
        raise TraceError(f"corpus {path}: not a readable Parquet file ({first_line(exc)})"
                         ) from None
