"""Options bounded by what they allocate, specs `hardware new` writes that load, echoed text
cut (issue #53 item 5): each found case is one `error:` line, exit 1, before anything is
allocated or written.

- `--cache-slots` (evaluate, run, bench, serve) is at most the plan's experts (MoE layers x
  experts: a card caches no more), and the runtime's slots must fit its device's memory
  (placer.plan.placement.check_cache_slots, placer.runtime.placed_model.check_cache_memory);
- `--steps` is bounded by the memory its sampled steps take (placer.plan.options.
  check_steps_memory), `run` and `collect --mode generate` `--max-new-tokens` by the
  key/value cache its tokens take (traces.options.kv_bytes_per_token, available_memory);
- `hardware new` refuses what the loader (and so `solve --hardware`) refuses, naming the
  option, and what it writes loads;
- an option's text quoted in an error is cut (placer.errors.error_text, traces.errors.shown),
  whichever command quotes it."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_errors import assert_one_line_error
from tiny_pipeline import BOX, Pipeline, build_pipeline, invoke

import placer.checkpoint.step as step
from placer.hardware.spec import load_spec
from placer.units import parse_bytes

LONG = "x" * 100_000


@pytest.fixture(scope="module")
def pipe(tmp_path_factory: pytest.TempPathFactory, prose: list[str]) -> Pipeline:
    return build_pipeline(tmp_path_factory.mktemp("bounded"), prose)


def most_slots(p: Pipeline) -> int:
    from placer.plan.placement import read_plan

    plan = read_plan(p.plan)
    return len(plan.moe_layers) * plan.experts_per_layer


def test_evaluate_cache_slots_2_31_is_one_line_not_a_96_gib_allocation(pipe: Pipeline) -> None:
    result = invoke("evaluate", pipe.plan, "--traces", pipe.traces, "--cache-slots",
                    2**31 - 1)
    assert_one_line_error(result, f"--cache-slots must be in 0..{most_slots(pipe)} for this "
                                  "plan", "got 2147483647")


def test_evaluate_cache_slots_up_to_the_plans_experts_still_replays(pipe: Pipeline) -> None:
    result = invoke("evaluate", pipe.plan, "--traces", pipe.traces, "--cache-slots",
                    most_slots(pipe), "--json")
    assert result.exit_code == 0, result.output


def test_run_cache_slots_65536_is_one_line_before_loading(pipe: Pipeline) -> None:
    result = invoke("run", pipe.placed, "--prompt", "To be", "--cache-slots", 65536)
    assert_one_line_error(result, "--cache-slots must be in 0..", "got 65536")


@pytest.mark.parametrize("command", ["serve", "bench"])
def test_serve_and_bench_cache_slots_past_the_experts_are_one_line(pipe: Pipeline,
                                                                   tmp_path: Path,
                                                                   command: str) -> None:
    extra = (["--port", 0] if command == "serve" else
             ["--prompts", Path(__file__).parent.parent / "examples" / "data" /
              "mt_bench_questions.jsonl", "--max-new-tokens", 4, "--trials", 1])
    slots = most_slots(pipe) + 1
    result = invoke(command, pipe.placed, "--cache-slots", slots, *extra)
    assert_one_line_error(result, "--cache-slots must be in 0..", f"got {slots}")


def test_run_cache_slots_beyond_the_devices_memory_is_one_line(pipe: Pipeline,
                                                               monkeypatch) -> None:
    """Slots the plan allows but the device cannot hold: refused before anything loads."""
    monkeypatch.setattr("placer.runtime.placed_model.free_memory", lambda device: 10_000)
    result = invoke("run", pipe.placed, "--prompt", "To be", "--cache-slots", 2,
                    "--max-new-tokens", 1, "--device", "cpu")
    assert_one_line_error(result, "--cache-slots 2:", "free")


def test_run_max_new_tokens_beyond_memory_is_one_line(pipe: Pipeline) -> None:
    """2**40 new tokens: their key/value cache is more than any host holds (the run used to
    generate until memory was gone)."""
    result = invoke("run", pipe.placed, "--prompt", "To be", "--max-new-tokens", 2**40)
    assert_one_line_error(result, "--max-new-tokens 1099511627776", "key/value cache")


def test_collect_generate_max_new_tokens_beyond_memory_is_one_line(pipe: Pipeline,
                                                                     tmp_path: Path) -> None:
    corpus = tmp_path / "c.txt"
    corpus.write_text("To be, or not to be\n")
    result = invoke("collect", "--model", pipe.model, "--corpus", corpus, "--mode", "generate",
                    "--max-new-tokens", 2**40, "--out", tmp_path / "t", "--no-progress")
    assert_one_line_error(result, "--max-new-tokens 1099511627776", "key/value cache")
    assert not (tmp_path / "t").exists()


@pytest.mark.parametrize("command", ["solve", "evaluate"])
def test_steps_beyond_memory_are_one_line(pipe: Pipeline, tmp_path: Path, monkeypatch,
                                          command: str) -> None:
    monkeypatch.setattr(step, "free_memory", lambda device="cpu": 10**6)
    monkeypatch.setattr("placer.plan.options.free_memory", lambda device="cpu": 10**6)
    args = (["solve", "--model", pipe.model, "--hardware", BOX, "--traces", pipe.traces,
             "--offload", 0.5, "--solver", "greedy", "--out", tmp_path / "p.json"]
            if command == "solve" else ["evaluate", pipe.plan, "--traces", pipe.traces])
    result = invoke(*args, "--steps", 2**24)
    assert_one_line_error(result, "--steps 16777216", "available; sample fewer")
    assert not (tmp_path / "p.json").exists()


def test_emit_align_2_30_is_refused_before_writing_gigabytes_of_padding(pipe: Pipeline,
                                                                       tmp_path: Path) -> None:
    """Every tensor is padded to --align: 2**30 wrote 49 GB for a 200 kB model."""
    out = tmp_path / "placed"
    result = invoke("emit", "--plan", pipe.plan, "--model", pipe.model, "--out", out,
                    "--align", 2**30)
    assert_one_line_error(result, "--align must be a power of two in 8..2097152")
    assert not out.exists()


NEW = ["hardware", "new", "--card", "RTX 3060", "--pcie", "4.0x16", "--ram", "ddr4-3200x2"]


def test_hardware_new_refuses_a_host_ram_that_solve_would_refuse(tmp_path: Path) -> None:
    out = tmp_path / "box.toml"
    result = invoke(*NEW, "--host-ram", "1e30TiB", "--out", out)
    assert_one_line_error(result, "--host-ram: expected a size up to 2**60 bytes")
    assert not out.exists()


@pytest.mark.parametrize("host_ram", ["0", "64GiB", "1TiB", f"{2**60}B", "1.5e3GiB"])
def test_every_spec_hardware_new_writes_loads(tmp_path: Path, host_ram: str) -> None:
    out = tmp_path / "box.toml"
    result = invoke(*NEW, "--host-ram", host_ram, "--cards", 1024, "--cpu-cores", 1024,
                    "--out", out)
    assert result.exit_code == 0, result.output
    assert load_spec(out).host_ram == parse_bytes(host_ram)


def test_an_unknown_card_of_100000_characters_is_not_echoed_whole() -> None:
    result = invoke("hardware", "new", "--card", LONG, "--pcie", "4.0x16", "--ram",
                    "ddr4-3200x2")
    assert_one_line_error(result, "--card: placer knows no card", "(100000 characters)")
    assert len(result.output) < 1000


@pytest.mark.parametrize("args", [
    ["hardware", "new", "--card", "RTX 3060", "--pcie", LONG, "--ram", "ddr4-3200x2"],
    ["hardware", "new", "--card", "RTX 3060", "--pcie", "4.0x16", "--ram", LONG],
    ["hardware", "new", "--card", "RTX 3060", "--pcie", "4.0x16", "--ram", "ddr4-3200x2",
     "--host-ram", LONG],
    ["hardware", "show", LONG],
    ["hardware", "new", "--card", "RTX 3060", "--pcie", "4.0x16", "--ram", "ddr4-3200x2",
     "--cards", LONG],
], ids=["pcie", "ram", "host-ram", "preset", "usage-error"])
def test_any_long_option_text_is_cut_in_its_error(args: list[str]) -> None:
    result = invoke(*args)
    assert result.exit_code in (1, 2), result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output[:300]
    assert len(lines[0]) < 1000 and "x" * 1000 not in lines[0], lines[0][:300]


def test_a_long_solver_name_is_cut_wherever_the_command_quotes_it(pipe: Pipeline,
                                                                   tmp_path: Path) -> None:
    result = invoke("solve", "--model", pipe.model, "--hardware", BOX, "--traces",
                    pipe.traces, "--offload", 0.5, "--solver", LONG, "--out",
                    tmp_path / "p.json")
    assert_one_line_error(result, "--solver", "(100000 characters)")
    assert len(result.output) < 1000
