"""benchmarks/bench_accuracy.py on one tiny group (docs/accuracy.md): its predictions are
`placer evaluate --flags`'s own, and its table's arithmetic (pred / meas, every pair's ratio
error, the summary's counts) follows from the figures it printed. Also the --expert-dtype /
--dense-dtype options of `evaluate --flags --config` that the bench relies on."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

from typer.testing import CliRunner

from placer.cli import app

REPO = Path(__file__).resolve().parent.parent
CONFIG = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
          "num_hidden_layers": 4, "hidden_size": 256, "intermediate_size": 512,
          "moe_intermediate_size": 256, "num_experts": 16, "num_experts_per_tok": 4,
          "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
          "vocab_size": 1024, "torch_dtype": "bfloat16"}
# The bench's group: 4 layers of 16 wide experts (8192 x 16384: 72 MiB each in Q4_K, 4.5 GiB
# a layer), so that every expert on an RTX 3060 (-ncmoe 0) exceeds its 12 GB and placer says
# so, while -ncmoe 2 and -cmoe fit.
WIDE = {**CONFIG, "hidden_size": 8192, "moe_intermediate_size": 16384}
FLAGS = ["-ngl 99 -cmoe", "-ngl 99 -ncmoe 2", "-ngl 99 -ncmoe 0"]
MEASURED = [10.0, 14.0, 21.0]  # made up: the inputs of the arithmetic checked here
LOADS = [True, True, False]


def bench():
    spec = importlib.util.spec_from_file_location(
        "bench_accuracy", REPO / "benchmarks" / "bench_accuracy.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def tiny_group(tmp_path: Path, card: str = "RTX 3060") -> Path:
    config = tmp_path / "config.json"
    config.write_text(json.dumps(WIDE))
    runs = ",\n".join(f'  {{ flags = "{f}", posted = "llama-server {f}", tg = {m} }}'
                      for f, m in zip(FLAGS, MEASURED, strict=True))
    groups = tmp_path / "groups.toml"
    groups.write_text(f"""[[group]]
