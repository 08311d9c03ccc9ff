"""benchmarks/train_moe.py trains a small MoE on real text (issue #54 item 5): here at tiny
sizes (2 layers, 4 experts, 20 steps, a slice of the corpora), in seconds."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
from fixtures_models import CHAT, MT_BENCH, PROSE, invoke

from benchmarks.moe_corpus import DOMAINS, load_documents, split_documents
from benchmarks.moe_routing import locality, routing_figures
from benchmarks.train_moe import TrainOptions, main, parse_args, train_moe

TINY = TrainOptions(layers=2, experts=4, top_k=2, hidden=32, moe_intermediate=32, vocab=384,
                    seq_len=64, batch=4, steps=20, warmup=5, code_chars=12000, eval_windows=4,
                    log_every=5, save_dtype="float32")


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    """A slice of the real corpora: 40,000 characters of prose, 20 questions of each bench."""
    root = tmp_path_factory.mktemp("train-data")
    (root / "shakespeare.txt").write_text(PROSE.read_text()[:40000])
    for src, name in ((MT_BENCH, "mt_bench_questions.jsonl"),
                      (CHAT, "vicuna_bench_questions.jsonl")):
        (root / name).write_text("".join(src.read_text().splitlines(keepends=True)[:20]))
    return root


@pytest.fixture(scope="module")
def trained(tmp_path_factory, data: Path) -> tuple[Path, Path]:
    """Two checkpoints trained with the same options."""
    root = tmp_path_factory.mktemp("trained")
    for name in ("a", "b"):
        train_moe(root / name, TINY, data)
    return root / "a", root / "b"


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_two_runs_give_byte_identical_weights(trained):
    a, b = trained
    assert _sha(a / "model.safetensors") == _sha(b / "model.safetensors")
    assert (a / "tokenizer.json").read_bytes() == (b / "tokenizer.json").read_bytes()
    record = json.loads((a / "training.json").read_text())
    assert record["weights"]["sha256"] == _sha(a / "model.safetensors")
    assert record["steps"] == 20 and record["stopped_by"] == "steps"


def test_the_held_out_loss_goes_down(trained):
    record = json.loads((trained[0] / "training.json").read_text())
    for domain in DOMAINS:
        assert record["validation"][domain]["loss"] < record["validation_before"][domain]["loss"]
    assert record["curve"][-1]["loss"] < record["curve"][0]["loss"]


def test_the_router_aux_loss_is_on(trained):
    config = json.loads((trained[0] / "config.json").read_text())
    assert config["output_router_logits"] is True
    assert config["router_aux_loss_coef"] == TINY.aux_coef
    curve = json.loads((trained[0] / "training.json").read_text())["curve"]
    # HF's load-balancing loss is E * sum_e f_e P_e: k (= 2) when the load is even.
    assert all(1.5 < point["aux_loss"] < 4.0 for point in curve)


def test_held_out_documents_are_not_in_the_training_split(trained, data):
    train, held = split_documents(load_documents(data, TINY.code_chars), TINY.every)
    assert {d.domain for d in held} == set(DOMAINS)
    for domain in DOMAINS:
        seen = "\0".join(d.text for d in train if d.domain == domain)
        lines = (trained[0] / "heldout" / f"{domain}.jsonl").read_text().splitlines()
        mine = [d for d in held if d.domain == domain]
        assert len(lines) == len(mine)
        for line, doc in zip(lines, mine, strict=True):
            record = json.loads(line)
            text = "\n".join(record["turns"]) if "turns" in record else record["text"]
            assert text == doc.text and text not in seen


def test_placer_collect_reads_the_checkpoint(trained, tmp_path):
    out = tmp_path / "traces"
    invoke("collect", "--model", str(trained[0]), "--out", str(out), "--corpus",
           str(trained[0] / "heldout" / "prose.jsonl"), "--max-length", "64",
           "--device", "cpu", "--no-progress")
    figures = routing_figures(out)
    assert (figures["experts"], figures["top_k"], len(figures["layers"])) == (4, 2, 2)
    assert figures["layers"][0]["spec_recall"] is None
    assert 0.0 <= figures["layers"][1]["spec_recall"][0] <= 1.0


def test_locality_counts_the_experts_the_previous_token_selected():
    experts = np.array([[[0, 1]], [[1, 2]], [[1, 2]], [[0, 3]]])  # [T=4, L=1, k=2]
    seq = np.array([0, 0, 0, 1])  # the last token starts a new sequence
    reuse, independent = locality(experts, seq, 4)
    assert reuse == [(0.5 + 1.0) / 2]
    f = np.array([2, 3, 2, 1]) / 4
    assert independent == [pytest.approx(float((f * f).sum() / 2))]


def test_a_corpus_too_small_for_a_window_is_refused(data, tmp_path, capsys):
    out = tmp_path / "m"
    assert main(["--out", str(out), "--data", str(data), "--seq-len", "100000",
                 "--code-chars", "2000", "--steps", "1"]) == 2
    assert "--seq-len 100000" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []  # nothing left behind


def test_an_existing_out_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit):
        parse_args(["--out", str(tmp_path)])
    assert "exists" in capsys.readouterr().err
