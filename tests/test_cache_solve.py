"""`placer solve --cache auto|N|0` end to end on a tiny model: the plan and manifest carry the
split, every card stays within its budget, emit and verify take it, and where no cache can
be predicted auto says why and N is refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from solvers.cache.choice import CHOICES

pytest_plugins = ["fixtures_models"]
REPO = Path(__file__).resolve().parent.parent
BOX = REPO / "examples" / "tiny-box.toml"


@pytest.fixture(scope="module")
def solved(tmp_path_factory: pytest.TempPathFactory, trace_models, collected, placer_run):
    root = tmp_path_factory.mktemp("cache-solve")
    model, traces = trace_models["qwen3_moe"], collected[("qwen3_moe", "score")]
    common = ["--model", model, "--hardware", BOX, "--traces", traces, "--offload", "0.5",
              "--concurrency", "1,2", "--solver", "greedy"]
    out = {"model": model, "traces": traces, "root": root, "common": common}
    for name, cache in (("auto", "auto"), ("three", "3"), ("none", "0")):
        out[name] = root / f"{name}.json"
        placer_run("solve", *common, "--cache", cache, "--out", out[name])
    return out


def cards(path: Path) -> list[dict]:
    return json.loads(path.read_text())["cards"]


@pytest.mark.parametrize("name", ["auto", "three", "none"])
def test_every_card_fits_pins_slots_and_staging_in_its_budget(solved, name):
    for c in cards(solved[name]):
        cached = c["cache_slots"] * c["slot_bytes"]
        assert c["resident_bytes"] + cached + c["staging_bytes"] <= c["budget_bytes"]
        assert c["capacity_bytes"] == c["budget_bytes"] - c["staging_bytes"] - cached
        assert sum(c["layer_slots"]) == c["cache_slots"]


def chosen_policy(cache: dict) -> dict:
    """The plan's policy row (--cache-policy auto), checked to be the least of its table
    unless the guard replaced it (then the one it names was), the split's own policy (lfru
    per layer) giving the chosen candidate's figure."""
    policies = cache["policies"]
    assert {(r["policy"], r["pooled"]) for r in policies if r["plan"] == "split"} == {
        (name, pooled) for name in CHOICES for pooled in (False, True)}
    (row,) = [r for r in policies if r["chosen"]]
    assert (row["policy"], row["pooled"]) == (cache["policy"], cache["pooled"])
    least = min(policies, key=lambda r: r["held_out_objective"])
    if cache["guard"] is not None and cache["guard"]["switched"]:  # not backed by the renamed
        assert cache["guard"]["instead_of"] == [least["plan"], least["policy"], least["pooled"]]
        found = cache["guard"]
        engine = (least["policy"] in ("lru", "lfuda") and not least["pooled"]
                  and least["plan"] == found["served"][0])  # the guard's engines: one plan's
        # above the better engine on the renamed folds, or (not an engine) under 5% below it
        # or its renamed interval's top more than 5% above it (solvers/cache/choice.py)
        gain = found["min_gain"]
        assert found["renamed_ratio_ci95"][0] > 1.0 or (not engine and (
            found["objective_ratio"] > 1.0 - gain or found["renamed_ratio_ci95"][1] > 1.0 + gain))
        assert not row["pooled"] and row["policy"] == found["engine"]  # that engine serves
    else:
        assert row["held_out_objective"] == least["held_out_objective"]
    (split,) = [r for r in policies if (r["plan"], r["policy"], r["pooled"]) == (
        row["plan"], "lfru", False)]  # the pins and slots served, under the table's policy
    (candidate,) = [r for r in cache["candidates"] if r["chosen"]]
    assert split["held_out_stall_ms_per_step"] == pytest.approx(  # (see test_cache_split)
        candidate["held_out_stall_ms_per_step"], rel=0.05)
    assert cache["held_out_stall_ms_per_step"] == row["held_out_stall_ms_per_step"]
    return row


