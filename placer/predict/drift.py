"""How far held-out traffic is from the traffic a plan was solved on: the Jensen-Shannon
divergence per layer, with a bootstrap interval over the held-out sequences."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from placer.plan.placement import Plan
from solvers.judge.intervals import MIN_UNITS, Estimate, replicate_weights
from traces.storing.profile import Profile, sequence_counts


def js_divergence(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Jensen-Shannon divergence in bits between rows of p and q ([L, E] -> [L]).

    Rows are normalised to distributions first; an all-zero row counts as uniform."""
    def norm(x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=np.float64)
        s = x.sum(axis=1, keepdims=True)
        return np.where(s > 0, x / np.where(s > 0, s, 1), 1.0 / x.shape[1])

    p, q = norm(p), norm(q)
    m = 0.5 * (p + q)

    def kl(a: np.ndarray) -> np.ndarray:
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(a > 0, a * np.log2(a / m), 0.0).sum(axis=1)

    return 0.5 * kl(p) + 0.5 * kl(q)


def js_replicates(calib: np.ndarray, per_seq: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """[R, L] Jensen-Shannon divergence in bits between `calib` [L, E] and each replicate's
    held-out counts: the sum over sequences of per_seq [n, L, E] weighted by weights [R, n]
    (a row of ones gives the held-out counts themselves). One layer at a time: temporaries
    n x E + R x E."""
    out = np.empty((len(weights), calib.shape[0]))
    for layer in range(calib.shape[0]):
        counts = weights @ per_seq[:, layer].astype(np.float64)  # [R, E]
        out[:, layer] = js_divergence(np.broadcast_to(calib[layer], counts.shape), counts)
    return out


def drift_of(calib: np.ndarray, trace_dir: Path, profile: Profile, replicates: int,
             seed: int, seq_ids: set[int] | None = None) -> tuple[dict, str | None]:
    """How far one traffic set is from the plan's calibration counts `calib` [L, E]: the
    Jensen-Shannon divergence per layer (`js_per_layer_bits`, [L]) and its mean over layers
    (`js_mean_bits`), and a note when there is no interval.

    The intervals (`<figure>_ci95`: [low, high], per layer [L, 2]) are percentile bootstrap
    intervals over the traffic's sequences, as every other figure's (`solvers.judge.intervals`):
    `replicates` resamples with replacement (seeded by `seed`), each recomputing the held-out
    counts from the per-sequence counts against the fixed calibration counts. JS from a
    finite sample is biased upward (two samples of the same traffic differ by sampling noise
    alone) and a replicate is such a sample again: the plain percentile interval is what is
    reported, not bias-corrected, and when the drift is small beside the noise it can lie
    above the point estimate. Imported count matrices have no sequences, and fewer than
    MIN_UNITS sequences are too few to resample: both intervals are None then, with a
    note. `seq_ids`: resample only these sequences (a replay's bounded sample: the
    per-sequence counts are [n, L, E]), the point figure staying over every token."""
    js = js_divergence(calib, profile.counts)
    out = {"traces": str(trace_dir), "js_mean_bits": float(js.mean()),
           "js_per_layer_bits": js.tolist()}
    if not profile.per_token:
        return ({**out, "js_mean_bits_ci95": None, "js_per_layer_bits_ci95": None},
                f"{trace_dir}: imported counts have no sequences: drift has no interval "
                f"(js_mean_bits_ci95 and js_per_layer_bits_ci95 are null)")
    _, per_seq = sequence_counts(trace_dir, seq_ids=seq_ids)
    if len(per_seq) < MIN_UNITS:
        return ({**out, "js_mean_bits_ci95": None, "js_per_layer_bits_ci95": None},
                f"{trace_dir}: {len(per_seq)} sequences, fewer than {MIN_UNITS}: drift has no "
                "interval (js_mean_bits_ci95 and js_per_layer_bits_ci95 are null)")
    reps = js_replicates(calib, per_seq, replicate_weights(len(per_seq), replicates, seed))
    return {**out, "js_mean_bits_ci95": Estimate(float(js.mean()), reps.mean(axis=1)).ci95(),
            "js_per_layer_bits_ci95": [Estimate(float(point), reps[:, layer]).ci95()
                                       for layer, point in enumerate(js)]}, None


def calibration_counts(plan: Plan) -> np.ndarray | None:
    """[L, E] selection counts the plan was solved on (all calibration profiles), or None."""
    if not plan.calibration:
        return None
    return sum(np.array(c["counts"], dtype=np.float64) for c in plan.calibration)
