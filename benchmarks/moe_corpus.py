"""The mixed corpus a small MoE is trained on here (benchmarks/train_moe.py): prose, code and
chat documents, split into training and held-out sets by whole document.

- prose: ../shared/data/shakespeare.txt (tiny shakespeare, public domain; the char-rnn repo
  is MIT), cut into documents of whole speeches (blank-line blocks) of about
  PROSE_DOC_CHARS characters each, in file order.
- code: the .py files of the running Python's standard library
  (`sysconfig.get_paths()["stdlib"]`, PSF-2.0), sorted by relative path, test suites,
  site-packages and idlelib's/lib2to3's fixtures left out, each file one document (at most
  CODE_FILE_CHARS characters, the rest cut), taken in that order until `code_chars` are in.
- chat: MT-Bench's and Vicuna-Bench's questions (lm-sys/FastChat, Apache-2.0), one document a
  question (its user turns).

Held out: every `every`-th document of each domain (the 0th, `every`-th, ...), so held-out
documents are never cut from a training one and both sets sample the whole of each source.
"""

from __future__ import annotations

import hashlib
import json
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

DOMAINS = ("prose", "code", "chat")
PROSE_DOC_CHARS = 2000
CODE_FILE_CHARS = 20000
SKIP_CODE_DIRS = ("test", "tests", "site-packages", "idlelib", "lib2to3", "__pycache__")

SOURCES = {
    "prose": {"file": "shakespeare.txt", "source": "karpathy/char-rnn "
              "data/tinyshakespeare/input.txt", "license": "repo MIT; text public domain"},
    "chat": {"file": "mt_bench_questions.jsonl + vicuna_bench_questions.jsonl",
             "source": "lm-sys/FastChat fastchat/llm_judge/data/{mt_bench,vicuna_bench}/"
             "question.jsonl", "license": "Apache-2.0"},
    "code": {"file": "the running Python's stdlib *.py", "source": "CPython "
             + sys.version.split()[0], "license": "PSF-2.0"},
}


@dataclass(frozen=True)
class Document:
    """One document: its domain, a name that says where it came from, its text (chat: its
    user turns)."""

    domain: str
    name: str
    text: str
    turns: tuple[str, ...] = ()


def prose_documents(path: Path) -> list[Document]:
    """Consecutive blank-line blocks of `path` joined until PROSE_DOC_CHARS characters."""
    docs, current, size = [], [], 0
    for block in path.read_text(encoding="utf-8").split("\n\n"):
        current.append(block)
        size += len(block) + 2
        if size >= PROSE_DOC_CHARS:
            docs.append("\n\n".join(current))
            current, size = [], 0
    if current:
        docs.append("\n\n".join(current))
    return [Document("prose", f"{path.name}#{i}", text) for i, text in enumerate(docs)]


def chat_documents(paths: list[Path]) -> list[Document]:
    """One document per question line (its `turns`, user messages)."""
    docs = []
    for path in paths:
        for line in path.read_text(encoding="utf-8").splitlines():
            record = json.loads(line)
            turns = tuple(str(t) for t in record["turns"])
            docs.append(Document("chat", f"{path.name}#{record['question_id']}",
                                 "\n".join(turns), turns))
    return docs


def code_documents(stdlib: Path, code_chars: int) -> list[Document]:
    """The stdlib's .py files in sorted order (SKIP_CODE_DIRS left out) until `code_chars`."""
    docs, total = [], 0
    for path in sorted(stdlib.rglob("*.py"), key=lambda p: p.relative_to(stdlib).as_posix()):
        rel = path.relative_to(stdlib)
        if any(part in SKIP_CODE_DIRS for part in rel.parts[:-1]):
            continue
        try:
            text = path.read_text(encoding="utf-8")[:CODE_FILE_CHARS]
        except (UnicodeDecodeError, OSError):
            continue
        if not text.strip():
            continue
        docs.append(Document("code", rel.as_posix(), text))
        total += len(text)
        if total >= code_chars:
            break
    return docs


def load_documents(data_dir: Path, code_chars: int, stdlib: Path | None = None
                   ) -> list[Document]:
    """Every document of the three domains, in a fixed order."""
    stdlib = stdlib or Path(sysconfig.get_paths()["stdlib"])
    return (prose_documents(data_dir / "shakespeare.txt")
            + code_documents(stdlib, code_chars)
            + chat_documents([data_dir / "mt_bench_questions.jsonl",
                              data_dir / "vicuna_bench_questions.jsonl"]))


def split_documents(docs: list[Document], every: int
                    ) -> tuple[list[Document], list[Document]]:
    """(training, held-out): every `every`-th document of each domain is held out."""
    train, held = [], []
    seen = dict.fromkeys(DOMAINS, 0)
    for doc in docs:
        (held if seen[doc.domain] % every == 0 else train).append(doc)
        seen[doc.domain] += 1
    return train, held


def write_heldout(held: list[Document], out_dir: Path) -> dict[str, Path]:
    """One .jsonl corpus per domain for `placer collect` (text lines; chat as turns)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {}
    for domain in DOMAINS:
        lines = [json.dumps({"turns": list(d.turns)} if d.turns else {"text": d.text})
                 for d in held if d.domain == domain]
        paths[domain] = out_dir / f"{domain}.jsonl"
        paths[domain].write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return paths


def provenance(docs: list[Document], held: list[Document]) -> dict:
    """Per domain: source, license, documents and characters (all and held out), and a
    sha256 over the documents' names and texts in order (what makes two corpora equal)."""
    out = {}
    for domain in DOMAINS:
        mine = [d for d in docs if d.domain == domain]
        digest = hashlib.sha256()
        for d in mine:
            digest.update(d.name.encode() + b"\0" + d.text.encode() + b"\0")
        out[domain] = {**SOURCES[domain], "documents": len(mine),
                       "chars": sum(len(d.text) for d in mine),
                       "heldout_documents": sum(d.domain == domain for d in held),
                       "heldout_chars": sum(len(d.text) for d in held if d.domain == domain),
                       "sha256": digest.hexdigest()}
    return out
