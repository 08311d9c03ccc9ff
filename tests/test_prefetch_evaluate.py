"""`placer evaluate`'s prefetch section: a one-card plan with cache slots, held-out traffic
whose trace records speculative routing (hand-made arrays, not a model's)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from test_evaluate import CONFIG, EXPERTS, LAYERS, TOP_K  # the same toy model

from placer.plan.placement import plan_quotas, read_plan
from solvers.cache.belady import _min_hits
from traces.storing.schema import PHASES
from traces.storing.writer import TraceWriter

BOX = """name = "one-card"
description = "the tiny box with one card"
host_ram = "1GiB"
cards = 1

[card]
model = "toy"
vram = "1MiB"
h2d_bandwidth = "0.5GB/s"
latency_us = 5.0

[decode]
base_step_ms = { 1 = 0.5, 8 = 1.5 }
"""


def routing(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """[n, L, k] skewed distinct selections, and predictions that are right about half the
    time (-1 on the first MoE layer)."""
    rng = np.random.default_rng(seed)
    pop = rng.dirichlet(np.full(EXPERTS, 0.3), size=len(LAYERS))
    pick = [[rng.choice(EXPERTS, TOP_K, replace=False, p=pop[m]) for m in range(len(LAYERS))]
            for _ in range(n)]
    actual = np.array(pick)
    guess = np.where(rng.random(actual.shape) < 0.5, actual, (actual + 1) % EXPERTS)
    guess[:, 0] = -1
    return actual, guess


def write_trace(out: Path, seqs: list[tuple[np.ndarray, np.ndarray]], run_id: int,
                speculative: bool) -> Path:
    meta = {"kind": "tokens", "fingerprint": "feed", "num_layers": len(LAYERS),
            "moe_layers": list(LAYERS), "experts_per_layer": EXPERTS, "top_k": TOP_K,
            "tag": "t", "run_id": run_id,
            **({"speculative": {"point": "moe_input", "depth": 1}} if speculative else {})}
    out.mkdir()
    writer = TraceWriter(out / f"t-{run_id}.parquet", tag="t", top_k=TOP_K, meta=meta)
    for i in reversed(range(len(seqs))):  # file order is not trace order
        actual, guess = seqs[i]
        rows = len(actual) * len(LAYERS)
        writer.write(np.full(rows, (run_id << 32) + i), np.repeat(np.arange(len(actual)),
                     len(LAYERS)), np.zeros(rows), np.full(rows, PHASES.index("decode")),
                     np.tile(LAYERS, len(actual)), actual.reshape(-1, TOP_K), None,
                     guess.reshape(-1, TOP_K) if speculative else None)
    writer.close()
    return out


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory, cli) -> dict:
    root = tmp_path_factory.mktemp("prefetch")
    (root / "config.json").write_text(json.dumps(CONFIG))
    (root / "box.toml").write_text(BOX)
    calib = write_trace(root / "calib", [routing(20, s) for s in range(6)], 1, False)
    held_seqs = [routing(n, 10 + i) for i, n in enumerate([9, 14, 6, 11])]
    held = write_trace(root / "held", held_seqs, 2, True)
    plan = root / "plan.json"
    cli("solve", "--config", root / "config.json", "--hardware", root / "box.toml",
        "--traces", calib, "--offload", "0.5", "--solver", "greedy", "--cache", "6",
        "--out", plan)
    return {"root": root, "calib": calib, "held": held, "held_seqs": held_seqs, "plan": plan}


def test_prefetch_lines_replay_the_plan_in_sequence_order(setup, cli):
    report = json.loads(cli("evaluate", setup["plan"], "--traces", setup["held"],
                            "--json").output)
    [section] = report["prefetch"]
    actual = np.concatenate([a for a, _ in setup["held_seqs"]])  # by sequence id
    guess = np.concatenate([g for _, g in setup["held_seqs"]])
    assert section["tokens"] == len(actual)
    plan = read_plan(setup["plan"])
    pinned = plan.matrix("resident_pages") > 0
    quotas = plan_quotas(plan)[0]
    assert pinned.any() and (~pinned).any() and quotas.any()
    order = [m * EXPERTS + e for s in range(len(actual)) for m in range(len(LAYERS))
             for e in sorted(actual[s, m]) if not pinned[m, e]]  # as the runtime serves them
    pooled = section["pooled"]
    assert pooled == plan.cache_params["pooled"]
    keys = [order] if pooled else [[k for k in order if k // EXPERTS == m]
                                   for m in range(len(LAYERS))]
    slots = [int(quotas.sum())] if pooled else quotas.tolist()
    bound = sum(len(k) - int(_min_hits(np.array(k, np.int64), n, len(LAYERS) * EXPERTS).sum())
                for k, n in zip(keys, slots, strict=True))
    lines = section["lines"]
    assert lines["belady"]["misses"] == bound
    cold = sum(len(k) for k in keys)
    for name in ("lru", "belady"):
        assert lines[name]["hits"] + lines[name]["misses"] == cold
        assert lines[name]["prefetched"] == 0
    for name in ("lru+prefetch", "belady+prefetch"):
        line = lines[name]
        assert line["prefetched"] > 0
        assert line["useful"] + line["late"] + line["wasted"] == line["prefetched"]
        assert line["hits"] + line["misses"] + line["useful"] + line["late"] == cold
    right = [sum(len(set(actual[s, m]) & set(guess[s, m])) for s in range(len(actual)))
             for m in range(len(LAYERS))]
    assert section["recall"][0] == {"layer": 0, "share": None}
    for m in (1, 2):
        assert section["recall"][m]["share"] == right[m] / (len(actual) * TOP_K)
        assert section["precision"][m]["share"] == right[m] / (len(actual) * TOP_K)
    assert section["window_ms"] == pytest.approx(0.5 / 3)


def test_traces_without_speculative_routing_add_no_section(setup, cli):
    report = json.loads(cli("evaluate", setup["plan"], "--traces", setup["calib"],
                            "--json").output)
    assert report["prefetch"] == []
    assert not [n for n in report["notes"] if "prefetch" in n]


def test_the_prefetch_lines_are_printed_with_their_counts(setup, cli):
    """The text report shows what --json holds: each line's counts and stall, and the
    recall by layer (the section was in --json only)."""
    report = json.loads(cli("evaluate", setup["plan"], "--traces", setup["held"],
                            "--json").output)
    [section] = report["prefetch"]
    text = " ".join(cli("evaluate", setup["plan"], "--traces", setup["held"],
                        "--verbose").output.split())
    for name, f in section["lines"].items():
        row = " ".join(str(f[k]) for k in ("hits", "misses", "prefetched", "useful", "late",
                                           "wasted"))
        assert f"{name} {row} {f['stall_ms_per_token']:.4f}" in " ".join(
            text.replace("│", " ").split()), name
    first = section["recall"][1]
    assert "recall of the speculative selection by layer:" in text
    assert f"{first['layer']}: {first['share']:.2f}" in text
    # the default summary says the section exists: its stall without and with prefetch
    summary = " ".join(cli("evaluate", setup["plan"], "--traces", setup["held"]).output.split())
    lru, pre = (section["lines"][n]["stall_ms_per_token"] for n in ("lru", "lru+prefetch"))
    assert (f"stall {lru:.4f} ms/token with LRU, {pre:.4f} with prefetch (the section: the "
            "full tables)") in summary, summary