def test_auto_splits_and_records_how(solved):
    plan = json.loads(solved["auto"].read_text())
    cache = plan["cache"]
    assert cache["mode"] == "auto" and cache["policy_choice"] == "auto"
    chosen_policy(cache)
    assert all(c["cache_slots"] > 0 and c["cache_policy"] == cache["policy"]
               for c in plan["cards"])
    params = plan["cache_params"]
    if cache["policy"] == "learned" or cache["pooled"]:
        assert params["pooled"] == cache["pooled"]
        assert (params["weights"] is not None) == (cache["policy"] == "learned")
    else:
        assert params is None
    assert plan["solver"]["name"] == "split" and plan["solver"]["bound"] is None
    rows = cache["candidates"]
    assert {r["kind"] for r in rows} == {"static", "cache", "split", "slots"}
    (chosen,) = [r for r in rows if r["chosen"]]
    assert chosen["name"] == cache["chosen"]
    if cache["guard"] is not None and cache["guard"]["switched"] and \
            next(r for r in cache["policies"] if r["chosen"])["plan"] == "plain cache":
        assert chosen["kind"] == "cache"  # the guard's: the plain cache's pins and slots
    else:
        assert chosen["held_out_stall_ms_per_step"] == min(r["held_out_stall_ms_per_step"]
                                                           for r in rows)
    assert plan["solver"]["objective"] * 1e3 == pytest.approx(
        cache["held_out_stall_ms_per_step"], rel=1e-12)
    curve = [r for r in rows if r["kind"] == "slots"]
    assert [r["slots_share"] for r in curve] == [0.25, 0.5, 0.75, 1.0]
    for r in curve:  # what the split would use: that many slots in each layer of each card
        assert r["slots"] == r["slots_per_layer"] * 3 * 2
    assert plan["cache"]["slots"] == [c["cache_slots"] for c in plan["cards"]]


def test_robust_regret_is_a_ratio_in_the_table_the_json_and_the_plan(solved, placer_run):
    """Under --robust the objective is the mean over scenarios of stall / that scenario's
    plain-cache stall: the plain cache's own regret is 1, the stall stays in ms/step."""
    plan_path = solved["root"] / "robust.json"
    result = placer_run("solve", *solved["common"], "--robust", "--out", plan_path,
                        "--verbose")  # the full tables
    plan = json.loads(plan_path.read_text())
    cache = plan["cache"]
    rows = {r["kind"]: r for r in cache["candidates"]}
    assert rows["cache"]["held_out_regret"] == pytest.approx(1.0, rel=1e-12)
    (chosen,) = [r for r in cache["candidates"] if r["chosen"]]
    if cache["guard"]["switched"] and cache["guard"]["served"][0] == "plain cache":
        assert chosen["kind"] == "cache"  # the guard's: the plain cache's pins and slots
    else:
        assert chosen["held_out_regret"] == min(r["held_out_regret"]
                                                for r in cache["candidates"])
    policy = chosen_policy(cache)  # the policy served the split: its regret no worse
    assert cache["held_out_regret"] == policy["held_out_objective"]
    if not cache["guard"]["switched"]:  # (else an engine's, which may be above lfru's 1)
        assert policy["held_out_objective"] <= chosen["held_out_regret"] <= 1.0
    if plan["solver"]["name"] == "split":
        assert plan["solver"]["objective"] == cache["held_out_regret"]
        assert plan["solver"]["objective_unit"].startswith("ratio")
    assert f"regret {cache['held_out_regret']:.4f} (mean stall / the plain cache's)" in \
        result.output
    renamed = cache["held_out_unlike_stall_ms_per_step"]
    assert renamed == policy["held_out_unlike_stall_ms_per_step"] > 0
    assert f"{renamed:.4f} on the same folds with experts renamed" in result.output
    assert all(r["held_out_unlike_stall_ms_per_step"] is not None for r in cache["candidates"])
    default = json.loads(solved["auto"].read_text())["cache"]  # its choice and the plain cache
    renamed = {r["name"]: r["held_out_unlike_stall_ms_per_step"] for r in default["candidates"]
               if r["held_out_unlike_stall_ms_per_step"] is not None}
    least = min(default["candidates"], key=lambda r: r["held_out_stall_ms_per_step"])
    assert set(renamed) == {least["name"], "plain cache"}  # the table's pick, the plain cache
    served = chosen_policy(default)  # the renamed figure of the policy that serves it
    assert default["held_out_unlike_stall_ms_per_step"] == served[
        "held_out_unlike_stall_ms_per_step"] > 0
    assert "seconds of stall" not in result.output.split("cache:")[0] or plan["solver"][
        "name"] != "split"
    printed = json.loads(placer_run("solve", *solved["common"], "--robust", "--out",
                                    solved["root"] / "robust2.json", "--json").output)
    assert printed["cache"]["held_out_regret"] == cache["held_out_regret"]


