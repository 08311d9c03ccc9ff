"""`placer export ktransformers` (and the exporters' shared checks) on small hand-made plans.

The central check applies sglang-kt's own rule to the exported file and asserts that the
GPU mask it yields is exactly the plan's resident set. The rule is re-implemented here from
the source, independently of placer/exporters/ktransformers.py:
kvcache-ai/sglang 04653fa88f5ce4ea83632c4ad436343db6bc8324,
`python/sglang/srt/layers/moe/kt_ep_wrapper.py::_init_kt_gpu_experts_masks` (MoE layers from
the config, `int(num_moe_layers * num_experts * ratio)`, torch.load of a `.pt` dict's
`logical_count`, 3-D check, sum over dim 0, non-MoE rows set True) and kvcache-ai/ktransformers
95009ea6856c0799e517e93cb12be5e8494bc7ce, `kt-kernel/python/experts_base.py::
generate_gpu_experts_masks` (clamp, flattened torch.topk, mask of the top indices).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from tiny_pipeline import write_sealed

from placer.exporters.ktransformers import gpu_experts_ratio
from placer.files import write_json_atomic
from placer.hardware.spec import parse_spec
from placer.plan.placement import CardPlan, ExpertPlacement, Page, Plan


def _spec(cards: int):
    return parse_spec({"name": f"{cards}-cards", "host_ram": "1GiB", "cards": cards,
                       "card": {"model": "toy", "vram": "64MiB", "h2d_bandwidth": "1GB/s",
                                "latency_us": 5.0},
                       "link": [{"name": "a", "cards": list(range(cards)),
                                 "bandwidth": "1GB/s"}],
                       "decode": {"base_step_ms": {"1": 1.0}}})


def write_plan(path: Path, resident: np.ndarray, *, num_layers: int, moe_layers: list[int],
               home: np.ndarray | None = None, pages: int = 1, model_type: str = "qwen3_moe",
               capacity: int = 1 << 26) -> Path:
    """A plan.json: `resident` [L, E] resident pages of each expert (of `pages`), 1000 bytes
    per expert, `home` [L, E] card of each expert (default all card 0)."""
    home = np.zeros_like(resident) if home is None else home
    cards = int(home.max()) + 1
    experts = []
    for i, layer in enumerate(moe_layers):
        for e in range(resident.shape[1]):
            size = 1000 // pages
            experts.append(ExpertPlacement(layer, e, int(home[i, e]), size * pages, tuple(
                Page(j, j * size, size, bool(j < resident[i, e])) for j in range(pages))))
    card_plans = [CardPlan(c, capacity, 0, sum(x.resident_bytes for x in experts if x.card == c),
                           sum(x.bytes for x in experts if x.card == c)) for c in range(cards)]
    model = {"fingerprint": "f" * 64, "architecture": "X", "model_type": model_type,
             "num_layers": num_layers, "moe_layers": moe_layers,
             "experts_per_layer": resident.shape[1], "top_k": 2, "estimated": True}
    plan = Plan(model, _spec(cards), {"mode": "budget", "value": None, "concurrency": [1]},
                None if pages == 1 else 1000 // pages, "contiguous", {"name": "test"},
                card_plans, experts)
    write_json_atomic(plan.to_json(), path)
    return path


def engine_mask(pt_file: Path, ratio: str, config: dict) -> np.ndarray:
    """sglang-kt's GPU expert mask [num_layers, num_experts] for the frequency strategy."""
    num_layers = config["num_hidden_layers"]
    num_experts = config.get("num_local_experts") or config.get("num_experts") \
        or config.get("n_routed_experts")
    first_k = config.get("first_k_dense_replace", 0) or 0
    freq = config.get("moe_layer_freq", 1)
    is_moe = [i >= first_k and i % freq == 0 for i in range(num_layers)]
    num_gpu = int(sum(is_moe) * num_experts * float(ratio))
    loaded = torch.load(pt_file, map_location="cpu", weights_only=True)
    counts = loaded["logical_count"] if isinstance(loaded, dict) else loaded
    assert counts.dim() == 3 and counts.shape[1:] == (num_layers, num_experts)
    activation = counts.sum(dim=0).float()
    num_gpu = max(min(num_gpu, activation.numel()), 0)
    mask = torch.zeros(activation.numel(), dtype=torch.bool)
    if num_gpu:
        _, top = torch.topk(activation.view(-1), k=num_gpu, largest=True, sorted=False)
        mask[top] = True
    mask = mask.view(num_layers, num_experts)
    for i in range(num_layers):
        if not is_moe[i]:
            mask[i, :] = True
    return mask.numpy()


def _export(cli, plan: Path, out: Path, *extra, ok: bool = True):
    return cli("export", "ktransformers", plan, "--out", out, *extra, ok=ok)


