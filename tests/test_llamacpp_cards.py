"""`placer solve --engine llamacpp` over several GPUs: the layer -> GPU assignment of
`-ngl all -ts a,b,...` worked by hand from llama.cpp's arithmetic (solvers.llamacpp.
layer_devices), each card's fit, cache share and link on a tiny machine, and a 2-card plan
end to end on gpt-oss-20b's decode routing (skipped where ../shared is absent)."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from real_routing import GPTOSS, routing_trace
from test_llamacpp_plan import MS, needs_routing, solve
from typer.testing import CliRunner

from placer.cli import app
from placer.exporters.llamacpp import server_command
from placer.plan.llamacpp import plan_build
from placer.plan.placement import read_plan
from solvers.cpu import Host
from solvers.llamacpp.cost import MIB, Machine, Setup, layer_devices, step_costs, with_cache
from solvers.llamacpp.search import fewest_host, fit_first


@pytest.mark.parametrize(("n_layer", "split", "expected"), [
    # points 0.5, 1; il / 25 < 0.5 up to il = 12; the output layer (il = 24) on card 1
    (24, [1, 1], [0] * 13 + [1] * 12),
    # points 0.75, 1; il / 25 >= 0.75 from il = 19 (18.75)
    (24, [3, 1], [0] * 19 + [1] * 6),
    # il / 4 = 0.5 for il = 2 equals the point: upper_bound goes past it, to card 1
    (3, [1, 1], [0, 0, 1, 1]),
    # in float, 1/3 and 2/3 are exactly the points 1/3 and 2/3, so layer 1 goes to card 1
    # and the output layer to card 2 (in double, 1/3 < float(1/3) would keep layer 1 on 0)
    (2, [1, 1, 1], [0, 1, 2]),
    # a card with no share gets no layer
    (5, [0, 1], [1] * 6),
    (4, [1, 0, 1], [0, 0, 0, 2, 2]),
])
def test_layers_go_to_the_cards_as_llama_cpp_splits_them(n_layer, split, expected):
    assert layer_devices(n_layer, split).tolist() == expected


def two_cards(capacity: tuple[int, int] = (4000, 4000)) -> Machine:
    """2 MoE layers x 4 experts of 1000 bytes (two tensors of 500), top-1, layer 0 on card 0
    and layer 1 on card 1 (-ts 1,1); card 1's link half as fast (1 MB/s, 0.5 MB/s), no
    per-copy latency; a CPU that streams 1 MB/s (1 ms an expert), 1 ms per layer hand-off."""
    host = Host(memory_bandwidth=1e6, flops=1e15, sync_s=MS, activation_bytes=0.0,
                h2d_bandwidth=1e6, offload_min_batch=32)
    return Machine(np.full((2, 4), 1000), np.ones((2, 4)), (("a", (500, 500)),) * 2, 1,
                   capacity, (1e6, 5e5), (0.0, 0.0), 1, host, (0, 1), (1.0, 1.0))


def test_each_card_fits_its_own_layers():
    machine = two_cards((4000, 0))  # card 1 holds nothing: layer 1 must go to the host
    assert fewest_host(machine, np.array([1, 0])) == 1
    assert fewest_host(machine, np.array([0, 1])) == 2  # layer 0 first frees the wrong card
    assert fewest_host(two_cards((8000, 0)), np.array([0, 1])) == 2  # not a shared pool
    # a ranking puts first what each card must give up, then goes on in its order
    assert fit_first(machine, np.array([0, 1])).tolist() == [1, 0]
    assert fit_first(two_cards(), np.array([0, 1])).tolist() == [0, 1]


def test_the_cache_splits_by_ts_and_each_card_fetches_over_its_own_link():
    machine = two_cards((3 * MIB, MIB))
    both = np.array([True, True])
    # each card gets half of the cache: card 1's 1 MiB room bounds it to 2 MiB in all
    assert machine.bank_room(both) == 2 * MIB
    # layer 0 on card 0's GPU: only card 1 caches, and takes all of it
    assert machine.bank_room(np.array([False, True])) == MIB
    cached = with_cache(machine, "c", both, 1)
    assert cached.slots == (4, 4)  # one group per card, 512 KiB each: all 4 experts fit
    tokens = np.array([[[[0], [0]]], [[[0], [0]]]])  # 2 steps, expert 0 at both layers
    fields = step_costs(machine, cached, tokens)
    # step 0 misses at both: sync + 1000 B at 1 MB/s (card 0) and at 0.5 MB/s (card 1)
    assert fields[:, 0] == pytest.approx([(1 + 1) * MS + (1 + 2) * MS, 2 * MS])
    # without the cache the one CPU computes both cards' host layers: 2 ms each
    plain = step_costs(machine, Setup("cpu", both), tokens)
    assert plain[:, 0] == pytest.approx([4 * MS, 4 * MS])


@needs_routing
def test_two_cards_plan_exports_ts_and_overrides_and_evaluates(tmp_path):
    calib = routing_trace(GPTOSS, "mmlu_dev", tmp_path / "calib", 3000)
    held = routing_trace(GPTOSS, "mmlu_dev", tmp_path / "held", 2000, first_sequence=60)
    plan, output = solve(tmp_path, "2x-8gb-pcie4", calib)
    path = tmp_path / "2x-8gb-pcie4.json"
    engine = plan["engine"]
    assert engine["tensor_split"] == [1.0, 1.0]  # two cards with the same free VRAM
    assert engine["devices"] == layer_devices(24, [1, 1])[:24].tolist()
    free = 4 << 30  # 8 GiB less 4 GiB reserved, per card
    assert [c["budget_bytes"] for c in plan["cards"]] == [free, free]
    for card in (0, 1):  # each card holds the experts of its own GPU layers only
        gpu = [layer for layer, d in enumerate(engine["devices"])
               if d == card and layer not in engine["host_layers"]]
        assert plan["cards"][card]["resident_bytes"] == sum(
            e["bytes"] for e in plan["experts"] if e["layer"] in gpu)
    runner = CliRunner()
    plan["engine"]["gguf"] = "model.gguf"
    path.write_text(json.dumps(plan))
    command = runner.invoke(app, ["export", "llamacpp", str(path)])
    assert command.exit_code == 0, command.output
    assert command.output.strip().splitlines()[-1].startswith(
        "llama-server -m model.gguf -ngl all -ts 1,1 ")
    assert "# card 0 (-ts 1): MoE layers [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]" in (
        command.output)
    # the best host set without the cache, as exported: its layers named in -ot
    option = next(o for o in engine["options"] if o["name"] == "no cache")
    spread = dataclasses.replace(read_plan(path),
                                 engine={**engine, **option, "name": "llamacpp"})
    layers = "|".join(map(str, option["host_layers"]))
    expected = (f"-ncmoe {option['n_cpu_moe']}" if option["n_cpu_moe"] is not None else
                f"-ot 'blk\\.({layers})\\.ffn_(up|down|gate|gate_up)_(ch|)exps=CPU'")
    expected += " -lm none" if option["pinned"] else ""
    expected += f" -c {engine['context']}" if engine["context"] else ""
    assert server_command(spread, plan_build(spread)) == (
        f"llama-server -m model.gguf -ngl all -ts 1,1 {expected}")
    report = runner.invoke(app, ["evaluate", str(path), "--traces", str(held), "--json"])
    assert report.exit_code == 0, report.output
    rows = json.loads(report.output)["results"]
    assert [(r["concurrency"], r["execution"]) for r in rows] == [(1, "llamacpp"),
                                                                 (8, "llamacpp")]
    # a cache whose -ts share overfills a card with host layers fails the plan check
    assert engine["moe_cache_mib"] > 0
    card = engine["devices"][engine["host_layers"][0]]
    room = free - plan["cards"][card]["resident_bytes"]
    plan["engine"]["moe_cache_mib"] = (2 * room >> 20) + 1
    path.write_text(json.dumps(plan))
    bad = runner.invoke(app, ["export", "llamacpp", str(path)])
    assert bad.exit_code == 1, bad.output
    assert bad.output.startswith(f"error: {path}: engine.moe_cache_mib") and (
        f"card {card}'s budget" in bad.output)


def test_a_card_copies_at_most_at_its_links_bandwidth():
    from placer.hardware.spec import load_spec, parse_spec
    from placer.plan.llamacpp import card_links

    two = load_spec("2x-8gb-pcie4")
    assert card_links(two) == ((25e9, 6.5e9), (10e-6, 15e-6))
    shared = parse_spec({"cards": 2, "card": {"vram": "8GiB", "h2d_bandwidth": "25GB/s"},
                         "link": [{"cards": [1], "bandwidth": "4GB/s"}],
                         "decode": {"base_step_ms": {"1": 9.0}}})
    assert card_links(shared)[0] == (25e9, 4e9)