@pytest.fixture(scope="module")
def pinned_traffic(tmp_path_factory: pytest.TempPathFactory, trace_models, placer_run):
    """Tokens that select expert 0 and expert 4 (one per card) in every layer: pins hold
    them from the first token, a cache misses them once per fold: static is the best
    candidate of the split."""
    root = tmp_path_factory.mktemp("pinned")
    ids = np.zeros((400, 3, 2), dtype=np.int16)
    ids[:, :, 1] = 4
    np.savez(root / "hot.npz", expert_ids=ids, seq_lens=np.full(40, 10))
    config = trace_models["qwen3_moe"] / "config.json"
    placer_run("traces", "import", root / "hot.npz", "--format", "tokens", "--config", config,
               "--out", root / "traces", "--tag", "hot")
    return {"root": root, "config": config, "traces": root / "traces"}


@pytest.mark.parametrize("solver", ["greedy", "ilp"])
def test_auto_places_its_static_candidate_with_the_solver_asked(pinned_traffic, placer_run,
                                                                solver):
    out = pinned_traffic["root"] / f"{solver}.json"
    placer_run("solve", "--config", pinned_traffic["config"], "--hardware", BOX, "--traces",
               pinned_traffic["traces"], "--offload", "0.5", "--concurrency", "1,2",
               "--solver", solver, "--time-limit", "5", "--out", out)
    plan = json.loads(out.read_text())
    assert plan["cache"]["mode"] == "auto" and plan["cache"]["chosen"] == "static"
    assert plan["solver"]["name"] == solver
    said = ("--time-limit 5 bounded that solver, not the replays" if solver == "ilp"
            else "--time-limit does not apply to it")
    assert f"static placement, placed by --solver {solver}; {said}" in plan["solver"]["note"]
    assert all(c["cache_slots"] == 0 for c in plan["cards"])
    pins = np.array([[e["card"], e["layer"], e["expert"]] for e in plan["experts"]
                     if e["resident_bytes"] > 0])
    for layer in plan["model"]["moe_layers"]:  # the hot experts are pinned
        assert {0, 4} <= set(pins[pins[:, 1] == layer, 2].tolist())


def test_robust_hedges_the_pins_against_traffic_unlike_the_calibration(pinned_traffic,
                                                                      placer_run):
    """On the hot traffic static wins its own folds; renamed, its pins hold two experts the
    traffic never asks for, and a cache takes each new hot expert once per fold: --robust
    (one trace set, one concurrency: the renamed twin is the second scenario) gives up the
    pins for slots, and its renamed stall is below static's."""
    out = pinned_traffic["root"] / "robust.json"
    placer_run("solve", "--config", pinned_traffic["config"], "--hardware", BOX, "--traces",
               pinned_traffic["traces"], "--offload", "0.5", "--concurrency", "1", "--robust",
               "--out", out)
    cache = json.loads(out.read_text())["cache"]
    rows = {r["kind"]: r for r in cache["candidates"]}
    assert rows["static"]["held_out_stall_ms_per_step"] < rows["cache"][
        "held_out_stall_ms_per_step"]
    assert cache["chosen"] != "static" and all(c > 0 for c in cache["slots"])
    assert cache["held_out_unlike_stall_ms_per_step"] < rows["static"][
        "held_out_unlike_stall_ms_per_step"]


