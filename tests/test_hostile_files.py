"""Files as a hostile user writes them (issue 27): each is refused in one line naming the file
and what is wrong, never a traceback or a crash, and leaves no output directory behind; what
used to be accepted silently (a token selecting one expert twice, rank files of different
layers, `prompt_tokens: true`, NaN gate weights) is refused too."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from cli_errors import assert_one_line_error
from importer_files import EXPERTS, MOE_LAYERS, NUM_LAYERS, TOP_K, random_routing, write_config
from safetensors.torch import save_file

REPO = Path(__file__).resolve().parent.parent
DEEP = "[" * 5000 + "]" * 5000
DIGITS = "7" * 5000


@pytest.fixture
def config(tmp_path: Path) -> Path:
    return write_config(tmp_path / "model")


def imported(cli, source: Path, out: Path, *extra: object):
    """`placer traces import SOURCE --out OUT ...`, expected to fail: its result, after
    checking that OUT was not left behind."""
    result = cli("traces", "import", source, "--out", out, *extra, ok=False)
    assert not out.exists(), sorted(os.listdir(out))
    return result


def test_seq_lens_that_wrap_around_are_refused_not_a_crash(config: Path, tmp_path: Path) -> None:
    """int64 lengths near 2**63 whose sum wraps to the token count made numpy index out of
    bounds in C: a segmentation fault. Run in a subprocess, so that the old crash fails the
    test instead of killing pytest."""
    experts = random_routing(np.random.default_rng(0), 8)
    np.savez(tmp_path / "wrap.npz", expert_ids=experts,
             seq_lens=np.array([2**63 - 1, 2**63 - 1, 10], dtype=np.int64))  # sums to 8 in int64
    done = subprocess.run([sys.executable, "-m", "placer", "traces", "import",
                           tmp_path / "wrap.npz", "--config", config, "--out", tmp_path / "o"],
                          capture_output=True, text=True, cwd=REPO, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 1, (done.returncode, done.stderr)
    assert done.stderr.count("\n") == 1 and "seq_lens must be non-negative integers" in \
        done.stderr and "sum 18446744073709551624" in done.stderr
    assert not (tmp_path / "o").exists()


def npy_claiming(path: Path, shape: tuple[int, ...], dtype: str = "<i8") -> Path:
    """A .npy file whose header claims `shape`, followed by 64 bytes of data."""
    header = str({"descr": dtype, "fortran_order": False, "shape": shape})
    header += " " * (-(len(header) + 11) % 64) + "\n"
    raw = b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header.encode()
    path.write_bytes(raw + bytes(64))
    return path


@pytest.mark.parametrize("fmt", ["counts", "vllm", "tokens"])
def test_an_npy_header_claiming_terabytes_is_refused(cli, config: Path, tmp_path: Path,
                                                     fmt: str) -> None:
    shape = (10**12, 4) if fmt == "counts" else (10**12, NUM_LAYERS, TOP_K)
    path = npy_claiming(tmp_path / "huge.npy", shape)
    extra = ["--top-k", 2] if fmt == "counts" else ["--config", config]
    assert_one_line_error(imported(cli, path, tmp_path / "o", "--format", fmt, *extra),
                          str(path), "its header claims", "the file holds 64")


def test_broken_array_files_are_one_line(cli, config: Path, tmp_path: Path) -> None:
    experts = random_routing(np.random.default_rng(1), 6)
    np.savez_compressed(tmp_path / "good.npz", expert_ids=experts)
    raw = bytearray((tmp_path / "good.npz").read_bytes())
    for at in range(60, 90):  # inside the deflated member
        raw[at] ^= 0x5A
    (tmp_path / "corrupt.npz").write_bytes(bytes(raw))
    (tmp_path / "zip.npy").write_bytes((tmp_path / "good.npz").read_bytes())
    (tmp_path / "latin1.csv").write_bytes(b"1,2,3,4\n\xff\xfe,1,1,1\n")
    cases = [("corrupt.npz", ["--config", config], "not a readable .npz file"),
             ("zip.npy", ["--top-k", 2], "not a .npy array (no NumPy header)"),
             ("latin1.csv", ["--top-k", 2], "not UTF-8 text (byte 0xff at byte offset 8)")]
    for name, extra, needle in cases:
        assert_one_line_error(imported(cli, tmp_path / name, tmp_path / "o", *extra),
                              str(tmp_path / name), needle)


def sglang_response(rng: np.random.Generator, prompt: int, completion: int) -> dict:
    routed = np.zeros((prompt + completion - 1, NUM_LAYERS, TOP_K), dtype=np.int32)
    routed[:, list(MOE_LAYERS)] = random_routing(rng, len(routed))
    return {"text": "", "output_ids": list(range(5, 5 + completion)),
            "meta_info": {"prompt_tokens": prompt, "completion_tokens": completion,
                          "routed_experts": base64.b64encode(routed.tobytes()).decode()}}


def test_hostile_json_is_one_line(cli, config: Path, tmp_path: Path) -> None:
    """Nesting thousands deep, integers of thousands of digits, NaN: in every JSON reader."""
    np.save(tmp_path / "r.npy", np.zeros((3, NUM_LAYERS, TOP_K), np.int32) + [0, 1])
    good = json.dumps(sglang_response(np.random.default_rng(2), 3, 2))
    stats = tmp_path / "stats"
    stats.mkdir()
    (stats / "meta_info.json").write_text(DEEP)
    save_file({"0_1": torch.zeros(EXPERTS, dtype=torch.int64)}, stats / "rank0.safetensors")
    files = {"lens.json": DEEP, "deep.jsonl": DEEP + "\n",
             "digits.jsonl": good.replace('"prompt_tokens": 3', f'"prompt_tokens": {DIGITS}'),
             "nan.jsonl": good.replace('"prompt_tokens": 3', '"prompt_tokens": NaN')}
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    cases = [(tmp_path / "r.npy", ["--format", "vllm", "--prompt-lens", tmp_path / "lens.json"],
              "lens.json: nested deeper than 64 levels"),
             (tmp_path / "deep.jsonl", [], "deep.jsonl:1: nested deeper than 64 levels"),
             (tmp_path / "digits.jsonl", [], "digits.jsonl:1: an integer of 5000 digits"),
             (tmp_path / "nan.jsonl", [], "nan.jsonl:1: meta_info.prompt_tokens and "
                                          "completion_tokens must be integers"),
             (stats, [], "meta_info.json: nested deeper than 64 levels")]
    for source, extra, needle in cases:
        assert_one_line_error(imported(cli, source, tmp_path / "o", "--config", config, *extra),
                              needle)


@pytest.mark.parametrize("what", ["config", "header"])
def test_5000_digit_integers_in_a_checkpoint_are_one_line(cli, tmp_path: Path,
                                                          what: str) -> None:
    from test_input_properties import CONFIG, checkpoint, header_and_data, safetensors_bytes

    header, data = header_and_data()
    shard = None
    if what == "header":
        raw = json.dumps(header).replace('"data_offsets": [0,', f'"data_offsets": [{DIGITS},',
                                         1)
        shard = safetensors_bytes(raw.encode(), data)
    ckpt = checkpoint(tmp_path / "c", shard=shard)
    if what == "config":
        (ckpt / "config.json").write_text(json.dumps(CONFIG).replace(
            '"hidden_size": 8', f'"hidden_size": {DIGITS}'))
    assert_one_line_error(cli("inspect", ckpt, ok=False), "an integer of 5000 digits")


@pytest.mark.parametrize(("output_ids", "needle"), [
    (["5", "6"], "expected a list of token ids"), (None, "expected a list of token ids"),
    ([[5], [6]], "expected a list of token ids"), ([2**40, 6], "expected a list of token ids"),
    ([True, 6], "expected a list of token ids")])
def test_output_ids_that_are_not_token_ids(cli, config: Path, tmp_path: Path, output_ids,
                                           needle: str) -> None:
    response = sglang_response(np.random.default_rng(3), 3, 2)
    response["output_ids"] = output_ids
    (tmp_path / "r.jsonl").write_text(json.dumps(response) + "\n")
    assert_one_line_error(imported(cli, tmp_path / "r.jsonl", tmp_path / "o", "--config",
                                   config), "r.jsonl:1: output_ids", needle)


def test_prompt_tokens_true_is_refused(cli, config: Path, tmp_path: Path) -> None:
    """true is 1 to Python: a response claiming `prompt_tokens: true` was taken as 1 token."""
    response = sglang_response(np.random.default_rng(4), 1, 2)
    response["meta_info"]["prompt_tokens"] = True
    (tmp_path / "r.jsonl").write_text(json.dumps(response) + "\n")
    assert_one_line_error(imported(cli, tmp_path / "r.jsonl", tmp_path / "o", "--config",
                                   config), "prompt_tokens and completion_tokens must be "
                                            "integers")


def test_a_token_selecting_one_expert_twice_is_refused(cli, config: Path,
                                                       tmp_path: Path) -> None:
    experts = random_routing(np.random.default_rng(5), 6)
    experts[4, 1] = [3, 3]
    np.savez(tmp_path / "twice.npz", expert_ids=experts)
    assert_one_line_error(imported(cli, tmp_path / "twice.npz", tmp_path / "o", "--config",
                                   config), "token 4 selects expert 3 twice in MoE layer 1")
    response = sglang_response(np.random.default_rng(6), 3, 2)
    routed = np.frombuffer(base64.b64decode(response["meta_info"]["routed_experts"]),
                           np.int32).reshape(4, NUM_LAYERS, TOP_K).copy()
    routed[2, 3] = [7, 7]
    response["meta_info"]["routed_experts"] = base64.b64encode(routed.tobytes()).decode()
    (tmp_path / "r.jsonl").write_text(json.dumps(response) + "\n")
    assert_one_line_error(imported(cli, tmp_path / "r.jsonl", tmp_path / "o", "--config",
                                   config), "selects expert 7 twice")


def test_nan_gate_weights_are_refused(cli, config: Path, tmp_path: Path) -> None:
    experts = random_routing(np.random.default_rng(7), 5)
    weights = np.full(experts.shape, 0.5, np.float32)
    weights[2, 0, 1] = np.nan
    np.savez(tmp_path / "w.npz", expert_ids=experts, weights=weights)
    assert_one_line_error(imported(cli, tmp_path / "w.npz", tmp_path / "o", "--config",
                                   config), "gate weights hold NaN or infinity")


def test_trtllm_rank_files_of_different_layers_are_refused(cli, config: Path,
                                                           tmp_path: Path) -> None:
    stats = tmp_path / "stats"
    stats.mkdir()
    (stats / "meta_info.json").write_text(json.dumps({"num_experts": EXPERTS,
                                                      "num_experts_per_token": TOP_K}))
    def ones() -> torch.Tensor:
        return torch.ones(EXPERTS, dtype=torch.int64)

    save_file({"10_1": ones(), "10_2": ones(), "10_3": ones()}, stats / "rank0.safetensors")
    save_file({"10_1": ones(), "10_2": ones()}, stats / "rank1.safetensors")
    assert_one_line_error(imported(cli, stats, tmp_path / "o", "--config", config),
                          "rank1.safetensors counts layers [1, 2]", "cover the same layers")


@pytest.mark.parametrize("counts", [
    np.array([[2**63, 5, 0, 0], [1, 1, 1, 1]], dtype=np.uint64),
    np.array([[2**62, 2**62, 2**62, 0], [1, 1, 1, 1]], dtype=np.int64)],
    ids=["2**63", "a row sum that wraps"])
def test_counts_past_int64_are_refused_before_writing(cli, tmp_path: Path,
                                                      counts: np.ndarray) -> None:
    np.save(tmp_path / "c.npy", counts)
    result = imported(cli, tmp_path / "c.npy", tmp_path / "o", "--top-k", 2)
    assert_one_line_error(result, f"{tmp_path / 'c.npy'}: a MoE layer counts",
                          "more than 2**53")


def sglang_dump(path: Path, records: object, p2l: np.ndarray | None = None) -> Path:
    p2l = np.tile(np.arange(EXPERTS), (NUM_LAYERS, 1)) if p2l is None else p2l
    torch.save({"records": records, "last_physical_to_logical_map": torch.from_numpy(p2l)},
               path)
    return path


def sglang_record(**change: object) -> dict:
    ids = np.full((NUM_LAYERS, 2, 8), -1, dtype=np.int32)
    ids[list(MOE_LAYERS), :, :TOP_K] = [0, 1]
    record = {"forward_pass_id": 0, "rank": 0, "gatherer_key": "primary",
              "global_physical_count": torch.zeros(NUM_LAYERS, EXPERTS, dtype=torch.int32),
              "input_ids": [5, 6], "positions": [0, 1], "extend_seq_lens": [2],
              "forward_mode": 1, "topk_ids_of_layer": torch.from_numpy(ids)}
    record.update(change)
    return {k: v for k, v in record.items() if v is not None}


@pytest.mark.parametrize(("records", "p2l", "needle"), [
    ([1, 2], None, "records must be a list of dicts"),
    ("records", None, "records must be a list of dicts"),
    ([sglang_record(input_ids=None)], None, "records[0] has no input_ids"),
    ([sglang_record(forward_mode=None)], None, "records[0] has no forward_mode"),
    ([sglang_record(forward_mode="EXTEND")], None, "records[0].forward_mode is 'EXTEND'"),
    ([sglang_record(input_ids=[2**40, 6])], None, "records[0].input_ids: expected a list"),
    ([sglang_record()], np.full((NUM_LAYERS, EXPERTS), 2**40), "expert ids up to 1099511627776")])
def test_hostile_sglang_records_are_one_line(cli, config: Path, tmp_path: Path, records,
                                             p2l, needle: str) -> None:
    path = sglang_dump(tmp_path / "d.pt", records, p2l)
    assert_one_line_error(imported(cli, path, tmp_path / "o", "--config", config), str(path),
                          needle)


@pytest.mark.parametrize(("change", "needle"), [
    ({"moe_layer_freq": 0}, "moe_layer_freq is 0"),
    ({"moe_layer_freq": None}, "moe_layer_freq is None"),
    ({"num_hash_layers": "x"}, "num_hash_layers is 'x'")])
def test_ktransformers_config_the_engine_would_fail_on(cli, tmp_path: Path, change: dict,
                                                       needle: str) -> None:
    from test_export_ktransformers import write_plan

    plan = write_plan(tmp_path / "plan.json", np.ones((3, 4), dtype=int), num_layers=4,
                      moe_layers=[1, 2, 3])
    config = {"num_hidden_layers": 4, "n_routed_experts": 4, "first_k_dense_replace": 1,
              "num_experts_per_tok": 2, **change}
    (tmp_path / "config.json").write_text(json.dumps(config))
    result = cli("export", "ktransformers", plan, "--out", tmp_path / "kt.pt", "--config",
                 tmp_path / "config.json", ok=False)
    assert_one_line_error(result, needle)
    assert not (tmp_path / "kt.pt").exists()


@pytest.mark.parametrize(("text", "needle"), [
    ("num_slots: " + "[" * 3000 + "]" * 3000, "nested deeper than 64 levels"),
    ("num_slots: " + "[" * 100 + "]" * 100, "nested deeper than 64 levels"),
    ("num_slots: " + DIGITS, "not valid YAML"),
    ("num_slots: 8\nlayer_updates_per_iter: 0\ninitial_global_assignments:\n  " + DIGITS[:30]
     + ": [0, 1, 2, 3, 4, 5, 6, 7]\n", "initial_global_assignments[77777"),
    ("num_slots: 8\nlayer_updates_per_iter: 0\ninitial_global_assignments:\n  1: [0, 1, 2, 3, "
     "4, 5, 6, " + DIGITS[:25] + "]\n", "must list the expert id of each of the 8 slots")])
def test_a_hostile_load_balancer_yaml_is_one_line(cli, config: Path, tmp_path: Path,
                                                  text: str, needle: str) -> None:
    stats = tmp_path / "stats"
    stats.mkdir()
    (stats / "meta_info.json").write_text(json.dumps({"num_experts": EXPERTS,
                                                      "num_experts_per_token": TOP_K}))
    save_file({f"10_{layer}": torch.ones(EXPERTS, dtype=torch.int64) for layer in MOE_LAYERS},
              stats / "rank0.safetensors")
    (tmp_path / "lb.yaml").write_text(text)
    assert_one_line_error(imported(cli, stats, tmp_path / "o", "--config", config,
                                   "--load-balancer", tmp_path / "lb.yaml"), "lb.yaml", needle)
