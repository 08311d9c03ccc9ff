"""Plans in other tools' terms: SGLang expert locations and llama.cpp overrides."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from test_export_ktransformers import write_plan

from placer.exporters.sglang import read_sglang_location
from placer.plan.placement import read_plan
from placer.predict.evaluate import plan_problem
from solvers.problem import Steps
from solvers.static import baselines

pytest_plugins = ["regression_plan"]  # `setup`: a solved tiny plan, once per session


def test_sglang_location_round_trips_the_plan_homes(setup, cli, tmp_path: Path) -> None:
    out = tmp_path / "locations.json"
    text = cli("export", "sglang", setup["plan"], "--out", out).output
    assert "--init-expert-location" in text
    plan = read_plan(setup["plan"])
    p2l = np.array(json.loads(out.read_text())["physical_to_logical_map"])
    assert np.array_equal(p2l, read_sglang_location(out))
    slots = p2l.shape[1] // len(plan.cards)
    for i, layer in enumerate(plan.moe_layers):
        for e in range(plan.experts_per_layer):
            ranks = {p // slots for p in np.flatnonzero(p2l[layer] == e)}
            assert ranks == {plan.expert(layer, e).card}, (layer, e)
        assert set(p2l[layer]) == set(range(plan.experts_per_layer)), i


def test_llamacpp_args_offload_the_layers_of_the_layer_baseline(setup, cli) -> None:
    plan = read_plan(setup["plan"])
    text = cli("export", "llamacpp", setup["plan"]).output
    match = re.search(r"blk\\\.\(([\d|]+)\)", text)
    exported = sorted(int(x) for x in match.group(1).split("|")) if match else []
    dummy = np.zeros((1, len(plan.moe_layers), plan.experts_per_layer), dtype=bool)
    problem = plan_problem(plan, [Steps("x", 1, dummy)])
    pages = baselines.layer_offload(problem).placement.resident_pages
    cold = [layer for layer, row in zip(plan.moe_layers, pages, strict=True) if not row.any()]
    partly = [layer for layer, row in zip(plan.moe_layers, pages, strict=True)
              if row.any() and not row.all()]
    assert not partly  # whole layers only
    assert exported == cold and cold


@pytest.mark.parametrize(("model_type", "arch", "suffixes"), [
    ("qwen3_moe", "qwen3moe", ("weight",)), ("mixtral", "llama", ("weight",)),
    ("deepseek_v3", "deepseek2", ("weight",)), ("gpt_oss", "gpt-oss", ("weight", "bias"))])
def test_llamacpp_names_the_gguf_tensors_of_the_architecture(
        cli, tmp_path: Path, model_type: str, arch: str, suffixes: tuple) -> None:
    """Names checked against llama.cpp's own gguf-py (PyPI `gguf`, gguf/constants.py)."""
    gguf = pytest.importorskip("gguf")
    plan = write_plan(tmp_path / "plan.json", np.zeros((3, 4), dtype=int), num_layers=3,
                      moe_layers=[0, 1, 2], model_type=model_type, capacity=4000)
    report = json.loads(cli("export", "llamacpp", plan, "--json").output)
    assert report["cold_layers"] == [0, 1] and report["gguf_arch"] == arch
    c = gguf.constants
    gguf_arch = next(a for a, name in c.MODEL_ARCH_NAMES.items() if name == arch)
    exps = {c.MODEL_TENSOR.FFN_GATE_EXP, c.MODEL_TENSOR.FFN_UP_EXP, c.MODEL_TENSOR.FFN_DOWN_EXP}
    expected = {f"{c.TENSOR_NAMES[t].format(bid=layer)}.{suffix}"
                for t in c.MODEL_TENSORS[gguf_arch] if t in exps
                for layer in (0, 1) for suffix in suffixes}
    assert len(expected) == 6 * len(suffixes)
    assert set(report["tensors"]) == expected and len(report["tensors"]) == len(expected)
    pattern = re.compile(report["override_tensor"].rsplit("=", 1)[0])
    assert all(pattern.search(name) for name in expected)
    assert not any(pattern.search(f"blk.2.{n}.weight") for n in ("ffn_gate_exps", "ffn_up_exps"))


def test_llamacpp_names_the_tensors_of_a_plan_solved_from_a_gguf(cli, tmp_path: Path) -> None:
    """A plan solved from a .gguf carries the GGUF architecture name as its model_type: the
    export names the file's own expert tensors, as the plan's Hugging Face name would."""
    from gguf_files import PROJECTIONS, write_moe_gguf

    from placer.checkpoint.inventory import read_inventory

    model = tmp_path / "m.gguf"
    tensors = write_moe_gguf(model, layers=3)
    np.save(tmp_path / "counts.npy", np.array([[30, 10, 12, 8], [5, 25, 20, 10], [1, 2, 3, 4]]))
    cli("traces", "import", tmp_path / "counts.npy", "--format", "counts", "--model", model,
        "--out", tmp_path / "counts")
    per = int(read_inventory(model).expert_bytes()[0, 0])
    plan = tmp_path / "plan.json"
    cli("solve", "--hardware", "1x-rtx4090", "--model", model, "--out", plan, "--budget",
        str(6 * per), "--execution", "cpu", "--traces", tmp_path / "counts", "--cache", "0")
    saved = json.loads(plan.read_text())
    assert saved["model"]["model_type"] == "qwen3moe"
    hf = tmp_path / "hf.json"
    hf.write_text(json.dumps({**saved, "model": {**saved["model"], "model_type": "qwen3_moe"}}))
    text = cli("export", "llamacpp", plan).output
    assert text == cli("export", "llamacpp", hf).output
    assert ("# GGUF tensors to CPU (qwen3moe), N in the cold layers: blk.N.ffn_gate_exps.weight, "
            "blk.N.ffn_up_exps.weight, blk.N.ffn_down_exps.weight\n") in text
    report = json.loads(cli("export", "llamacpp", plan, "--json").output)
    assert report == json.loads(cli("export", "llamacpp", hf, "--json").output)
    assert report["gguf_arch"] == "qwen3moe" and report["cold_layers"] == [0, 1]
    assert report["tensors"] == [f"blk.{layer}.{p}.weight" for layer in (0, 1)
                                 for p in PROJECTIONS]
    pattern = re.compile(report["override_tensor"].removesuffix("=CPU"))
    assert sorted(n for n in tensors if pattern.search(n)) == sorted(report["tensors"])