def test_a_split_with_slots_says_solver_and_time_limit_did_not_apply(solved, placer_run):
    """make demo's old trap: --solver ilp --time-limit 2 with the default --cache auto gives
    a split with cache slots, chosen by replays that neither option touches: the summary,
    the tables and the plan say so; --help says what each bounds; --cache 0 has no note."""
    out = solved["root"] / "ilp.json"
    common = [a for a in solved["common"] if a not in ("--solver", "greedy")]
    result = placer_run("solve", *common, "--solver", "ilp", "--time-limit", "2", "--out", out)
    plan = json.loads(out.read_text())
    assert plan["solver"]["name"] == "split" and all(c["cache_slots"] for c in plan["cards"])
    note = plan["solver"]["note"]
    assert note.startswith("--solver ilp and --time-limit 2 did not apply: the cache split's "
                           "replays (") and note.endswith("--cache 0 asks for a static "
                                                          "placement by --solver")
    assert "note: --solver ilp and --time-limit 2 did not apply" in result.output
    assert "note: --solver ilp and --time-limit 2 did not apply" in \
        out.with_suffix(".txt").read_text()
    assert "note" not in json.loads(solved["none"].read_text())["solver"]
    helped = " ".join(placer_run("solve", "--help").output.replace("│", " ").split())
    assert "the cache split's replays (--cache auto or N) are not bounded by it" in helped
    assert "a split with cache slots is chosen by replays instead" in helped


def test_a_fixed_count_gives_every_card_that_many_and_zero_none(solved):
    assert [c["cache_slots"] for c in cards(solved["three"])] == [3, 3]
    none = json.loads(solved["none"].read_text())
    assert none["cache"] == {"mode": "off", "reason": "--cache 0"}
    assert all(c["cache_slots"] == 0 and c["cache_policy"] is None for c in none["cards"])


def test_emit_verify_and_the_manifest_carry_the_split(solved, placer_run):
    out = solved["root"] / "placed"
    placer_run("emit", "--plan", solved["auto"], "--model", solved["model"], "--out", out)
    placer_run("verify", out, "--model", solved["model"])
    manifest = json.loads((out / "manifest.json").read_text())
    assert [c["layer_slots"] for c in manifest["cards"]] == [
        c["layer_slots"] for c in cards(solved["auto"])]


def test_where_no_cache_is_predicted_auto_says_why_and_n_is_refused(solved, placer_run):
    plan = solved["root"] / "cpu.json"
    placer_run("solve", *solved["common"], "--execution", "cpu", "--out", plan)
    cache = json.loads(plan.read_text())["cache"]
    assert cache["mode"] == "off" and "--execution cpu" in cache["reason"]
    for extra, said in ((["--execution", "cpu"], "under --execution cpu"),
                        (["--steps", "64"], "in the order served"),
                        (["--page-size", "1KiB"], "--page-size")):
        result = placer_run("solve", *solved["common"], *extra, "--cache", "2", "--out",
                            solved["root"] / "refused.json", ok=False)
        assert result.exit_code == 1, result.output
        assert result.output.startswith("error: --cache 2: ") and said in result.output
        assert len(result.output.strip().splitlines()) == 1
    assert not (solved["root"] / "refused.json").exists()


@pytest.mark.parametrize(("value", "said"), [("abc", "--cache must be auto or in 0..16777216"),
                                              ("-1", "--cache must be auto or in 0.."),
                                              ("99999999999", "--cache must be auto")])
