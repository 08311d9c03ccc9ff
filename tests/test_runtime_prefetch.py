"""The runtime's prefetch (placer/runtime/prefetch.py) on a tiny random-init model: the same
tokens and logits with prefetch on and off, and counters equal to the prefetch replay's
(solvers/cache/prefetch.py) of the routing and speculative routing `collect`'s own capture
records of the same run, on the CPU."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from placed_plans import cached_plan
from test_runtime_tables import generate_logits

from placer.checkpoint.inventory import read_inventory
from placer.plan.placement import plan_quotas, read_plan
from placer.runtime.loader import load_placed
from placer.runtime.patch import load_staged_model
from placer.runtime.prefetch import run_prefetch
from solvers.cache.prefetch import NONE, Counts, Link, Prefetch, replay
from traces.collecting.capture import RouterCapture

pytest_plugins = ["fixtures_models"]

NEW_TOKENS = 16  # one prefill forward, then 15 decode steps of one token


@pytest.fixture(scope="module", params=[False, True], ids=["per-layer", "pooled"])
def placed(request, trace_models, tmp_path_factory, cli) -> tuple[Path, Path]:
    """(checkpoint, placed dir): qwen3_moe, every third expert pinned, the rest cold on two
    cards with 1-3 LRU slots per MoE layer, or their sum pooled (placed_plans.cached_plan)."""
    checkpoint = trace_models["qwen3_moe"]
    out = tmp_path_factory.mktemp("prefetch")
    largest_layer = int(read_inventory(checkpoint).expert_bytes().sum(axis=1).max())
    cli("emit", "--plan", cached_plan(checkpoint, out, "lru", largest_layer, request.param),
        "--model", checkpoint, "--out", out / "placed")
    return checkpoint, out / "placed"


def run(checkpoint: Path, placed: Path, prefetch: Prefetch | None, link: Link | None = None,
        cache_slots: int | None = None):
    """Greedy tokens, logits, the runtime and the routing collect's capture recorded."""
    runtime = load_placed(placed, device="cpu", cache_slots=cache_slots, prefetch=prefetch,
                          link=link)
    model = load_staged_model(checkpoint, runtime)
    with RouterCapture(model, weights=False, speculative=True) as capture:
        tokens, logits = generate_logits(model, checkpoint, NEW_TOKENS)
        routing = capture.take()
    return tokens, logits, runtime, routing


def steps(routing, num_experts: int) -> tuple[np.ndarray, np.ndarray]:
    """(actual, predicted) [S, L, E] of the forwards, one step each: the distinct experts a
    forward selected at each MoE layer (a prefill's many tokens: one step that needs them
    all), and the speculative selection of a one-token forward (none for a prefill: the
    runtime prefetches for decode at batch 1 only), NONE-padded."""
    layers = routing[0].experts.shape[0]
    actual = np.full((len(routing), layers, num_experts), NONE)
    predicted = np.full_like(actual, NONE)
    for s, r in enumerate(routing):
        for m in range(layers):
            chosen = np.unique(r.experts[m])
            actual[s, m, :chosen.size] = chosen
            if r.experts.shape[1] == 1:
                predicted[s, m, :r.speculative.shape[2]] = r.speculative[m, 0]
    return actual, predicted


def replayed(placed: Path, routing, prefetch: Prefetch, link: Link,
             cache_slots: int | None) -> Counts:
    """The replay of `routing` through each card's slots (its experts: those homed there and
    not pinned; pooled as the plan pools them), summed over the cards."""
    plan = read_plan(placed)
    actual, predicted = steps(routing, plan.experts_per_layer)
    resident = plan.matrix("resident_pages") > 0
    home = plan.matrix("card")
    total = Counts()
    for card, quotas in enumerate(plan_quotas(plan, cache_slots)):
        slots = int(quotas.sum()) if plan.cache_params["pooled"] else quotas
        got = replay(actual, predicted, slots, link, prefetch,
                     pinned=resident | (home != card), eviction="lru")
        total = Counts(**{f: getattr(total, f) + getattr(got, f) for f in vars(total)})
    return total


@pytest.mark.parametrize(("prefetch", "window_s", "cache_slots"), [
    (Prefetch(slot_share=1.0), 1.5, 3), (Prefetch(max_per_layer=1), 0.5, None)])
