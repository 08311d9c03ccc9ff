"""`placer solve --engine llamacpp` and what it stands on: the cost of a llama.cpp setup
(solvers/llamacpp/cost.py) worked by hand on a tiny machine, and the planner end to end on
gpt-oss-20b's decode routing (skipped where ../shared is absent)."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from llamacpp_boxes import write_one_card_spec
from real_routing import GPTOSS, routing_trace
from typer.testing import CliRunner

from placer.cli import app
from placer.errors import PlacerError
from placer.exporters.llamacpp import server_command
from placer.plan.llamacpp import n_cpu_moe, plan_build
from placer.plan.placement import read_plan
from solvers.cpu import Host
from solvers.llamacpp.builds import parse_build
from solvers.llamacpp.cost import Machine, Setup, judge, step_costs

MS = 1e-3


def tiny(offload_min_batch: int = 32) -> Machine:
    """2 MoE layers x 4 experts of 1000 bytes (two expert tensors of 500), top-1; a card
    that holds one layer; copies at 1 MB/s and 0.1 ms each; a CPU that streams 1 MB/s
    (1 ms an expert), 1 ms per layer hand-off, no activation traffic."""
    host = Host(memory_bandwidth=1e6, flops=1e15, sync_s=MS, activation_bytes=0.0,
                h2d_bandwidth=1e6, offload_min_batch=offload_min_batch)
    return Machine(np.full((2, 4), 1000), np.ones((2, 4)), (("a", (500, 500)),) * 2, 1,
                   4000, 1e6, 0.1 * MS, 1, host)


def steps(*per_step: list[int]) -> np.ndarray:
    """[S, B, 2, 1] tokens: each step's tokens select the given expert at layer 0, expert 0
    at layer 1 (-1: no token)."""
    batch = max(len(s) for s in per_step)
    out = np.full((len(per_step), batch, 2, 1), -1)
    for s, experts in enumerate(per_step):
        for b, e in enumerate(experts):
            out[s, b] = [[e], [0]]
    return out


def test_host_layers_run_on_the_cpu_without_the_cache():
    host0 = Setup("cpu", np.array([True, False]))
    fields = step_costs(tiny(), host0, steps([2], [1, 1]))
    # one expert on the CPU (1 ms) + the hand-off (1 ms); the GPU layer is free
    assert fields[:, 0].tolist() == pytest.approx([2 * MS, 2 * MS])
    assert fields[:, 1].tolist() == [1000, 1000]   # bytes the CPU reads
    assert fields[:, 3].tolist() == [2000, 2000]   # selected bytes, both layers


def test_cached_fetches_pay_the_sync_and_their_misses_only():
    cached = Setup("cache", np.array([True, False]), cache_mib=1, slots=(2,))
    fields = step_costs(tiny(), cached, steps([0], [1], [0]))
    # a miss: sync 1 ms + 1 run x 2 tensors x 0.1 ms + 1000 bytes at 1 MB/s; a hit: sync
    assert fields[:, 0].tolist() == pytest.approx([2.2 * MS, 2.2 * MS, 1 * MS])
    assert fields[:, 2].tolist() == [1, 1, 0]


def test_an_op_offloaded_step_takes_the_experts_the_cache_holds_from_its_banks():
    machine = tiny(offload_min_batch=2)
    cached = Setup("cache", np.array([True, False]), cache_mib=1, slots=(1,))
    # step 1 has 2 tokens: min(2 x 1, 4) > 1 slot, so the cache is only read; the GPU
    # computes it (2 >= offload_min_batch) after copying expert 3 (expert 0 is in the bank)
    fields = step_costs(machine, cached, steps([0], [0, 3]))
    assert fields[1, 0] == pytest.approx(1 * MS)
    plain = step_costs(machine, Setup("cpu", cached.host), steps([0], [0, 3]))
    assert plain[1, 0] == pytest.approx(2 * MS)


def test_judge_pairs_the_setups():
    machine = tiny()
    tokens = steps(*([[e % 4] for e in range(12)]))
    seqs = np.repeat(np.arange(6), 2)[:, None]
    a = Setup("a", np.array([True, False]))
    judged = judge(machine, [a, dataclasses.replace(a, name="b")], tokens, seqs, 10 * MS,
                   replicates=50)
    assert judged.ratio("a", "b") == (1.0, [1.0, 1.0])
    assert judged.figures["a"]["stall_ms_per_step"] == pytest.approx(2.0)


def test_n_cpu_moe_only_for_leading_layers():
    assert n_cpu_moe([0, 1, 2]) == 3
    assert n_cpu_moe([1, 2]) is None and n_cpu_moe([]) is None


needs_routing = pytest.mark.skipif(not GPTOSS.is_dir(), reason="../shared routing absent")


def solve(tmp_path, hardware: str, calib, *extra: str) -> tuple[dict, str]:
    out = tmp_path / f"{hardware}.json"
    result = CliRunner().invoke(app, [
        "solve", "--engine", "llamacpp", "--config", str(GPTOSS / "config.json"),
        "--expert-dtype", "mxfp4", "--hardware", hardware, "--traces", str(calib),
        "--concurrency", "1,8", "--out", str(out), *extra])
    assert result.exit_code == 0, result.output
    return json.loads(out.read_text()), result.output


@needs_routing
def test_gptoss_slow_8gb_card_keeps_the_cache_off(tmp_path):
    # b11669's LRU, no CPU share: at 3.5 GB/s every miss uploaded costs more than the CPU
    # (with b12191's CPU share 0.98 the cache wins there: tests/test_llamacpp_tuner.py)
    calib = routing_trace(GPTOSS, "mmlu_dev", tmp_path / "calib", 5000)
    held = routing_trace(GPTOSS, "mmlu_dev", tmp_path / "held", 2000, first_sequence=60)
    plan, output = solve(tmp_path, "1x-8gb-pcie3x4", calib, "--llamacpp-version", "b11669",
                         "--verbose")
    engine = plan["engine"]
    assert "-ncmoe ┃" in output and "] │" in output  # the options with their intervals
    assert "10-19," in output and "21-23" in output  # host layers as runs of layers
    assert max(len(x) for x in output.splitlines() if "│" in x or "┃" in x) <= 100
    assert engine["moe_cache_mib"] == 0 and "the cache loses" in output
    names = [o["name"] for o in engine["options"]]
    assert {"chosen", "no cache", "ncmoe", "cmoe + cache"} <= set(names)
    for row in plan["predicted"]:  # every option replayed, the cached ones included
        assert set(row["options"]) == set(names)
        assert row["options"]["ncmoe"]["ratio_to_ncmoe"] == 1.0
    runner = CliRunner()
    path = tmp_path / "1x-8gb-pcie3x4.json"
    # solved from a config: the command with a named placeholder and what the GGUF must match
    placeholder = runner.invoke(app, ["export", "llamacpp", str(path)])
    assert placeholder.exit_code == 0, placeholder.output
    assert "# MODEL.gguf: your GGUF of this model, with 24 MoE layers" in placeholder.output
    assert placeholder.output.strip().splitlines()[-1].startswith("llama-server -m MODEL.gguf ")
    plan["engine"]["gguf"] = "model.gguf"
    path.write_text(json.dumps(plan))
    command = runner.invoke(app, ["export", "llamacpp", str(path)])
    assert command.exit_code == 0, command.output
    comment = next(x for x in command.output.splitlines() if x.startswith("# predicted"))
    assert comment.startswith("# predicted for llama.cpp b11669 (") and "assumed" not in comment
    line = command.output.strip().splitlines()[-1]
    assert line.startswith("llama-server -m model.gguf -ngl all ")
    assert "--moe-cache-mib" not in line
    # -c: the longest context whose f16 K and V fit the 1x-8gb-pcie3x4 preset's reserved KV:
    # gpt-oss-20b's 12 full-attention layers hold every cell, its 12 sliding ones (window
    # 128) 128 x 4 sequences + a 512-token ubatch = 1024 cells; each cell 8 KV heads x 64 x
    # 2 (K and V) x 2 bytes
    config = json.loads((GPTOSS / "config.json").read_text())
    kinds = config["layer_types"]
    cell = config["num_key_value_heads"] * config["head_dim"] * 2 * 2
    full, sliding = kinds.count("full_attention"), kinds.count("sliding_attention")
    assert (full, sliding, config["sliding_window"]) == (12, 12, 128)
    from placer.hardware.spec import load_spec
    kv = load_spec("1x-8gb-pcie3x4").cards[0].reserved_kv
    assert engine["context"] == (kv - sliding * 1024 * cell) // (full * cell) // 256 * 256 > 0
    assert line.endswith(f" -c {engine['context']}")
    layers = "|".join(map(str, engine["host_layers"]))
    assert (f"-ncmoe {engine['n_cpu_moe']}" in line if engine["n_cpu_moe"]
            else f"blk\\.({layers})\\." in line)
    report = runner.invoke(app, ["evaluate", str(tmp_path / "1x-8gb-pcie3x4.json"),
                                 "--traces", str(held), "--json"])
    assert report.exit_code == 0, report.output
    rows = json.loads(report.output)["results"]
    assert len(json.loads(report.output)["drift"]) == 1  # against the plan's calibration
    assert [(r["concurrency"], r["execution"]) for r in rows] == [(1, "llamacpp"),
                                                                 (8, "llamacpp")]
    assert all({"placement", "layer", "nocache", "ratio_to_layer_ci95"} <= set(r) for r in rows)


@needs_routing
def test_gptoss_12gb_card_plan_exports_its_cache_and_is_checked(tmp_path):
    calib = routing_trace(GPTOSS, "mmlu_dev", tmp_path / "calib", 2500)
    plan, _ = solve(tmp_path, "1x-12gb-pcie4", calib)
    path = tmp_path / "1x-12gb-pcie4.json"
    engine = plan["engine"]
    build = parse_build("b11669")
    line = server_command(read_plan(path), plan_build(read_plan(path)))
    assert (f"--moe-cache-mib {engine['moe_cache_mib']}" in line) == (engine["moe_cache_mib"]
                                                                      > 0)
    assert (f"--moe-cache-cpu-share {engine['cpu_share']:g}" in line) == (engine["cpu_share"]
                                                                          > 0)
    if engine["cpu_share"]:  # b11669 has no --moe-cache-cpu-share: refused, naming it
        with pytest.raises(PlacerError, match="b11669"):
            server_command(read_plan(path), build)
    leading = dataclasses.replace(read_plan(path), engine={
        **engine, "host_layers": [0, 1, 2], "n_cpu_moe": 3, "moe_cache_mib": 100,
        "slots": [9], "pinned": False, "cpu_share": 0.0, "context": None})
    assert server_command(leading, build, "m.gguf") == (
        "llama-server -m m.gguf -ngl all -ncmoe 3 --moe-cache-mib 100")
    gpu = next(e for e in plan["experts"] if e["layer"] not in engine["host_layers"])
    gpu["resident_bytes"], gpu["pages"][0]["resident"] = 0, False
    plan["cards"][0]["resident_bytes"] -= gpu["bytes"]
    path.write_text(json.dumps(plan))
    bad = CliRunner().invoke(app, ["export", "llamacpp", str(path)])
    assert bad.exit_code == 1
    assert bad.output.startswith(f"error: {path}: experts[") and "GPU layer" in bad.output


def test_a_gguf_plans_with_its_own_expert_tensors(tmp_path):
    from gguf import GGMLQuantizationType as T
    from gguf_files import row_bytes, write_moe_gguf

    from placer.checkpoint.inventory import read_inventory
    from placer.plan.llamacpp import expert_layout

    model = tmp_path / "tiny.gguf"
    write_moe_gguf(model, layers=4, experts=4, top_k=2, hidden=256, ff=512, biases=True)
    # one expert of each fused tensor: gate and up are ff rows of hidden, down hidden rows
    # of ff (Q4_K, Q6_K, Q8_0); the biases are not the cache's
    nb2 = (512 * row_bytes(T.Q4_K, 256), 512 * row_bytes(T.Q6_K, 256),
           256 * row_bytes(T.Q8_0, 512))
    layout = expert_layout(read_inventory(model))
    assert [n for _, n in layout] == [nb2] * 4 and len({k for k, _ in layout}) == 1
    rng = np.random.default_rng(0)
    ids = np.stack([rng.permutation(4)[:2] for _ in range(600 * 4)]).reshape(600, 4, 2)
    np.savez(tmp_path / "t.npz", expert_ids=ids.astype(np.int16),
             seq_lens=np.full(12, 50, dtype=np.int64))
    runner = CliRunner()
    done = runner.invoke(app, ["traces", "import", str(tmp_path / "t.npz"), "--format", "tokens",
                               "--model", str(model), "--out", str(tmp_path / "tr")])
    assert done.exit_code == 0, done.output
    expert = sum(nb2)
    # room for the experts of 2 of the 4 layers
    spec = write_one_card_spec(tmp_path / "box.toml", 8 * expert + 1000)
    plan = tmp_path / "plan.json"
    done = runner.invoke(app, ["solve", "--engine", "llamacpp", "--model", str(model),
                               "--hardware", str(spec), "--traces", str(tmp_path / "tr"),
                               "--concurrency", "1,4", "--out", str(plan)])
    assert done.exit_code == 0, done.output
    engine = json.loads(plan.read_text())["engine"]
    assert engine["layouts"][0][1] == list(nb2) and len(engine["host_layers"]) >= 2
    line = runner.invoke(app, ["export", "llamacpp", str(plan), "--model", str(model)])
    flags = (["-ncmoe", str(engine["n_cpu_moe"])] if engine["n_cpu_moe"] else
             ["-ot", "blk\\.(" + "|".join(map(str, engine["host_layers"]))
              + ")\\.ffn_(up|down|gate|gate_up)_(ch|)exps=CPU"])
    flags += ["--moe-cache-mib", str(engine["moe_cache_mib"])] if engine["moe_cache_mib"] else []
    flags += ["--moe-cache-cpu-share", f"{engine['cpu_share']:g}"] if engine["cpu_share"] else []
    flags += ["-lm", "none"] if engine["pinned"] else []
    assert line.output.strip().splitlines()[-1].split() == [
        "llama-server", "-m", str(model), "-ngl", "all",
        *[f"'{f}'" if "|" in f else f for f in flags]]
    # the plan remembers its GGUF: -m without --model is the same
    again = runner.invoke(app, ["export", "llamacpp", str(plan)])
    assert again.output.strip().splitlines()[-1] == line.output.strip().splitlines()[-1]


@needs_routing
def test_emit_refuses_a_llamacpp_plan(tmp_path):
    calib = routing_trace(GPTOSS, "mmlu_dev", tmp_path / "calib", 2500)
    solve(tmp_path, "1x-8gb-pcie3x4", calib)
    out = CliRunner().invoke(app, ["emit", "--plan", str(tmp_path / "1x-8gb-pcie3x4.json"),
                                   "--model", str(tmp_path / "model"),
                                   "--out", str(tmp_path / "placed")])
    assert out.exit_code == 1 and "--engine llamacpp" in out.output
    assert not (tmp_path / "placed").exists()


def test_options_of_placers_runtime_are_refused(tmp_path):
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "qwen3_moe", "num_hidden_layers": 2,
                                  "hidden_size": 64, "moe_intermediate_size": 32,
                                  "num_experts": 4, "num_experts_per_tok": 2,
                                  "intermediate_size": 64, "vocab_size": 100,
                                  "num_attention_heads": 2, "num_key_value_heads": 2}))
    for extra in (["--robust"], ["--page-size", "1KiB"], ["--cache", "4"], ["--ep", "balanced"]):
        out = CliRunner().invoke(app, ["solve", "--engine", "llamacpp", "--config", str(config),
                                       "--hardware", "1x-12gb-pcie4",
                                       "--traces", str(tmp_path / "traces"),
                                       "--out", str(tmp_path / "p.json"), *extra])
        assert out.exit_code == 1 and out.output.startswith(f"error: {extra[0]} is for placer"), \
            out.output


def mib_machine(bandwidth: float) -> Machine:
    """2 layers x 4 experts of 1 MiB (two tensors of 512 KiB), top-1; room for one layer's
    experts and 1 KiB; a CPU that takes 10.5 ms an expert (1 MiB at 100 MB/s) plus 1 ms."""
    host = Host(memory_bandwidth=1e8, flops=1e15, sync_s=MS, activation_bytes=0.0,
                h2d_bandwidth=bandwidth, offload_min_batch=32)
    return Machine(np.full((2, 4), 1 << 20), np.ones((2, 4)), (("a", (1 << 19,) * 2),) * 2, 1,
                   (4 << 20) + 1024, bandwidth, 0.0, 1, host)


def test_the_search_takes_the_cache_where_it_hits_and_not_where_it_thrashes():
    from solvers.llamacpp.search import Candidate, Scenario, search

    def scenario(experts):
        tokens = np.array(experts).reshape(-1, 1, 1, 1).repeat(2, axis=2)  # both layers
        return Scenario("s", tokens, np.zeros((len(tokens), 1), dtype=np.int64),
                        [(tokens, tokens)], 1.0, 10 * MS)

    # one expert again and again: both layers on the host (every layer: ranked "ncmoe")
    # with 3/4 of the 4 MiB they free as cache (the tuner grid's size; 3 MiB hit as all 4
    # do, and the smaller cache wins the tie) pay the sync only, 2 ms a step, against
    # 11.5 ms for one layer on the CPU
    found = search(mib_machine(1e9), [scenario([0] * 50)])
    # pinned: its first miss uploads faster than from mmap'd memory
    assert found.best == Candidate("ncmoe", 2, 0.75, 0.0, True)
    assert found.scores[found.best] == found.scores[Candidate("ncmoe", 2, 1.0, 0.0, True)]
    assert found.scores[Candidate("ncmoe", 2, 0.25)] is None  # 1 MiB: no slot, refused
    # experts 0 1 2 3 in turn: 3 slots shared by 2 layers miss every time; at 1 MB/s a
    # miss costs a second, so no cache (one host layer on the CPU)
    cycled = search(mib_machine(1e6), [scenario([0, 1, 2, 3] * 12)])
    assert cycled.best.share == 0 and cycled.best.count == 1