id = "tiny"
source = "test"
url = ""
box_posted = "test box"
backend = "cuda"
card = "{card}"
cards = 1
pcie = "4.0x16"
ram = "ddr4-3200x2"
cpu_cores = 8
assumed = "everything"
model = "tiny"
config = "{config}"
expert_dtype = "q4_k"
dense_dtype = "q8_0"
conditions = "test"
runs = [
{runs},
]
""")
    return groups


def cells(text: str, section: str) -> list[list[str]]:
    """The body rows of the markdown table under `### section`."""
    part = text.split(f"### {section}\n", 1)[1].split("\n### ", 1)[0]
    rows = [ln for ln in part.splitlines() if ln.startswith("| ")]
    return [[c.strip() for c in row.strip("|").split("|")] for row in rows[1:]]


def test_bench_table_is_evaluates_figures_and_its_arithmetic_holds(tmp_path):
    groups = tiny_group(tmp_path)
    md, js = tmp_path / "accuracy.md", tmp_path / "accuracy.json"
    bench().main(["--groups", str(groups), "--out", str(md), "--json", str(js)])
    text, data = md.read_text(), json.loads(js.read_text())
    (group,) = data["groups"]
    assert group["skipped"] is None and group["box"] == "assumed"
    predicted = [r["predicted"] for r in group["runs"]]
    assert [r["measured"] for r in group["runs"]] == MEASURED

    # the predictions are placer evaluate --flags' own (the spec hardware new makes from the
    # config and dtypes; the same flags)
    spec = tmp_path / "box.toml"
    runner = CliRunner()
    made = runner.invoke(app, ["hardware", "new", "--card", "RTX 3060", "--cards", "1",
                               "--pcie", "4.0x16", "--ram", "ddr4-3200x2", "--cpu-cores", "8",
                               "--config", str(tmp_path / "config.json"), "--expert-dtype",
                               "q4_k", "--dense-dtype", "q8_0", "--out", str(spec)])
    assert made.exit_code == 0, made.output
    args = ["evaluate", "--engine", "llamacpp", "--config", str(tmp_path / "config.json"),
            "--hardware", str(spec), "--expert-dtype", "q4_k", "--dense-dtype", "q8_0",
            "--concurrency", "1", "--json"]
    for f in FLAGS:
        args += ["--flags", f]
    done = runner.invoke(app, args)
    assert done.exit_code == 0, done.output
    report = json.loads(done.output)
    figures = report["results"][0]["lines"]
    assert predicted == [figures[line["name"]]["tokens_per_s"] for line in report["lines"]]
    assert len(set(predicted)) > 1  # the settings differ, so the pairs test something
    assert [not any("would not load" in n for n in line["notes"])
            for line in report["lines"]] == LOADS
    assert [r["notes"] for r in group["runs"]] == [line["notes"] for line in report["lines"]]

    # runs: pred / meas as printed, from the figures printed beside it
    rows = cells(text, "Runs")
    assert [r[1] for r in rows] == [f"`{f}`" for f in FLAGS]
    spans = [figures[line["name"]]["tokens_per_s_step"] for line in report["lines"]]
    assert [r["step_range"] for r in group["runs"]] == spans
    for row, p, m, (lo, hi) in zip(rows, predicted, MEASURED, spans, strict=True):
        assert (row[2], row[3], row[4]) == (f"{m:.2f}", f"{p:.2f} [{lo:.2f}, {hi:.2f}]",
                                            f"{p / m:.2f}")
        assert row[5] == "box assumed"
    in_range = sum(lo <= m <= hi for m, (lo, hi) in zip(MEASURED, spans, strict=True))
    assert data["summary"]["runs_in_step_range"] == in_range

    # pairs: every pair of the group, its error r - 1 from the printed ratios' sources
    pairs = cells(text, "Pairs")
    assert len(pairs) == 3 == len(group["pairs"])
    expected = [(0, 1), (0, 2), (1, 2)]
    for row, pair, (a, b) in zip(pairs, group["pairs"], expected, strict=True):
        r = (predicted[a] / predicted[b]) / (MEASURED[a] / MEASURED[b])
        assert pair["r"] == r and pair["within"] == (1 / 1.2 <= r <= 1.2)
        assert row[1:] == [f"`{FLAGS[a]}`", f"`{FLAGS[b]}`", f"{MEASURED[a] / MEASURED[b]:.3f}",
                           f"{predicted[a] / predicted[b]:.3f}", f"{r - 1:+.3f}",
                           "yes" if pair["within"] else "no"]

    # summary: the counts of the tables above
    within = sum(p["within"] for p in group["pairs"])
    assert data["summary"]["pairs"] == 3 and data["summary"]["pairs_within"] == within
    share = re.search(r"pairs whose ratio is within 20%: (\d+)/(\d+)", text)
    assert share.groups() == (str(within), "3")
    # the one pair of two runs placer predicts as loading: -cmoe and -ncmoe 2
    assert data["summary"]["pairs_loading"] == 1
    assert data["summary"]["pairs_loading_within"] == group["pairs"][0]["within"]
    runs_within = sum(0.5 <= p / m <= 2 for p, m in zip(predicted, MEASURED, strict=True))
    assert data["summary"]["runs_within"] == runs_within
    assert data["summary"]["runs_posted"] == 0  # the box is assumed: no factor-2 verdict
    assert "runs within a factor of 2, where the source posts card, link and RAM: 0/0" in text


def test_a_group_the_cli_refuses_is_skipped_with_its_error(tmp_path):
    groups = tiny_group(tmp_path, card="No Such Card 9000")
    js = tmp_path / "accuracy.json"
    md = tmp_path / "accuracy.md"
    bench().main(["--groups", str(groups), "--json", str(js), "--out", str(md)])
    (group,) = json.loads(js.read_text())["groups"]
    assert "placer knows no card 'No Such Card 9000'" in group["skipped"]
    assert cells(md.read_text(), "Skipped groups")[0][:2] == ["tiny", "3"]


def test_write_doc_replaces_only_the_generated_block(tmp_path):
    module = bench()
    doc = tmp_path / "doc.md"
    doc.write_text(f"intro\n{module.BEGIN}\nold\n{module.END}\noutro\n")
    module.write_doc(doc, "new\n")
    assert doc.read_text() == f"intro\n{module.BEGIN}\nnew\n{module.END}\noutro\n"


def test_evaluate_flags_config_takes_the_ggufs_dtypes(tmp_path):
    config = tmp_path / "config.json"
    config.write_text(json.dumps(CONFIG))
    spec = tmp_path / "box.toml"
    runner = CliRunner()
    assert runner.invoke(app, ["hardware", "new", "--card", "RTX 3060", "--pcie", "4.0x16",
                               "--ram", "ddr4-3200x2", "--out", str(spec)]).exit_code == 0
    base = ["evaluate", "--engine", "llamacpp", "--config", str(config), "--hardware",
            str(spec), "--flags", "-ngl 99 -cmoe", "--json"]

    def staged(*dtypes: str) -> float:
        done = runner.invoke(app, [*base, *dtypes])
        assert done.exit_code == 0, done.output
        (line,) = json.loads(done.output)["results"][0]["lines"].values()
        return line["staged_bytes_per_token"]

    # every expert on the host: a token reads 4 layers x top-4 experts x 3 matrices of
    # 256 x 256, in bf16 by default (the config's torch_dtype) and in Q4_K (144 B / 256)
    # with --expert-dtype q4_k
    assert staged() == 4 * 4 * 3 * 256 * 256 * 2
    assert staged("--expert-dtype", "q4_k", "--dense-dtype", "q8_0") == 4 * 4 * 3 * 256 * 144
    refused = runner.invoke(app, ["evaluate", "--engine", "llamacpp", "--model",
                                  str(tmp_path / "m.gguf"), "--hardware", str(spec),
                                  "--flags", "-ngl 99", "--expert-dtype", "q4_k"])
    assert refused.exit_code != 0
    assert "--expert-dtype is for --config" in refused.output


def test_a_group_the_constants_were_fitted_without_is_predicted_with_that_fit(tmp_path):
    """Held out: a group named in host_fit.csv is predicted with the host share and spill
    rate fitted without it (one whose held-out fit differs from the fit on every group, which
    a box not in the data gets), so its host-heavy run differs from the same group's under
    another name."""
    from placer.hardware.host_fit import ALL_GROUPS, host_fits

    every = host_fits()[ALL_GROUPS]
    name, held = next((g, f) for g, f in host_fits().items() if g != ALL_GROUPS and
                      (f.share, f.spill_rate) != (every.share, every.spill_rate))
    groups = tiny_group(tmp_path)
    figures = {}
    for gid in ("tiny", name):
        groups.write_text(re.sub(r'id = "[^"]+"', f'id = "{gid}"', groups.read_text()))
        js = tmp_path / f"{gid}.json"
        bench().main(["--groups", str(groups), "--json", str(js)])
        figures[gid] = json.loads(js.read_text())["groups"][0]
    mine = figures[name]
    assert (mine["host_share"], mine["spill_rate"]) == (held.share, held.spill_rate)
    assert figures["tiny"]["host_share"] is None
    assert mine["runs"][0]["predicted"] != figures["tiny"]["runs"][0]["predicted"]
