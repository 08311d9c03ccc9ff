"""The exports issue 26 added, checked against the engines' own rules re-implemented here.

TensorRT-LLM (NVIDIA/TensorRT-LLM `tensorrt_llm/llmapi/llm_args.py` MoeLoadBalancerConfig at
7ce477f3c73bffd52edebf6ffbd10d530dff2e6f, `_torch/modules/fused_moe/moe_load_balancer.py` at
56851033051a6f9bd50e22219db64d68722a6f01): a YAML load balancer with int layer keys,
`num_slots % ep_size == 0`, rank r owns slots [r * S, (r + 1) * S), every MoE layer a key,
`num_slots >= num_experts`, `set(slots) == set(range(num_experts))`.
SGLang 0.5.23 (`eplb/expert_location.py`): a `.json` dict with `logical_count` goes to
init_by_eplb, [num_hidden_layers, num_logical]; `eplb_algorithms/deepseek.py` asserts
num_physical % ep_size == 0.
llama.cpp 0c1e5709 (`common/arg.cpp`, `src/llama-model-loader.cpp`): `--cpu-moe`, `-ot
regex=BUFFER` (std::regex_search on GGUF names, first match wins), `-ngl all`, `-ts`.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import numpy as np
import yaml
from test_export_ktransformers import write_plan

from placer.plan.placement import plan_from_json

EXPERT_NAMES = ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")


def edit_plan(path: Path, **changes) -> Path:
    """Set top-level or model fields of a written plan (model fields as model_<key>)."""
    plan = json.loads(path.read_text())
    for key, value in changes.items():
        if key.startswith("model_"):
            plan["model"][key.removeprefix("model_")] = value
        else:
            plan[key] = value
    plan_from_json(plan)  # still a valid plan
    path.write_text(json.dumps(plan))
    return path


def two_card_plan(tmp_path: Path, resident: int = 1, **kwargs) -> tuple[Path, np.ndarray]:
    """4 MoE layers (decoder 1..4 of 5) x 6 experts on 2 cards, uneven homes."""
    home = np.array([[0, 0, 0, 1, 1, 0], [1, 1, 0, 0, 1, 1], [0, 1, 0, 1, 0, 1],
                     [0, 0, 0, 0, 0, 1]])
    plan = write_plan(tmp_path / "plan.json", np.full(home.shape, resident), num_layers=5,
                      moe_layers=[1, 2, 3, 4], home=home, **kwargs)
    return plan, home


def test_trtllm_static_placement_meets_the_engines_checks(cli, tmp_path: Path) -> None:
    plan, home = two_card_plan(tmp_path)
    edit_plan(plan, model_architecture="Qwen3MoeForCausalLM")
    out = tmp_path / "placer-eplb.yaml"
    report = json.loads(cli("export", "trtllm", plan, "--out", out, "--json").output)
    data = yaml.safe_load(out.read_text())
    ep = 2
    num_slots = data["num_slots"]
    assert data["layer_updates_per_iter"] == 0 and num_slots % ep == 0 and num_slots >= 6
    assert report["num_slots"] == num_slots == 2 * 5 and report["warnings"] == []
    table = data["initial_global_assignments"]
    assert sorted(table) == [1, 2, 3, 4] and all(isinstance(k, int) for k in table)
    per_rank = num_slots // ep
    for ordinal, layer in enumerate([1, 2, 3, 4]):
        slots = table[layer]
        assert len(slots) == num_slots and set(slots) == set(range(6))
        for expert in range(6):
            ranks = {s // per_rank for s in range(num_slots) if slots[s] == expert}
            assert ranks == {home[ordinal, expert]}
    assert "--tp_size 2 --ep_size 2" in report["launch"]
    options = yaml.safe_load(report["extra_llm_api_options"])
    assert options["enable_attention_dp"] is True
    assert options["moe_config"]["load_balancer"] == str(out)
    text = cli("export", "trtllm", plan, "--out", tmp_path / "again.yaml").output
    assert "trtllm-serve MODEL --backend pytorch" in text and "warning" not in text


def test_trtllm_says_where_it_would_be_ignored(cli, tmp_path: Path) -> None:
    one = write_plan(tmp_path / "one.json", np.array([[1, 0, 1, 1]]), num_layers=1,
                     moe_layers=[0])
    report = json.loads(cli("export", "trtllm", one, "--out", tmp_path / "a.yaml",
                            "--json").output)
    warnings = " ".join(report["warnings"])
    assert "moe_ep_size > 1" in warnings and "'X' is not one" in warnings
    assert "only the plan's homes are exported" in warnings
    result = cli("export", "trtllm", one, "--out", tmp_path / "a.json", ok=False)
    assert result.exit_code == 1 and "name it .yaml" in result.output
    home = np.array([[0, 0, 1, 1], [0, 0, 0, 0]])
    empty = write_plan(tmp_path / "empty.json", np.ones((2, 4), dtype=int), num_layers=2,
                       moe_layers=[0, 1], home=home)
    result = cli("export", "trtllm", empty, "--out", tmp_path / "b.yaml", ok=False)
    assert result.exit_code == 1 and "card 1 homes no expert of MoE layer 1" in result.output


def test_sglang_logical_count_and_flags(cli, tmp_path: Path) -> None:
    plan, _ = two_card_plan(tmp_path)
    counts = [[5, 0, 3, 1, 2, 9], [1, 1, 1, 1, 1, 1], [0, 7, 0, 7, 0, 7], [2, 2, 4, 4, 6, 6]]
    edit_plan(plan, calibration=[{"name": "a", "tokens": 10, "counts": counts},
                                 {"name": "b", "tokens": 20,
                                  "counts": (np.array(counts) * 2).tolist()}])
    out = tmp_path / "load.json"
    report = json.loads(cli("export", "sglang", plan, "--out", out, "--logical-count",
                            "--json").output)
    load = np.array(json.loads(out.read_text())["logical_count"])
    assert load.shape == (5, 6) and not load[0].any()  # every decoder layer, dense row 0
    np.testing.assert_array_equal(load[1:], 4 * np.array(counts))  # each profile as 20 tokens
    assert report["mode"] == "logical_count" and report["redundant_experts"] == 0
    assert report["flags"] == f"--init-expert-location {out} --tp-size 2 --ep-size 2"
    assert "--enable-eplb replaces this placement" in report["warnings"][0]
    homes = cli("export", "sglang", plan, "--out", tmp_path / "homes.json").output
    assert "--tp-size 2 --ep-size 2 --ep-num-redundant-experts 4" in homes
    assert "warning: --enable-eplb" in homes
    odd = write_plan(tmp_path / "odd.json", np.ones((1, 5), dtype=int), num_layers=1,
                     moe_layers=[0], home=np.array([[0, 0, 0, 1, 1]]))
    edit_plan(odd, calibration=[{"name": "a", "tokens": 3, "counts": [[1, 1, 1, 1, 2]]}])
    report = json.loads(cli("export", "sglang", odd, "--out", tmp_path / "odd-load.json",
                            "--logical-count", "--json").output)
    assert report["redundant_experts"] == 1  # 5 + 1 physical experts split over 2 ranks
    bare = write_plan(tmp_path / "bare.json", np.ones((1, 4), dtype=int), num_layers=1,
                      moe_layers=[0])
    result = cli("export", "sglang", bare, "--out", tmp_path / "x.json", "--logical-count",
                 ok=False)
    assert result.exit_code == 1 and "no calibration counts" in result.output


def bound(args: list[str]) -> dict[str, str]:
    """GGUF expert tensor name -> buffer type under `args`, as llama.cpp's loader binds
    them: --cpu-moe first, then each -ot pattern in order, the first match wins."""
    patterns = []
    for i, arg in enumerate(args):
        if arg == "--cpu-moe":
            patterns.append((r"\.ffn_(up|down|gate|gate_up)_(ch|)exps", "CPU"))
        if arg == "-ot":
            for item in args[i + 1].split(","):
                regex, buffer = item.split("=", 1)
                patterns.append((regex, buffer))
    out = {}
    for layer in range(8):
        for name in EXPERT_NAMES:
            tensor = f"blk.{layer}.{name}.weight"
            out[tensor] = next((b for r, b in patterns if re.search(r, tensor)), "default")
    return out


def test_llamacpp_cpu_moe_when_every_layer_is_cold(cli, tmp_path: Path) -> None:
    plan = write_plan(tmp_path / "plan.json", np.zeros((3, 4), dtype=int), num_layers=4,
                      moe_layers=[1, 2, 3], capacity=100)
    report = json.loads(cli("export", "llamacpp", plan, "--json").output)
    assert report["cpu_moe"] and report["args"] == "--cpu-moe"
    assert report["cold_layers"] == [1, 2, 3]
    assert set(bound(shlex.split(report["args"])).values()) == {"CPU"}
    assert "--cpu-moe" in cli("export", "llamacpp", plan).output


def test_llamacpp_multi_gpu_binds_each_layer_to_one_device(cli, tmp_path: Path) -> None:
    """2 cards of 11000 bytes capacity, MoE layers 1-4 of 6000 bytes each: llama.cpp keeps a
    layer's experts on one device, so layers 1, 2 are cold, 3 is on card 0, 4 on card 1
    (contiguous runs, as llama.cpp splits layers), where the plan's own layer baseline (each
    layer split over its experts' homes) needs one cold layer: said so."""
    plan, _ = two_card_plan(tmp_path, resident=0, capacity=11000)
    report = json.loads(cli("export", "llamacpp", plan, "--json", "--devices",
                            "ROCm0,ROCm1").output)
    args = shlex.split(report["args"])
    assert report["cold_layers"] == [1, 2] and not report["cpu_moe"]
    assert report["devices"] == [{"name": "ROCm0", "layers": [3]},
                                 {"name": "ROCm1", "layers": [4]}]
    assert args[args.index("-ngl") + 1] == "all" and args[args.index("-ts") + 1] == "1,1"
    binding = bound(args)
    for layer, want in ((0, "default"), (1, "CPU"), (2, "CPU"), (3, "ROCm0"), (4, "ROCm1"),
                        (5, "default")):
        assert {binding[f"blk.{layer}.{n}.weight"] for n in EXPERT_NAMES} == {want}, layer
    assert "2 cold MoE layers where the plan's layer baseline" in report["warnings"][0]
    split = write_plan(tmp_path / "split.json", np.zeros((1, 4), dtype=int), num_layers=1,
                       moe_layers=[0], home=np.array([[0, 0, 1, 1]]), capacity=3000)
    whole = json.loads(cli("export", "llamacpp", split, "--json").output)
    assert whole["cpu_moe"] and "1 cold MoE layers where the plan's layer baseline, its " \
        "experts on their expert-parallel homes, needs 0" in whole["warnings"][0]
    result = cli("export", "llamacpp", plan, "--devices", "CUDA0", ok=False)
    assert result.exit_code == 1 and "give 2 distinct GPU buffer names" in result.output
    out = tmp_path / "args.txt"
    text = cli("export", "llamacpp", plan, "--out", out).output
    assert out.read_text() == report["args"].replace("ROCm", "CUDA") + "\n"
    assert "# CUDA0: experts of decoder layers [3]" in text


def test_llamacpp_warns_about_a_staging_plan(cli, tmp_path: Path) -> None:
    plan = write_plan(tmp_path / "plan.json", np.zeros((2, 4), dtype=int), num_layers=2,
                      moe_layers=[0, 1], capacity=8000)
    raw = json.loads(plan.read_text())
    raw["cards"][0]["staging_bytes"] = 2000
    raw["cards"][0]["capacity_bytes"] = 6000
    (tmp_path / "staged.json").write_text(json.dumps(raw))
    text = cli("export", "llamacpp", tmp_path / "staged.json").output
    assert "# warning: the plan was solved with --execution stage" in text
    raw["execution"] = "cpu"
    raw["cards"][0]["staging_bytes"], raw["cards"][0]["capacity_bytes"] = 0, 8000
    (tmp_path / "cpu.json").write_text(json.dumps(raw))
    assert "warning" not in cli("export", "llamacpp", tmp_path / "cpu.json").output