def test_bad_cache_values_are_one_line(solved, placer_run, value, said):
    result = placer_run("solve", *solved["common"], "--cache", value, "--out",
                        solved["root"] / "bad.json", ok=False)
    assert result.exit_code == 1 and said in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_the_plan_check_refuses_a_cache_that_does_not_fit(solved, placer_run, tmp_path):
    base = json.loads(solved["auto"].read_text())
    card = base["cards"][0]
    cases = [({"layer_slots": [*card["layer_slots"][:-1], card["layer_slots"][-1] + 1]},
              "layer_slots: they sum to"),
             ({"slot_bytes": 1}, "slot_bytes: 1, but card 0 homes an expert"),
             ({"cache_policy": "fifo"}, "cache_policy: expected one of"),
             ({"cache_slots": 0, "layer_slots": []}, "expected null without cache slots"),
             ({"budget_bytes": card["resident_bytes"] + card["staging_bytes"]},
              "over its budget")]
    for change, said in cases:
        plan = json.loads(json.dumps(base))
        plan["cards"][0].update(change)
        plan["cards"][0].pop("capacity_bytes")
        path = tmp_path / "mutated.json"
        path.write_text(json.dumps(plan))
        result = placer_run("evaluate", path, "--traces", solved["traces"], ok=False)
        assert result.exit_code == 1 and said in result.output, (change, result.output)


@pytest.mark.parametrize("batch", [1, 2, 3])
def test_a_fold_is_batched_from_the_single_steps_as_a_read_of_its_sequences_would_be(solved,
                                                                                   batch):
    """The split's folds at B > 1 come from the B = 1 steps already loaded, not from reading
    the trace again: the very steps every_token_steps gives for those sequences."""
    from traces.storing.profile import batched_steps, every_token_steps, split_sequences

    single = every_token_steps(solved["traces"], 1, groupings=1, seed=3)
    for ids in split_sequences(solved["traces"], 2, seed=3):
        want = every_token_steps(solved["traces"], batch, groupings=1, seed=3, seq_ids=ids)
        got = batched_steps(single, batch, 3, ids)
        np.testing.assert_array_equal(got.tokens, want.tokens)
        np.testing.assert_array_equal(got.seqs, want.seqs)


def test_a_forced_policy_is_kept_and_evaluate_prints_the_plans_policy_beside_lru_and_lfuda(
        solved, placer_run):
    """--cache-policy NAME serves the split with NAME, nothing chosen; evaluate replays the
    plan under its own policy (and cache_params) beside the plain lru and lfuda caches and
    belady, each with its interval."""
    forced = solved["root"] / "lru.json"
    placer_run("solve", *solved["common"], "--cache-policy", "lru", "--out", forced)
    plan = json.loads(forced.read_text())
    assert plan["cache"]["policy"] == "lru" and plan["cache"]["policy_choice"] == "forced"
    assert plan["cache"]["policies"] == [] and plan["cache_params"] is None
    assert all(c["cache_policy"] == "lru" for c in plan["cards"] if c["cache_slots"])
    auto = json.loads(solved["auto"].read_text())["cache"]
    for path, policy in ((forced, "lru"), (solved["auto"], auto["policy"])):
        report = json.loads(placer_run("evaluate", path, "--traces", solved["traces"],
                                       "--concurrency", "1", "--json").output)
        row = report["results"][0]
        assert row["cache"]["placement"]["policy"] == policy
        assert row["cache"]["lfuda"]["policy"] == "lfuda"
        assert row["cache"]["lfuda"]["slots"] == row["cache"]["lru"]["slots"]
        for line in ("lru", "lfuda", "belady"):
            assert row[f"ratio_to_{line}_ci95"] is not None
        assert row["better_baseline"] in ("lru", "lfuda", "oracle")
    printed = placer_run("evaluate", solved["auto"], "--traces", solved["traces"],
                         "--concurrency", "1", "--verbose").output
    assert auto["policy"] in printed and "/ lfuda " in printed  # (the table wraps names)


