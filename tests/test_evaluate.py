"""evaluate: every held-out token replayed, continuous batching, bootstrap intervals, verdicts,
option errors; and, where ../shared/data/routing exists, real routing from a trained model."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from real_routing import ESFT, ESFT_CONFIG, esft_trace

from placer.plan.placement import read_plan
from placer.predict.drift import calibration_counts, js_divergence, js_replicates
from placer.predict.evaluate import (
    CACHED_LINES,
    EvalOptions,
    evaluate,
    plan_placement,
    plan_problem,
    trace_verdict,
)
from solvers.cost import step_stats
from solvers.judge.intervals import (
    Estimate,
    attribute,
    ratio_estimate,
    replicate_weights,
    token_shares,
    units_of,
    verdict,
)
from traces.errors import TraceError
from traces.storing.profile import (
    every_token_steps,
    load_profile,
    sampled_token_steps,
    sequence_counts,
    step_mask,
)
from traces.storing.schema import PHASES
from traces.storing.writer import TraceWriter

LAYERS, EXPERTS, TOP_K = (0, 1, 2), 16, 2
CONFIG = {"model_type": "qwen3_moe", "architectures": ["Qwen3MoeForCausalLM"],
          "num_hidden_layers": 3, "num_experts": EXPERTS, "num_experts_per_tok": TOP_K,
          "hidden_size": 64, "moe_intermediate_size": 32, "intermediate_size": 64,
          "vocab_size": 100, "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 32,
          "torch_dtype": "bfloat16"}
BOX = Path(__file__).resolve().parent.parent / "examples" / "tiny-box.toml"


def write_trace(out: Path, seqs: list[np.ndarray], run_id: int = 3, pos_step: int = 1) -> Path:
    """out/: sequence i's token p selects seqs[i][p] ([n_i, L, k] expert ids) at each layer;
    sequences are written in reverse order of id (trace order is by id, not by file row)."""
    meta = {"kind": "tokens", "fingerprint": "feed", "num_layers": len(LAYERS),
            "moe_layers": list(LAYERS), "experts_per_layer": EXPERTS, "top_k": TOP_K,
            "tag": "t", "run_id": run_id}
    out.mkdir(parents=True, exist_ok=True)
    writer = TraceWriter(out / f"t-{run_id}.parquet", tag="t", top_k=TOP_K, meta=meta,
                         row_group_rows=64)
    for i in reversed(range(len(seqs))):
        n = len(seqs[i])
        rows = n * len(LAYERS)
        writer.write(np.full(rows, (run_id << 32) + i), np.repeat(np.arange(n) * pos_step,
                     len(LAYERS)), np.zeros(rows), np.full(rows, PHASES.index("decode")),
                     np.tile(LAYERS, n), seqs[i].reshape(-1, TOP_K), None)
    writer.close()
    return out


def random_seqs(lengths: list[int], seed: int) -> list[np.ndarray]:
    """Skewed routing: [n, L, k] distinct expert ids per token, popular experts per layer."""
    rng = np.random.default_rng(seed)
    pop = rng.dirichlet(np.full(EXPERTS, 0.3), size=len(LAYERS))
    return [np.array([[rng.choice(EXPERTS, TOP_K, replace=False, p=pop[layer])
                       for layer in range(len(LAYERS))] for _ in range(n)])
            for n in lengths]


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory, cli) -> dict:
    root = tmp_path_factory.mktemp("evaluate")
    (root / "config.json").write_text(json.dumps(CONFIG))
    calib = write_trace(root / "calib", random_seqs([20] * 10, seed=1), run_id=1)
    held_seqs = random_seqs([7, 12, 3, 9, 15, 5, 11, 8], seed=2)
    held = write_trace(root / "held", held_seqs, run_id=2, pos_step=2)
    plan = root / "plan.json"
    cli("solve", "--config", root / "config.json", "--hardware", BOX, "--traces", calib,
        "--offload", "0.5", "--concurrency", "1,3", "--solver", "greedy", "--cache", "0",
        "--out", plan)
    return {"root": root, "calib": calib, "held": held, "held_seqs": held_seqs, "plan": plan}


def test_b1_replays_every_token_once_in_sequence_order(small):
    steps = every_token_steps(small["held"], 1)
    want = np.concatenate(small["held_seqs"])  # sequence ids ascending, positions ascending
    np.testing.assert_array_equal(steps.tokens[:, 0], want)
    assert steps.tokens.dtype == np.int16
    lengths = [len(s) for s in small["held_seqs"]]
    np.testing.assert_array_equal(steps.seqs[:, 0], np.repeat((2 << 32) + np.arange(8), lengths))
    mask = step_mask(steps.tokens, EXPERTS)
    assert mask.shape == (len(want), len(LAYERS), EXPERTS)
    for s in (0, 5, len(want) - 1):
        for layer in range(len(LAYERS)):
            assert set(np.flatnonzero(mask[s, layer])) == set(want[s, layer])


def test_b1_figures_equal_a_hand_replay_token_by_token(small):
    report = evaluate(read_plan(small["plan"]), [small["held"]],
                      EvalOptions(concurrency=(1,), oracle_time_limit=1, replicates=200))
    row = report["results"][0]
    plan = read_plan(small["plan"])
    problem, placement = plan_problem(plan, []), plan_placement(plan)
    stall, staged = 0.0, 0.0
    tokens = np.concatenate(small["held_seqs"])
    for token in tokens:  # one step per token, by hand
        one = np.zeros((1, len(LAYERS), EXPERTS), dtype=bool)
        for layer in range(len(LAYERS)):
            one[0, layer, token[layer]] = True
        stats = step_stats(problem, placement, one)
        stall += float(stats.step_stall[0])
        staged += float(stats.staged_bytes.sum())
    assert row["steps"] == row["tokens"] == len(tokens)
    assert row["placement"]["stall_ms_per_step"] == pytest.approx(stall / len(tokens) * 1e3,
                                                                  rel=1e-12)
    assert row["placement"]["staged_bytes_per_token"] == pytest.approx(staged / len(tokens),
                                                                       rel=1e-12)
    assert (row["interval_units"], row["interval_over"]) == (8, "sequences")


def test_continuous_batching_uses_every_token_with_distinct_sequences(small):
    """Slot by slot, each run decodes one sequence from its first token on, in order; one
    grouping runs every sequence to its end; every step is full of distinct sequences."""
    table = np.concatenate(small["held_seqs"])
    lengths = np.array([len(s) for s in small["held_seqs"]])
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    for batch in (2, 3, 8):
        steps = every_token_steps(small["held"], batch, groupings=1, seed=batch)
        seq = steps.seqs - (2 << 32)
        assert steps.tokens.min() >= 0 and len(steps) * batch >= lengths.sum()
        assert all(len(set(row)) == batch for row in seq.tolist())
        longest = np.zeros(len(lengths), dtype=int)
        for b in range(batch):
            col = seq[:, b]
            starts = np.flatnonzero(np.r_[True, col[1:] != col[:-1]])
            for start, run in zip(starts, np.diff(np.r_[starts, len(col)]), strict=True):
                q = col[start]  # a slot may run q again right after itself: from token 0
                np.testing.assert_array_equal(steps.tokens[start:start + run, b],
                                              table[offsets[q] + np.arange(run) % lengths[q]])
                longest[q] = max(longest[q], min(run, lengths[q]))
        np.testing.assert_array_equal(longest, lengths)  # every token used
        # it stops once every token is used: the last step finishes some sequence's first run
        assert len(steps) * batch < lengths.sum() + batch * lengths.max()
    two = every_token_steps(small["held"], 3, groupings=2, seed=5)
    one = every_token_steps(small["held"], 3, groupings=1, seed=5)
    np.testing.assert_array_equal(two.tokens[:len(one)], one.tokens)
    assert len(two) > len(one) and not np.array_equal(two.seqs[len(one):2 * len(one)],
                                                      one.seqs)
    with pytest.raises(TraceError, match="only 8 sequences"):
        every_token_steps(small["held"], 9)


def test_count_only_traffic_cannot_be_replayed_token_by_token(tmp_path, cli, small):
    counts = np.random.default_rng(0).integers(1, 50, size=(len(LAYERS), EXPERTS))
    np.save(tmp_path / "c.npy", counts)
    cli("traces", "import", tmp_path / "c.npy", "--out", tmp_path / "d", "--top-k", TOP_K)
    with pytest.raises(TraceError, match="imported counts"):
        every_token_steps(tmp_path / "d", 1)
    sampled = sampled_token_steps(tmp_path / "d", 2, 20, seed=1)
    assert sampled.tokens.shape == (20, 2, len(LAYERS), TOP_K) and (sampled.seqs == -1).all()
    with pytest.raises(TraceError, match="no sequences to count"):
        sequence_counts(tmp_path / "d")
    report = json.loads(cli("evaluate", small["plan"], "--traces", tmp_path / "d",
                            "--concurrency", "1,2", "--oracle-time-limit", "1", "--json").output)
    row = report["results"][0]
    assert row["interval_over"] == "sampled steps" and row["steps"] == row["interval_units"]
    assert "interval over sampled steps" in report["notes"][0]
    (drift,) = report["drift"]
    assert drift["js_mean_bits"] > 0
    assert drift["js_mean_bits_ci95"] is None and drift["js_per_layer_bits_ci95"] is None
    assert sum("drift has no interval" in note for note in report["notes"]) == 1


def test_every_figure_has_an_interval_around_it(small, cli):
    report = json.loads(cli("evaluate", small["plan"], "--traces", small["held"],
                            "--oracle-time-limit", "1", "--json").output)
    assert report["steps"] is None and report["replay"] == "every held-out token"
    for row in report["results"]:
        for line in ("placement", "layer", "uniform", "oracle"):
            for key in ("hit_rate", "staged_bytes_per_token", "transfers_per_token",
                        "stall_ms_per_step", "tokens_per_s"):
                low, high = row[line][f"{key}_ci95"]
                assert low <= row[line][key] <= high, (row["concurrency"], line, key)
        low, high = row["ratio_to_layer_ci95"]
        assert low <= row["ratio_to_layer"] <= high
        assert row["verdict"] == verdict(row["ratio_to_layer_ci95"])
        assert row["ratio_to_oracle"] >= 1 - 1e-9
    assert report["verdicts"][0]["ok"] == all(
        r["verdict"] != "worse" and r.get("cache_verdict") != "worse" for r in report["results"])
    (drift,) = report["drift"]  # held-out routing has its own popular experts: real drift
    low, high = drift["js_mean_bits_ci95"]
    assert low < drift["js_mean_bits"] < high
    assert len(drift["js_per_layer_bits_ci95"]) == len(LAYERS)
    for point, (low, high) in zip(drift["js_per_layer_bits"], drift["js_per_layer_bits_ci95"],
                                  strict=True):
        assert low < point < high
    text = cli("evaluate", small["plan"], "--traces", small["held"],
               "--oracle-time-limit", "1", "--verbose").output  # the full tables
    assert "±" in text and "every held-out token" in text
    half = (drift["js_mean_bits_ci95"][1] - drift["js_mean_bits_ci95"][0]) / 2
    assert f"profile {drift['js_mean_bits']:.4f} ± {half:.4f} bits" in text


def test_drift_replicates_reweigh_per_sequence_counts_exactly(small):
    ids, per_seq = sequence_counts(small["held"])
    np.testing.assert_array_equal(ids, (2 << 32) + np.arange(8))
    for i, seq in enumerate(small["held_seqs"]):  # [n_i, L, k] -> [L, E] by hand
        for layer in range(len(LAYERS)):
            np.testing.assert_array_equal(
                per_seq[i, layer], np.bincount(seq[:, layer].ravel(), minlength=EXPERTS))
    profile = load_profile(small["held"])
    np.testing.assert_array_equal(per_seq.sum(axis=0), profile.counts)
    plan = read_plan(small["plan"])
    calib = calibration_counts(plan)
    weights = np.ones((3, 8))
    weights[1] = 0.0
    weights[1, 4] = 8.0  # every draw is sequence 4
    reps = js_replicates(calib, per_seq, weights)
    point = js_divergence(calib, profile.counts)
    np.testing.assert_array_equal(reps[0], point)  # all weights 1: the held-out counts
    np.testing.assert_array_equal(reps[2], point)
    np.testing.assert_array_equal(reps[1], js_divergence(calib, per_seq[4]))
    assert not np.allclose(reps[1], point)
    report = evaluate(plan, [small["held"]], EvalOptions(concurrency=(1,), oracle_time_limit=1,
                                                         replicates=50))
    assert report["drift"][0]["js_mean_bits"] == reps[0].mean()


def test_bootstrap_contains_the_estimate_and_shrinks_with_more_sequences():
    rng = np.random.default_rng(0)
    widths = []
    for n in (20, 2000):
        stall = rng.gamma(2.0, 1.0, size=n)
        tokens = rng.integers(5, 50, size=n).astype(float)
        est = ratio_estimate(stall * tokens, tokens, replicate_weights(n, 1000, seed=1))
        low, high = est.ci95()
        assert low <= est.point <= high
        widths.append(high - low)
    assert widths[1] < widths[0] / 5  # ~ 1 / sqrt(n): 10x narrower for 100x the sequences


def test_a_paired_ratio_has_the_interval_of_the_ratio():
    rng = np.random.default_rng(3)
    layer = rng.gamma(2.0, 1.0, size=50)
    weights = replicate_weights(50, 500, seed=0)
    tokens = np.full(50, 10.0)
    placement = ratio_estimate(0.5 * layer, tokens, weights)
    base = ratio_estimate(layer, tokens, weights)
    ratio = placement.ratio_to(base)
    assert (base.ci95()[1] - base.ci95()[0]) / base.point > 0.2  # each line alone is noisy ...
    np.testing.assert_allclose(ratio.ci95(), [0.5, 0.5], rtol=1e-12)  # ... their ratio is not
    # neither stalls: the same (1, not 0: a placement that ties its baseline is not better)
    tie = Estimate(0.0, np.zeros(3)).ratio_to(Estimate(0.0, np.zeros(3)))
    assert tie.point == 1.0 and tie.ci95() == [1.0, 1.0] and verdict(tie.ci95()) != "better"
    assert Estimate(1.0, np.ones(3)).ratio_to(Estimate(0.0, np.zeros(3))).point == np.inf


def test_attribution_and_units():
    seqs = np.array([[7, 9], [9, 4], [-1, -1]])
    units = units_of(seqs)
    assert (units.count, units.over) == (3, "sequences")
    np.testing.assert_array_equal(units.unit_of, [[1, 2], [2, 0], [-1, -1]])
    np.testing.assert_array_equal(units.tokens(), [1, 1, 2])
    sums = attribute(units.unit_of, np.array([[4.0], [2.0], [8.0]]), units.count)
    np.testing.assert_array_equal(sums[:, 0], [1.0, 2.0, 3.0])  # each token half its step
    shares = np.array([[[3.0], [1.0]], [[0.0], [0.0]], [[1.0], [1.0]]])
    sums = attribute(units.unit_of, np.array([[4.0], [2.0], [8.0]]), units.count, shares)
    np.testing.assert_array_equal(sums[:, 0], [1.0, 3.0, 2.0])  # 3:1, then equal where all 0
    steps = units_of(np.full((4, 2), -1))
    assert (steps.count, steps.over) == (4, "sampled steps")


def test_token_shares_split_each_expert_among_the_tokens_that_chose_it():
    # one step, B = 3, one layer, k = 2; weights over E = 4 experts
    tokens = np.array([[[[0, 1]], [[1, 2]], [[1, -1]]]], dtype=np.int16)
    weights = np.array([[[6.0, 3.0, 4.0, 100.0]]])  # expert 3 is selected by no one
    shares = token_shares(tokens, weights)[0, :, 0]
    np.testing.assert_allclose(shares, [6 + 1, 1 + 4, 1])  # expert 1's 3 split three ways
    assert shares.sum() == pytest.approx(6 + 3 + 4)  # the step's whole additive cost


def test_b3_point_figures_equal_the_mean_over_replayed_steps(small):
    plan = read_plan(small["plan"])
    report = evaluate(plan, [small["held"]], EvalOptions(concurrency=(3,), oracle_time_limit=1,
                                                         replicates=50, seed=4))
    row = report["results"][0]
    steps = every_token_steps(small["held"], 3, seed=4)
    stats = step_stats(plan_problem(plan, []), plan_placement(plan),
                       step_mask(steps.tokens, EXPERTS))
    assert row["steps"] == len(steps) and row["tokens"] == 3 * len(steps)
    assert row["placement"]["stall_ms_per_step"] == pytest.approx(
        stats.step_stall.mean() * 1e3, rel=1e-12)
    assert row["placement"]["hit_rate"] == pytest.approx(stats.hit_rate, rel=1e-12)
    assert row["placement"]["transfers_per_token"] == pytest.approx(
        stats.transfers.sum() / (3 * len(steps)), rel=1e-12)


@pytest.mark.parametrize(("ci", "want"), [([0.7, 0.99], "better"), ([1.01, 1.3], "worse"),
                                          ([0.9, 1.1], "within noise"), ([1.0, 1.0],
                                                                         "within noise")])
def test_verdict_reads_the_interval(ci, want):
    assert verdict(ci) == want


def test_trace_verdict_over_concurrencies():
    def row(b, ratio, ci):
        return {"concurrency": b, "execution": "stage", "ratio_to_layer": ratio,
                "ratio_to_layer_ci95": ci, "verdict": verdict(ci)}

    better = trace_verdict("t", [row(1, 0.5, [0.4, 0.6]), row(8, 0.8, [0.7, 0.9])])
    assert (better["verdict"], better["ok"], better["worst_ratio_to_layer"]) == (
        "better", True, 0.8)
    noisy = trace_verdict("t", [row(1, 0.5, [0.4, 0.6]), row(8, 1.02, [0.95, 1.1])])
    assert (noisy["verdict"], noisy["ok"]) == ("within noise", True)
    assert "WARNING" not in noisy["message"] and "B=8 with stage execution" in noisy["message"]
    worse = trace_verdict("t", [row(1, 1.2, [1.1, 1.3]), row(8, 1.02, [0.95, 1.1])])
    assert (worse["verdict"], worse["ok"]) == ("worse", False)
    assert worse["message"].startswith("WARNING") and "[1.100, 1.300]" in worse["message"]
    behind = row(8, 0.8, [0.7, 0.9]) | {"ratio_to_lru": 1.1, "ratio_to_lru_ci95": [1.05, 1.2],
                                        "cache_verdict": "worse"}
    lru = trace_verdict("t", [row(1, 0.5, [0.4, 0.6]), behind])
    assert (lru["verdict"], lru["ok"]) == ("worse than lru", False)
    assert lru["message"].startswith("WARNING") and "[1.050, 1.200]" in lru["message"]
    level = behind | {"ratio_to_lru_ci95": [0.95, 1.2], "cache_verdict": "within noise"}
    assert trace_verdict("t", [row(1, 0.5, [0.4, 0.6]), level])["ok"]


@pytest.mark.parametrize(("args", "message"), [
    (["--steps", "0"], "--steps must be in 1..16777216"),
    (["--steps", "-5"], "--steps must be in 1..16777216"),
    (["--seed", "-1"], "--seed must be in 0..2**31-1"),
    (["--seed", str(2**31)], "--seed must be in 0..2**31-1"),
    (["--oracle-time-limit", "-1"], "--oracle-time-limit must be a positive"),
    (["--oracle-time-limit", "nan"], "--oracle-time-limit: expected a finite number"),
    (["--cache-slots", "-1"], "--cache-slots must be in 0.."),
    (["--folds", "1"], "--folds must be >= 2"),
    (["--plot", "out.jpg"], "--plot writes a PNG"),
    (["--concurrency", "0"], "--concurrency: every value must be in 1.."),
    (["--concurrency", ""], "--concurrency: empty list"),
])
def test_option_errors_are_one_line(small, cli, args, message):
    result = cli("evaluate", small["plan"], "--traces", small["held"], *args, ok=False)
    assert result.exit_code == 1
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {message}"), result.output


@pytest.mark.skipif(not ESFT.is_dir(), reason="no ../shared/data/routing")
def test_real_routing_every_token_with_intervals(tmp_path, cli):
    calib = esft_trace("intent", tmp_path / "calib", max_tokens=2000)
    held = esft_trace("intent", tmp_path / "held", max_tokens=2000, first_sequence=64)
    plan = tmp_path / "plan.json"
    cli("solve", "--config", ESFT_CONFIG, "--hardware", "1x-rtx4090", "--traces", calib,
        "--offload", "0.35", "--concurrency", "1,8", "--solver", "greedy", "--steps", "256",
        "--out", plan)
    report = json.loads(cli("evaluate", plan, "--traces", held, "--oracle-time-limit", "2",
                            "--json").output)
    b1, b8 = report["results"]
    assert b1["tokens"] == b1["steps"] == 2000
    assert b8["tokens"] == 8 * b8["steps"] >= 4 * 2000
    for row in (b1, b8):
        low, high = row["ratio_to_layer_ci95"]
        assert low <= row["ratio_to_layer"] <= high < 1.0  # trained routing: placement pays
        assert row["verdict"] == "better"
        assert row["interval_over"] == "sequences" and row["interval_units"] >= 2


def figures_saved(monkeypatch) -> list:
    """The figures matplotlib saves from now on (still saved), in order."""
    import matplotlib.figure

    drawn = []
    save = matplotlib.figure.Figure.savefig

    def keep(fig, *args, **kwargs):
        drawn.append(fig)
        return save(fig, *args, **kwargs)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", keep)
    return drawn


def test_plot_labels_layers_and_experts_with_integer_ticks(small, cli, monkeypatch, tmp_path):
    drawn = figures_saved(monkeypatch)
    png = tmp_path / "e.png"
    cli("evaluate", small["plan"], "--traces", small["held"], "--concurrency", "1",
        "--oracle-time-limit", "1", "--plot", png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and not list(tmp_path.glob(".*"))
    axes = {ax.get_xlabel(): ax for ax in drawn[0].axes}
    ticks = [axes["MoE layer"].xaxis, axes["expert"].xaxis, axes["expert"].yaxis]
    for axis in ticks:
        locs = axis.get_majorticklocs()
        assert len(locs) >= 2 and all(float(v).is_integer() for v in locs), locs


@pytest.mark.parametrize("sets", [1, 2])
def test_plot_of_both_executions_draws_each_line_of_each_set(small, cli, monkeypatch, tmp_path,
                                                             sets):
    drawn = figures_saved(monkeypatch)
    png = tmp_path / "e.png"
    traces = [small["held"], small["calib"]][:sets]
    args = [a for t in traces for a in ("--traces", t)]
    cli("evaluate", small["plan"], *args, "--concurrency", "1", "--oracle-time-limit", "1",
        "--execution", "both", "--plot", png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    left = [ax for ax in drawn[0].axes if ax.get_xlabel() == "MoE layer"]
    assert [ax.get_title().split(":")[0] for ax in left] == [str(t) for t in traces]
    static = ("placement", "layer", "uniform", "oracle")
    want = {f"cpu: {line}" for line in static} | {f"stage: {line}"
                                                   for line in (*static, *CACHED_LINES)}
    for ax in left:
        assert sorted(h.get_label() for h in ax.get_lines()) == sorted(want)