def test_the_engines_rule_rebuilds_the_plans_resident_set(cli, tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    config = {"num_hidden_layers": 3, "num_experts": 16}
    for trial, count in enumerate([0, 1, 7, 23, 47, 48]):
        resident = np.zeros(48, dtype=int)
        resident[rng.choice(48, size=count, replace=False)] = 1
        resident = resident.reshape(3, 16)
        plan = write_plan(tmp_path / f"plan{trial}.json", resident, num_layers=3,
                          moe_layers=[0, 1, 2])
        out = tmp_path / f"kt{trial}.pt"
        report = json.loads(_export(cli, plan, out, "--json").output)
        flags = report["flags"]
        assert report["file"] == str(out) and report["gpu_experts"] == count
        assert flags[:4] == ["--kt-expert-placement-strategy", "frequency",
                             "--init-expert-location", str(out)]
        assert flags[4] == "--kt-gpu-experts-ratio"
        loaded = torch.load(out, weights_only=True)
        assert list(loaded) == ["logical_count"]
        assert tuple(loaded["logical_count"].shape) == (1, 3, 16)
        assert np.array_equal(engine_mask(out, flags[5], config), resident.astype(bool))


def test_dense_layers_follow_the_configs_rule(cli, tmp_path: Path) -> None:
    """DeepSeek-style: layer 0 dense (first_k_dense_replace 1), layers 1-3 MoE."""
    resident = np.zeros((3, 8), dtype=int)
    resident[0, [1, 5]] = resident[1, 2] = resident[2, [0, 3, 7]] = 1
    plan = write_plan(tmp_path / "plan.json", resident, num_layers=4, moe_layers=[1, 2, 3],
                      model_type="deepseek_v3")
    config = {"num_hidden_layers": 4, "n_routed_experts": 8, "first_k_dense_replace": 1,
              "moe_layer_freq": 1}
    (tmp_path / "config.json").write_text(json.dumps(config))
    out = tmp_path / "kt.pt"
    no_config = _export(cli, plan, out, ok=False)
    assert no_config.exit_code == 1 and "--config" in no_config.output and not out.exists()
    text = _export(cli, plan, out, "--config", tmp_path / "config.json").output
    ratio = text.split("--kt-gpu-experts-ratio ")[1].split()[0]
    counts = torch.load(out, weights_only=True)["logical_count"]
    assert counts[0, 0].sum().item() == 0  # the dense layer is all 0
    mask = engine_mask(out, ratio, config)
    assert np.array_equal(mask[1:], resident.astype(bool)) and mask[0].all()


def test_cards_with_different_sets_are_refused_unless_the_union_is_asked_for(
        cli, tmp_path: Path) -> None:
    resident = np.array([[1, 0, 1, 0], [0, 1, 0, 0]])
    home = np.array([[0, 0, 1, 1], [0, 0, 1, 1]])
    plan = write_plan(tmp_path / "plan.json", resident, num_layers=2, moe_layers=[0, 1],
                      home=home)
    out = tmp_path / "kt.pt"
    refused = _export(cli, plan, out, ok=False)
    assert refused.exit_code == 1 and "cards [0, 1]" in refused.output and not out.exists()
    flags = json.loads(_export(cli, plan, out, "--union", "--json").output)["flags"]
    config = {"num_hidden_layers": 2, "num_experts": 4}
    assert np.array_equal(engine_mask(out, flags[5], config), resident.astype(bool))


def test_partly_resident_experts_are_refused(cli, tmp_path: Path) -> None:
    resident = np.array([[2, 1, 0, 2]])
    plan = write_plan(tmp_path / "plan.json", resident, num_layers=1, moe_layers=[0], pages=2)
    out = tmp_path / "kt.pt"
    result = _export(cli, plan, out, ok=False)
    assert result.exit_code == 1 and not out.exists()
    assert result.output.count("\n") == 1 and "layer 0 expert 1 is resident in part" in \
        result.output


@pytest.mark.parametrize("total", [3, 7, 10, 49, 96, 1000, 3 * 384, 58 * 256, 61 * 384])
def test_ratio_truncates_to_each_count(total: int) -> None:
    for count in range(total + 1):
        assert int(total * float(gpu_experts_ratio(count, total))) == count, count


@pytest.mark.parametrize("engine", ["sglang", "trtllm", "ktransformers", "llamacpp"])
def test_out_equal_to_the_plan_is_refused(cli, tmp_path: Path, engine: str) -> None:
    plan = write_plan(tmp_path / "plan.json", np.ones((1, 4), dtype=int), num_layers=1,
                      moe_layers=[0])
    placed = tmp_path / "placed"
    placed.mkdir()
    write_sealed(json.loads(plan.read_text()), placed)  # a manifest proves itself
    before = plan.read_bytes()
    for source, out in ((plan, plan), (placed, placed / "manifest.json")):
        result = cli("export", engine, source, "--out", out, ok=False)
        assert result.exit_code == 1, result.output
        assert "is the plan being exported" in result.output
        assert result.output.count("\n") == 1
    assert plan.read_bytes() == before