def test_first_steps_keeps_a_prefix_of_about_most_selections():
    from placer.plan.solve import first_steps
    from traces.storing.profile import TokenSteps

    tokens = np.zeros((10, 2, 3, 4), dtype=np.int16)  # 10 steps of 24 selections
    tokens[9, 1] = -1  # the last step has one token
    steps = TokenSteps(tokens, np.zeros((10, 2), dtype=np.int64))
    assert first_steps(steps, 228) is steps  # 9 * 24 + 12 selections: all kept
    cut = first_steps(steps, 100)
    assert len(cut) == int(10 * 100 / 228) == 4
    assert np.array_equal(cut.tokens, tokens[:4]) and np.array_equal(cut.seqs, steps.seqs[:4])
    assert len(first_steps(steps, 1)) == 1


def test_a_large_calibration_is_predicted_on_its_first_steps_and_says_so(solved, placer_run,
                                                                         monkeypatch):
    import placer.plan.solve as solve

    full = json.loads(solved["three"].read_text())["predicted"]
    assert all("judged_steps" not in r for r in full)
    monkeypatch.setattr(solve, "PREDICT_KEYS", 500)
    out = solved["root"] / "cut.json"
    done = placer_run("solve", *solved["common"], "--cache", "3", "--out", out, "--verbose")
    cut = json.loads(out.read_text())["predicted"]
    for before, after in zip(full, cut, strict=True):
        kept, steps = after["judged_steps"]
        assert 1 <= kept < steps
        assert (f"B={after['concurrency']} predicted on its first {kept} of {steps} steps"
                in " ".join(done.output.split()))
        assert after["placement"] != before["placement"]  # the figures of fewer steps
    plan = json.loads(out.read_text())
    plan["predicted"][0]["judged_steps"] = [0]
    out.write_text(json.dumps(plan))
    result = placer_run("evaluate", out, "--traces", solved["traces"], ok=False)
    assert result.exit_code == 1 and "judged_steps" in result.output, result.output


def test_the_learned_policy_asked_by_name_is_fitted_as_auto_fits_it(solved, placer_run):
    """--cache-policy learned, listed in --help, was always refused ("needs its weights"): now
    the split is priced under lfru, as auto's is, and the learned weights fitted to it, judged
    per layer and pooled on the same held-out folds (the better serves: no guard, it was asked
    for), and shipped in the plan; evaluate replays the plan with them."""
    out = solved["root"] / "learned.json"
    placer_run("solve", *solved["common"], "--cache-policy", "learned", "--out", out)
    plan = json.loads(out.read_text())
    cache, params = plan["cache"], plan["cache_params"]
    assert cache["policy"] == "learned" and cache["policy_choice"] == "forced"
    assert cache["guard"] is None
    assert [(r["plan"], r["policy"], r["pooled"]) for r in cache["policies"]] == [
        ("split", "learned", False), ("split", "learned", True)]
    (row,) = [r for r in cache["policies"] if r["chosen"]]
    assert row["held_out_objective"] == min(r["held_out_objective"] for r in cache["policies"])
    assert row["pooled"] == cache["pooled"] == params["pooled"]
    assert cache["held_out_stall_ms_per_step"] == row["held_out_stall_ms_per_step"]
    assert all(c["cache_policy"] == "learned" for c in plan["cards"] if c["cache_slots"])
    layers, experts = len(plan["model"]["moe_layers"]), plan["model"]["experts_per_layer"]
    assert np.shape(params["weights"]) == (layers, 7)
    assert np.shape(params["calibration"]) == (layers, experts)
    report = json.loads(placer_run("evaluate", out, "--traces", solved["traces"],
                                   "--concurrency", "1", "--json").output)
    (result,) = report["results"]
    assert result["cache"]["placement"]["policy"] == "learned"
    assert result["cache"]["placement"]["pooled"] == cache["pooled"]