def test_counters_are_the_replays_and_tokens_do_not_change(placed, prefetch, window_s,
                                                           cache_slots):
    """Prefetch on: the tokens and every step's logits equal those of the same run with
    prefetch off (prefetched experts were computed from the slots they were copied into);
    the counters equal, exactly, the replay of the routing and speculative routing that
    collect's capture recorded of this run, each card's slots replayed on their own. A copy
    takes 1, a window 1.5 (a lone prefetch lands in time) or 0.5 (every one is late)."""
    checkpoint, placed_dir = placed
    sizes = read_plan(placed_dir).matrix("bytes")
    assert (sizes == sizes.max()).all()  # one size: the replay's copies are all that size
    link = Link(copy_s=1.0, window_s=window_s, expert_bytes=int(sizes.max()))
    tokens, logits, runtime, routing = run(checkpoint, placed_dir, prefetch, link, cache_slots)
    plain_tokens, plain_logits, plain, _ = run(checkpoint, placed_dir, None,
                                               cache_slots=cache_slots)
    assert torch.equal(tokens, plain_tokens) and torch.equal(logits, plain_logits)
    counters = runtime.counters
    got = counters.prefetch_counts()
    want = replayed(placed_dir, routing, prefetch, link, cache_slots)
    assert dataclasses.replace(got, stall_s=0.0) == dataclasses.replace(want, stall_s=0.0)
    assert got.stall_s == pytest.approx(want.stall_s, rel=1e-12)
    # not a vacuous equality: prefetches used (in time, or late), wasted ones, demand hits
    assert (got.useful if window_s > 1.0 else got.late) > 0
    assert got.wasted > 0 and got.hits > 0
    # what was copied is what was counted: demand copies are the misses, prefetch copies
    # are the prefetches, and an expert found in the cache (prefetched or not) was a hit
    assert counters.copies.sum() == got.misses
    assert counters.ahead_bytes.sum() == got.prefetched * sizes.max()
    assert counters.hits.sum() == got.hits + got.useful + got.late
    # a prefetch saves a demand copy: the same selections cost more copies without
    assert plain.counters.copies.sum() > got.misses
    assert counters.late_measured.sum() == 0  # a CPU device measures no landing


@pytest.mark.parametrize("placed", [False], indirect=True, ids=["per-layer"])
def test_run_prefetch_reports_what_it_prefetched(placed, cli):
    """`placer run --prefetch --json`: the same text as without, a prefetch section whose
    counts add up (every prefetch was useful, late or wasted; its bytes copied), on the plan's
    own clock; without --prefetch there is no such section."""
    checkpoint, placed_dir = placed
    args = ("run", placed_dir, "--model", checkpoint, "--prompt", "To be, or not to be",
            "--max-new-tokens", "6", "--device", "cpu", "--json")
    on = json.loads(cli(*args, "--prefetch").stdout)
    off = json.loads(cli(*args).stdout)
    assert on["text"] == off["text"]
    assert "prefetch" not in off["staging"]
    ahead = on["staging"]["prefetch"]
    assert ahead["prefetched"] > 0 and ahead["prefetch_bytes"] > 0
    assert ahead["prefetched"] == ahead["useful"] + ahead["late"] + ahead["wasted"]
    assert ahead["staged_bytes"] == on["staging"]["total"]["bytes"] + ahead["prefetch_bytes"]
    assert on["cache_policy"] == "lru"
    text = cli(*args[:-1], "--prefetch").stdout
    assert f"prefetch: {ahead['prefetched']} experts copied ahead" in text
    assert "prefetch:" not in cli(*args[:-1]).stdout


@pytest.mark.parametrize("placed", [False], indirect=True, ids=["per-layer"])
def test_a_run_prefetches_as_the_plan_decided_unless_told(placed):
    """run_prefetch: with no --prefetch/--no-prefetch a run does what the plan's `prefetch`
    says (an older plan, none: off), with the plan's parameters; either option overrides it."""
    plan = read_plan(placed[1])
    solved = {"on": True, "reason": "pays", "depth": 1, "max_per_layer": 2,
              "slot_share": 0.25, "eviction": "lru", "predicted": None}
    on = dataclasses.replace(plan, prefetch=solved)
    off = dataclasses.replace(plan, prefetch={**solved, "on": False})
    assert run_prefetch(on, None) == Prefetch(max_per_layer=2, slot_share=0.25)
    assert run_prefetch(on, False) is None
    assert run_prefetch(off, None) is None
    assert run_prefetch(off, True) == Prefetch(max_per_layer=2, slot_share=0.25)
    assert run_prefetch(dataclasses.replace(plan, prefetch=None), None) is None
    assert run_prefetch(dataclasses.replace(plan, prefetch=None), True) == Prefetch()
