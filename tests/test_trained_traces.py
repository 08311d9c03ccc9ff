"""The trained MoE's held-out trace set (tests/data/trained-moe-traces, its README says where
it comes from): what docs/trained-moe.md states about it is read back from the committed
files, to the digits it states, and prefetching from its speculative routing is judged on it
(real routing of a model trained here, not a random-init router's)."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import numpy as np
import pytest

from benchmarks.moe_routing import routing_figures
from solvers.cache.prefetch import Link, Prefetch, quality, replay
from traces.storing.dataset import open_traces
from traces.storing.speculative import speculative_steps

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "tests" / "data" / "trained-moe-traces"
DOC = (REPO / "docs" / "trained-moe.md").read_text()
DOMAINS = ("prose", "code", "chat")
EXPERTS = json.loads((DATA / "config.json").read_text())["num_local_experts"]  # 16
# docs/trained-moe.md's prefetch table: `benchmarks/bench_prefetch.py DIR`'s defaults.
STEPS, COPY_S, WINDOW_S = 5000, 1e-3, 2e-3


def pct(x: float) -> str:
    return f"{100 * x:.1f}"


def stated_recall(domain: str) -> list[tuple[str, ...]]:
    """The per-layer recalls the docs state for `domain`: (share,) or (share, low, high)."""
    para = " ".join(DOC.split("Speculative recall one layer ahead, per MoE layer")[1]
                    .split("\n\n")[0].split())
    figures = re.search(rf"\b{domain} ((?:[\d.]+(?: \[[\d.]+, [\d.]+\])?(?:, )?)+)", para)
    return [tuple(x for x in m if x)
            for m in re.findall(r"([\d.]+)(?: \[([\d.]+), ([\d.]+)\])?", figures.group(1))]


def stated_row(pattern: str) -> tuple[str, ...]:
    """The cells of the one docs table row `pattern` matches."""
    rows = re.findall(pattern, DOC)
    assert len(rows) == 1, pattern
    return rows[0] if isinstance(rows[0], tuple) else (rows[0],)


@pytest.fixture(scope="module")
def steps() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """(actual, predicted) of every decode token of each domain, in (sequence, pos) order."""
    return {d: speculative_steps(DATA / d) for d in DOMAINS}


def test_the_set_is_the_recorded_models_routing():
    """One trace per domain, all from the model training.json describes (its config.json
    beside it), collected in score mode with the speculative column; the README names the
    weights' sha256 that training.json records."""
    config = json.loads((DATA / "config.json").read_text())
    training = json.loads((DATA / "training.json").read_text())
    assert training["weights"]["sha256"] in (DATA / "README.md").read_text()
    fingerprints = set()
    for domain in DOMAINS:
        td = open_traces(DATA / domain)
        (meta,) = td.metas
        assert (meta["tag"], meta["mode"], meta["max_length"]) == (domain, "score", 256)
        assert meta["speculative"] == {"point": "moe_input", "depth": 1}
        options = training["options"]
        assert meta["experts_per_layer"] == config["num_local_experts"] == options["experts"]
        assert meta["top_k"] == config["num_experts_per_tok"] == options["top_k"]
        assert meta["moe_layers"] == list(range(config["num_hidden_layers"]))
        fingerprints.add(meta["fingerprint"])
    assert len(fingerprints) == 1


@pytest.mark.parametrize("domain", DOMAINS)
def test_speculative_recall_per_layer_is_what_the_docs_state(domain, steps):
    """Layer l+1's router on layer l's MoE input predicts the share of layer l+1's
    selections docs/trained-moe.md states, per MoE layer 1-5 (and its interval where
    stated), over every held-out token; their mean is the table's recall column."""
    recall = quality(*steps[domain]).recall()
    assert recall[0] is None  # nothing predicts the first MoE layer
    measured = [tuple(pct(x) for x in r) for r in recall[1:]]
    stated = stated_recall(domain)
    assert len(stated) == len(measured) == 5
    for got, said in zip(measured, stated, strict=True):
        assert got[:len(said)] == said
    row = stated_row(rf"\| trained, held-out {domain} \|[^\n]*\| ([\d.]+) \|\n")
    assert pct(np.mean([r[0] for r in recall[1:]])) == row[0]


@pytest.mark.parametrize("domain", DOMAINS)
def test_skew_and_locality_are_what_the_docs_state(domain):
    """Tokens, hot10, entropy share, reuse and its independent baseline of the docs' routing
    table, from the committed traces (benchmarks/moe_routing.py's figures)."""
    fig = routing_figures(DATA / domain)
    row = stated_row(rf"\| trained, held-out {domain} \| ([\d,]+) \| 16 / 2 \| ([\d.]+) \| "
                     r"([\d.]+) \| ([\d.]+) \| ([\d.]+) \|")
    m = fig["mean"]
    assert (f"{fig['tokens']:,}", pct(m["hot10"]), pct(m["entropy_share"]), pct(m["reuse"]),
            pct(m["reuse_independent"])) == row
    assert m["reuse"] > m["reuse_independent"]  # temporal locality beyond skew


@pytest.mark.parametrize("domain", DOMAINS)
def test_prefetch_from_speculative_routing_beats_lru_without_it(domain, steps):
    """One card, nothing pinned, a quarter of the 96 experts as slots, 1 ms copies in 2 ms
    windows (the docs' parameters): LRU with prefetch stalls less than LRU without it and
    within the issue's 1.5x of Belady's bound without prefetch; every stall the docs'
    table states, to its three decimals."""
    actual, predicted = (a[:STEPS] for a in steps[domain])
    slots = actual.shape[1] * EXPERTS // 4
    link = Link(copy_s=COPY_S, window_s=WINDOW_S)
    stall = {}
    for eviction in ("lru", "min"):
        for name, guess in (("", None), ("+prefetch", predicted)):
            counts = replay(actual, guess, slots, link, Prefetch(), num_experts=EXPERTS,
                            eviction=eviction)
            stall[eviction + name] = counts.stall_s * 1e3 / len(actual)
    assert stall["lru+prefetch"] < stall["lru"]
    assert stall["lru+prefetch"] <= 1.5 * stall["min"] < stall["lru"]
    row = stated_row(rf"\| {domain} \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \| "
                     r"([\d.]+)x \| ([\d.]+)x \|")
    assert tuple(f"{stall[k]:.3f}" for k in ("lru", "lru+prefetch", "min", "min+prefetch")) \
        + (f"{stall['lru'] / stall['min']:.2f}", f"{stall['lru+prefetch'] / stall['min']:.2f}") \
        == row


def test_the_readme_names_each_files_sha256():
    """The README's list of files and digests is the folder's content."""
    readme = (DATA / "README.md").read_text()
    for path in sorted(DATA.rglob("*")):
        if path.is_file() and path.name != "README.md":
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
            assert f"`{path.relative_to(DATA)}`" in readme and digest in readme, path
