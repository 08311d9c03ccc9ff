"""`bench --engine llamacpp --spec-out` without --calibrate-on: the 3 options it fits on tell
apart as many of the spec's figures as the options run can (placer/serve/llamacpp/calibrate.py
`pick`), so that the options not fitted are predicted from fitted figures, not from the
spec's."""

from __future__ import annotations

import numpy as np

from placer.serve.llamacpp.calibrate import design, fit, pick

# Each option's cost terms per decode step (predict.cost_terms) as the held-back shape's bench
# recorded them (5 MoE layers x 12 experts, top-3; benchmarks/bench_llamacpp_measured.py
# --shape held-back): layers synced, experts the CPU computes, upload copies, the rest (s).
TERMS = {"chosen": (3, 9, 0.0, 0.0), "ncmoe": (3, 9, 0.0, 0.0),
         "cmoe + cache": (5, 0, 5.3, 4e-5), "tuner 1 MiB": (5, 0, 41.2, 3.32e-4),
         "tuner 3 MiB": (5, 0, 32.1, 2.61e-4), "tuner 4 MiB": (5, 0, 12.1, 9e-5),
         "cmoe": (5, 15, 0.0, 0.0)}
SPEC = np.array([5e-3, 20e-6, 4.4e-6, 5e-6])  # base, sync, expert, latency (s): the spec's
TRUE = np.array([13e-3, 0.1, 22e-3, 5e-6])  # this box's (latency as the spec's: kept)


def rows() -> list[dict]:
    out = []
    for name, (sync, experts, copies, fixed) in TERMS.items():
        terms = {"fixed_s": fixed, "sync_s": sync, "expert_s": experts, "latency_s": copies}
        row = {"option": name, "model_terms": terms}
        row["measured_tokens_per_s"] = 1.0 / (fixed + design(row) @ TRUE)
        out.append(row)
    return out


def test_the_picked_options_fit_the_cpus_expert_time_where_options_compute_on_the_cpu():
    """Measured times that follow the cost model: calibrated on the 3 options picked, every
    other option is predicted as measured. (The pick took chosen and two cached options that
    differ only in their uploads: the expert time stayed the spec's 4.4 us, and `-cmoe`,
    which computes 15 experts a step on the CPU, was predicted 1.64x too fast.)"""
    data = rows()
    names = pick(data)
    assert len(names) == 3 and names[0] == "chosen"
    figures = fit(data, names, SPEC)
    assert np.allclose(figures, TRUE, rtol=1e-9)
    for row in data:
        predicted = 1.0 / (row["model_terms"]["fixed_s"] + design(row) @ figures)
        assert abs(predicted / row["measured_tokens_per_s"] - 1) < 1e-9, row["option"]


def test_the_pick_takes_every_option_where_there_are_no_more_than_three():
    data = rows()[:3]
    assert set(pick(data)) == {"chosen", "ncmoe", "cmoe + cache"}
