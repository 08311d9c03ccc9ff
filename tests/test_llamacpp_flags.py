"""`placer evaluate --engine llamacpp --flags '...'` (issue #52 item 4): a llama-server command
line parsed as llama.cpp parses it and predicted; the flags `placer export llamacpp` writes
for a plan's option predict exactly what the plan predicts for that option."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from cli_errors import assert_one_line_error
from llamacpp_tiny import one_card, solve, tiny_gguf, tiny_traces, two_card_plan
from typer.testing import CliRunner

from placer.cli import app
from placer.plan.llamacpp_flags import EXPS_REGEX, parse_flags

RATIOS = ("ratio_to_ncmoe", "ratio_to_ncmoe_ci95")


def run(*args: str):
    return CliRunner().invoke(app, [str(a) for a in args])


def run_json(*args: str) -> dict:
    done = run(*args, "--json")
    assert done.exit_code == 0, done.output
    return json.loads(done.stdout)


@pytest.fixture(scope="module")
def one(tmp_path_factory) -> dict:
    """A one-card plan whose options hold -ncmoe, -ot, -cmoe, a cache, a CPU share and
    pinned experts (room for 2.5 layers' experts)."""
    root = tmp_path_factory.mktemp("flags")
    model = tiny_gguf(root)
    traces = tiny_traces(root, model)
    spec = one_card(root, 2.5)
    plan, _ = solve(root, model, traces, spec)
    return {"plan": plan, "model": model, "traces": traces, "spec": spec,
            "json": json.loads(plan.read_text())}


def option_command(plan: Path, name: str) -> str:
    return run_json("export", "llamacpp", plan, "--option", name)["command"]


def options(plan_json: dict) -> list[str]:
    """Every option but the tuner grid's, and the tuner's pick."""
    engine = plan_json["engine"]
    return [o["name"] for o in engine["options"]
            if not o["tuner"] or o["name"] == engine["tuner_pick"]]


def plan_figures(plan_json: dict, name: str, batch: int = 1) -> dict:
    row = next(r for r in plan_json["predicted"] if r["concurrency"] == batch)
    return {k: v for k, v in row["options"][name].items() if k not in RATIOS}


def flag_figures(report: dict, line: str = "flags") -> dict:
    fig = report["results"][0]["lines"][line]
    return {k: v for k, v in fig.items() if not k.startswith("ratio_to_first")}


def test_the_plan_has_the_options_the_equality_test_needs(one) -> None:
    """The options below cover -ncmoe, -ot, -cmoe (or -ncmoe of every layer), a cache, a
    CPU share and -lm none: else the equality test would check less than it says."""
    commands = " ".join(option_command(one["plan"], n) for n in options(one["json"]))
    for flag in ("-ncmoe", "-ot", "--moe-cache-mib", "--moe-cache-cpu-share", "-lm none"):
        assert flag in commands, (flag, commands)


def test_each_options_exported_flags_predict_what_the_plan_predicts(one) -> None:
    """Solve's own prediction of every option (B=1: the steps evaluate replays too) equals
    `evaluate --flags` of that option's exported command line, figure for figure, both beside
    the plan and from the GGUF and the spec alone."""
    for name in options(one["json"]):
        command = option_command(one["plan"], name)
        beside = run_json("evaluate", one["plan"], "--flags", command, "--traces",
                          one["traces"], "--concurrency", "1")
        alone = run_json("evaluate", "--flags", command, "--model", one["model"],
                         "--hardware", one["spec"], "--traces", one["traces"])
        assert flag_figures(beside) == plan_figures(one["json"], name), (name, command)
        assert flag_figures(alone) == plan_figures(one["json"], name), (name, command)
        option = next(o for o in one["json"]["engine"]["options"] if o["name"] == name)
        line = alone["lines"][0]
        assert [line[k] for k in ("host_layers", "moe_cache_mib", "slots", "cpu_share",
                                  "pinned")] == [option[k] for k in (
                                      "host_layers", "moe_cache_mib", "slots", "cpu_share",
                                      "pinned")], name


def test_the_choices_flags_equal_evaluates_own_line_at_every_concurrency(one) -> None:
    """At B=4 (continuous batching, evaluate's orders) the chosen option's flags and the
    plan's choice beside them give the figures `evaluate PLAN` gives its placement."""
    command = option_command(one["plan"], "chosen")
    own = run_json("evaluate", one["plan"], "--traces", one["traces"], "--concurrency", "4")
    flags = run_json("evaluate", one["plan"], "--flags", command, "--traces", one["traces"],
                     "--concurrency", "4")
    placement = own["results"][0]["placement"]
    for line in ("plan's choice", "flags"):
        assert flag_figures(flags, line) == placement
    assert flags["results"][0]["lines"]["flags"]["ratio_to_first"] == 1.0


def test_two_cards_flags_with_ts_predict_what_the_plan_predicts(tmp_path) -> None:
    """-ngl all -ts a,b: each layer on the card llama.cpp gives it, the cache split by -ts."""
    plan, model, traces = two_card_plan(tmp_path)
    plan_json = json.loads(plan.read_text())
    assert plan_json["engine"]["tensor_split"]
    for name in options(plan_json):
        command = option_command(plan, name)
        assert "-ts" in command
        got = run_json("evaluate", plan, "--flags", command, "--traces", traces,
                       "--concurrency", "1")
        assert flag_figures(got) == plan_figures(plan_json, name), (name, command)


def test_flags_side_by_side_and_unmodelled_flags_named(one) -> None:
    first = "-ngl 99 -ncmoe 3 --moe-cache-mib 1 -ctk q8_0 -t 8 --port 8080 -fa on"
    second = "llama-server -m x.gguf --n_cpu_moe 4 --mystery-knob 7 --no-warmup"
    done = run("evaluate", one["plan"], "--flags", first, "--flags", second)
    assert done.exit_code == 0, done.output
    text = " ".join(done.output.split())
    for said in ("not modelled: --mystery-knob 7", "not modelled: --no-warmup",
                 "not modelled: -t 8", "-ctk q8_0: parsed, KV size from the spec's "
                 "reserved_kv", "does not change placement: --port 8080, -fa on",
                 "uniform routing", "flags 1", "flags 2"):
        assert said in text, said
    report = run_json("evaluate", one["plan"], "--flags", first, "--flags", second)
    lines = {line["name"]: line for line in report["lines"]}
    assert lines["flags 2"]["host_layers"] == [0, 1, 2, 3]  # --n_cpu_moe is --n-cpu-moe
    assert lines["flags 2"]["not_modelled"] == ["--mystery-knob 7", "--no-warmup"]
    assert lines["flags 1"]["not_modelled"] == ["-t 8 (the spec's [host] figures stand)"]
    assert report["routing"] == "uniform"
    assert list(report["results"][0]["lines"]) == ["plan's choice", "flags 1", "flags 2"]


@pytest.mark.parametrize(("flags", "needle"), [
    ("-ngl lots", "-ngl"), ("-ncmoe -1", "-ncmoe"), ("--moe-cache-mib 4GiB", "--moe-cache-mib"),
    ("--moe-cache-cpu-share 1.5", "--moe-cache-cpu-share"), ("-ctk q3_k", "-ctk"),
    ("-ot blk.0", "-ot"), ("-ot 'blk.(0=CPU'", "-ot"), ("-ot x=GPUX", "-ot"),
    ("-ot exps=CUDA1", "-ot"),
    ("-ts a,b", "-ts"), ("-lm always", "-lm"), ("-ub 0", "-ub"), ("-c", "-c"),
    ("-ts 1,1,1", "-ts"), ("--n-cpu-moe 2 --moe-cache-mib 1 -ngl 3", "-ngl"),
    ("-ot 'blk\\.0\\.ffn_up_exps=CPU'", "-ot"),
    ("--ctx-size=4096", "--ctx-size"), ("-dev", "-dev"),
])
def test_a_bad_flag_value_is_one_line_naming_the_flag(one, flags, needle) -> None:
    done = run("evaluate", "--flags", flags, "--model", one["model"], "--hardware", one["spec"])
    assert_one_line_error(done, needle)


def test_a_flag_the_build_lacks_is_named_with_the_build(one) -> None:
    done = run("evaluate", "--flags", "-cmoe --moe-cache-mib 2 --moe-cache-cpu-share 0.5",
               "--model", one["model"], "--hardware", one["spec"], "--llamacpp-version",
               "b11669")
    assert_one_line_error(done, "--moe-cache-cpu-share", "b11669")


def test_flags_need_llamacpp_and_a_model_or_plan(one, tmp_path) -> None:
    assert_one_line_error(run("evaluate", "--flags", "-ncmoe 1", "--model", one["model"],
                              "--hardware", one["spec"], "--engine", "placer"), "--flags")
    assert_one_line_error(run("evaluate", "--flags", "-ncmoe 1", "--hardware", one["spec"]),
                          "--model")
    assert_one_line_error(run("evaluate", one["plan"], "--flags", "-ncmoe 1", "--curve"),
                          "--curve")
    assert_one_line_error(run("evaluate", one["plan"], "--model", one["model"]), "--flags")
    assert_one_line_error(run("evaluate", one["plan"], "--flags", "-cmoe", "--steps", "10"),
                          "--steps")


def test_uniform_routing_picks_k_distinct_experts_and_b_distinct_sequences() -> None:
    from placer.predict.llamacpp_flags import UNIFORM_TOKENS, uniform_steps

    steps = uniform_steps(3, 16, 4, 8, seed=1)
    assert steps.tokens.shape[1:] == (8, 3, 4) and len(steps) % UNIFORM_TOKENS == 0
    picks = steps.tokens.reshape(-1, 4)
    assert all(len(set(p)) == 4 for p in picks.tolist())
    assert all(len(set(row)) == 8 for row in steps.seqs.tolist())
    counts = np.bincount(picks.ravel(), minlength=16)
    assert counts.min() > 0.8 * counts.mean()  # uniform: no expert far from its share


def test_overrides_apply_in_order_first_match_wins() -> None:
    """-ot and -cmoe append to one list in command-line order; a tensor takes the buffer of
    the first pattern found in its name (llama-model-loader.cpp)."""
    flags = parse_flags(r"-ncmoe 2 -ot blk\.0\.=CUDA0 -cmoe -ncmoe 999999999")
    assert [(o.flag, o.buffer) for o in flags.overrides] == [
        ("-ncmoe", "CPU"), ("-ot", "CUDA0"), ("-cmoe", "CPU"), ("-ncmoe", "CPU")]
    assert flags.overrides[2].pattern == EXPS_REGEX
    ncmoe = flags.overrides[0]  # blk\.0 and blk\.1 + EXPS_REGEX, as llama.cpp writes them
    assert [ncmoe.finds(f"blk.{i}.ffn_up_exps.weight") for i in (0, 1, 2, 10)] == [
        True, True, False, False]
    assert not ncmoe.finds("blk.1.ffn_up.weight")


def test_ot_before_cmoe_keeps_a_layer_on_the_gpu(one) -> None:
    report = run_json("evaluate", "--flags", r"-ngl all -ot blk\.2\.=CUDA0 -cmoe", "--model",
                      one["model"], "--hardware", one["spec"])
    assert report["lines"][0]["host_layers"] == [0, 1, 3]


CONFIG = {"model_type": "qwen3_moe", "num_hidden_layers": 4, "hidden_size": 256,
          "intermediate_size": 512, "moe_intermediate_size": 512, "num_experts": 8,
          "num_experts_per_tok": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
          "head_dim": 64, "vocab_size": 1000, "torch_dtype": "bfloat16"}


def test_a_config_alone_is_predicted_on_uniform_routing_and_said_so(tmp_path) -> None:
    """--config with --hardware: --engine llamacpp is --flags' default; the -ot regex picks
    layers 1 and 3 by the GGUF names; what does not fit the card is named."""
    from llamacpp_boxes import write_one_card_spec

    config = tmp_path / "config.json"
    config.write_text(json.dumps(CONFIG))
    spec = write_one_card_spec(tmp_path / "box.toml", 6 << 20)
    report = run_json("evaluate", "--config", config, "--hardware", spec, "--flags",
                      r"-ngl all -ot 'blk\.[13]\.ffn_.*=CPU'", "--flags",
                      "-ngl all -cmoe --moe-cache-mib 5", "--concurrency", "1,4")
    lines = {line["name"]: line for line in report["lines"]}
    assert lines["flags 1"]["host_layers"] == [1, 3]
    assert lines["flags 2"]["host_layers"] == [0, 1, 2, 3]
    assert lines["flags 2"]["moe_cache_mib"] == 5 and lines["flags 2"]["slots"]
    assert any("exceed its VRAM" in n for n in lines["flags 1"]["notes"])
    assert report["routing"] == "uniform"
    assert any(n.startswith("no --traces: uniform routing") for n in report["notes"])
    assert [r["concurrency"] for r in report["results"]] == [1, 4]


def test_c_ctk_ctv_size_the_kv_cache_from_the_config(tmp_path) -> None:
    """-c N of a config's model: its KV cache (4 layers x 1024 cells x (K + V of 2 heads x
    64) values: f16 2 bytes a value, q8_0 34 bytes a block of 32) takes the spec's
    reserved_kv's place, and what is left for experts and the cache shrinks with it."""
    from llamacpp_boxes import write_one_card_spec

    config = tmp_path / "config.json"
    config.write_text(json.dumps(CONFIG))
    spec = write_one_card_spec(tmp_path / "box.toml", 6 << 20)
    cache = "-ngl all -cmoe --moe-cache-mib 5"
    report = run_json("evaluate", "--config", config, "--hardware", spec, "--flags", cache,
                      "--flags", f"{cache} -c 1024", "--flags",
                      f"{cache} -c 1024 -ctk q8_0 -ctv q8_0", "--flags", f"{cache} -ctk q8_0")
    notes = [line["notes"] for line in report["lines"]]
    f16 = 4 * 1024 * (128 * 2 + 128 * 2)
    q8 = 4 * 1024 * (128 // 32 * 34 * 2)
    assert (f16, q8) == (2 << 20, 1114112)
    assert not any("more than" in n for n in notes[0])
    assert any(n.startswith("context 1024 tokens, f16 K and V (-c 1024): reserved_kv "
                            "2.00 MiB") for n in notes[1]), notes[1]
    assert any("--moe-cache-mib 5: more than the 4 MiB" in n for n in notes[1]), notes[1]
    assert any("q8_0 K and V (-c 1024, -ctk q8_0, -ctv q8_0): reserved_kv 1.06 MiB" in n
               for n in notes[2]), notes[2]
    # no -c and no trained context in the config: the spec's reserve stands, said so
    assert any("-ctk q8_0: parsed, KV size from the spec's reserved_kv" in n
               for n in notes[3]), notes[3]
    done = run("evaluate", "--config", config, "--hardware", spec, "--flags", "-c 8192")
    assert_one_line_error(done, "-c 8192: card 0's KV cache (16.00 MiB)")


def test_partial_ngl_and_other_devices_are_named(one) -> None:
    """-ngl 3 of 4 layers and the output: layers 0-1 on the CPU, their experts host layers, the rest
    of them named as not modelled; -dev none is named, -dev of the spec's one card is not."""
    report = run_json("evaluate", "--flags", "-ngl 3 -dev none", "--flags", "-dev CUDA0",
                      "--model", one["model"], "--hardware", one["spec"])
    lines = {line["name"]: line for line in report["lines"]}
    assert lines["flags 1"]["host_layers"] == [0, 1]
    assert [n.split(" (")[0] for n in lines["flags 1"]["not_modelled"]] == ["-ngl 3",
                                                                          "-dev none"]
    assert lines["flags 2"]["not_modelled"] == []


def test_experts_sent_to_another_card_than_their_layer_are_named(tmp_path) -> None:
    """Two cards at -ts 1,1: layer 3 is card 1's; -ot sends its experts to CUDA0."""
    plan, model, _ = two_card_plan(tmp_path)
    report = run_json("evaluate", plan, "--flags", r"-ngl all -ts 1,1 -ot blk\.3\.=CUDA0")
    notes = report["lines"][1]["not_modelled"]
    assert any(n.startswith("-ot puts layer 3's experts on card 0, the layer on card 1")
               for n in notes), notes


def test_c_sizes_the_kv_cache_beside_a_plan_as_beside_its_gguf(tmp_path) -> None:
    """`evaluate PLAN --flags '... -c N'` sizes the KV cache from the plan's recorded KV shape
    exactly as `evaluate --model GGUF --hardware SPEC --flags` does (4 layers x 256 cells x
    (K + V of 2 heads x 64) f16 values = 512 KiB): the same note, setup and figures; a plan
    written before plans recorded the shape refuses -c rather than ignore it."""
    model = tiny_gguf(tmp_path, heads=(4, 2))
    traces = tiny_traces(tmp_path, model)
    spec = one_card(tmp_path, 2.5)
    plan, _ = solve(tmp_path, model, traces, spec)
    flags = "-ngl all -ncmoe 2 -c 256"
    common = ("--flags", flags, "--traces", traces, "--concurrency", "1")
    beside = run_json("evaluate", plan, *common)
    alone = run_json("evaluate", "--model", model, "--hardware", spec, *common)
    line, = (x for x in beside["lines"] if x["name"] == "flags")
    assert line == alone["lines"][0]
    assert any(n.startswith("context 256 tokens, f16 K and V (-c 256): reserved_kv 512.00 KiB")
               for n in line["notes"]), line["notes"]
    assert flag_figures(beside) == flag_figures(alone)
    old = json.loads(plan.read_text())
    del old["model"]["kv_shape"]
    (tmp_path / "old.json").write_text(json.dumps(old))
    assert_one_line_error(run("evaluate", tmp_path / "old.json", "--flags", flags),
                          "written before plans recorded the model's KV shape")
    assert run("evaluate", tmp_path / "old.json", "--flags", "-ngl all -ncmoe 2").exit_code == 0
