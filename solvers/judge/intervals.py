"""95% intervals of replayed figures: a paired bootstrap over sequences.

A replayed decode step of B tokens has a cost (stall, staged bytes, transfers, selected
bytes). It is split among its tokens, so a sequence carries the cost of the steps it is in,
and every figure is a ratio estimator over sequences:

    stall per step   = B x sum attributed stall / tokens
    staged per token = sum attributed staged bytes / tokens     (transfers alike)
    hit rate         = 1 - sum attributed staged / sum attributed selected bytes

How a step is split (`token_shares`): each selected expert's cost (its staging time, cold
bytes, one transfer, its bytes) is shared equally by the step's tokens that selected it, the
Shapley value of a union's additive cost; the stall, which takes a max over cards, is split
in proportion to the tokens' staging-time shares. A token that alone selects a cold expert
carries its whole cost. (Equal parts, stall / B each, spread a costly sequence's effect over
its step-mates: on real routing (ESFT intent, 16 of 64 held-out sequences) the bootstrap sd
of the stall ratio to layer offload was 0.0015 at B = 8 against 0.0106 over random sequence
sets; with these shares it is 0.0119, and 0.0087 against 0.0097 at B = 1, where every split
is the whole step.)

A replicate resamples the n sequences with replacement (multinomial counts, weights
[R, n]) and recomputes each figure with those weights; the interval is the 2.5th and 97.5th
percentile of the R replicates. Every line of a row (placement, layer offload, uniform,
oracle) is weighed with the same replicate weights, so a ratio of two lines is paired: its
interval is the interval of the ratio, not a combination of two intervals. The oracle's
placement is held fixed across replicates (it is solved once, on all of the traffic).
tokens/s = B / (base + stall) is monotone, so its interval is the stall's, mapped, with the
endpoints swapped.

Count-only traffic (steps sampled from imported frequencies) has no sequences: the units
are then the sampled steps themselves ("interval over sampled steps").

Fewer than MIN_UNITS units give no interval: resampling one sequence gives it back every
time, a "95% interval" of width 0, and a handful more give intervals that are mostly luck.
Such figures keep their point estimate with a null interval (`without_intervals`), and a
stall ratio without one gets the verdict "too little traffic", not better or worse.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

REPLICATES = 1000
LOW, HIGH = 2.5, 97.5  # percentiles of a 95% interval
MIN_UNITS = 5          # resampling units (sequences) an interval needs: see module docstring
TOO_LITTLE = "too little traffic"
FIELDS = ("stall", "staged", "transfers", "selected")  # per-step sums a replay attributes


@dataclass(frozen=True)
class Units:
    """What replicates resample. unit_of: [S, B] int unit of each token of each step (-1:
    none); count: number of units; over: "sequences" or "sampled steps"."""

    unit_of: np.ndarray
    count: int
    over: str

    def tokens(self) -> np.ndarray:
        """[n] float tokens of each unit."""
        mine = self.unit_of[self.unit_of >= 0]
        return np.bincount(mine, minlength=self.count).astype(np.float64)


def units_of(seqs: np.ndarray) -> Units:
    """The resampling units of steps whose tokens belong to sequences `seqs` ([S, B] int64,
    -1: none): the distinct sequences, or each step when no token has a sequence."""
    seqs = np.asarray(seqs)
    if (seqs >= 0).any():
        ids, inverse = np.unique(seqs, return_inverse=True)
        inverse = inverse.reshape(seqs.shape)
        offset = int(ids[0] < 0)  # -1 sorts first: it is no unit
        return Units(np.where(seqs >= 0, inverse - offset, -1), len(ids) - offset, "sequences")
    num_steps, batch = seqs.shape
    return Units(np.repeat(np.arange(num_steps), batch).reshape(num_steps, batch), num_steps,
                 "sampled steps")


def replicate_weights(count: int, replicates: int = REPLICATES, seed: int = 0) -> np.ndarray:
    """[R, n] float bootstrap weights: how often each of `count` units is drawn in each of R
    resamples of `count` draws with replacement."""
    rng = np.random.default_rng(seed)
    return rng.multinomial(count, np.full(count, 1.0 / count), size=replicates).astype(
        np.float64)


def token_shares(tokens: np.ndarray, weights: np.ndarray, charged: np.ndarray | None = None
                 ) -> np.ndarray:
    """Each token's share of a step's additive costs sum_{(l, e) selected} weights[f, l, e]:
    the weight of each selected expert split equally among the step's tokens that selected it
    (the Shapley value of that cost). tokens: [c, B, L, k] expert ids (-1: none);
    weights: [F, L, E] -> [c, B, F] float. charged: [c, L, E] bool, the experts whose staging
    each step pays (a cache holds the others): every field but the last (the selected bytes)
    counts only those."""
    chunk, batch, _, _ = tokens.shape
    out = np.zeros((chunk, batch, len(weights)))
    _shares(np.ascontiguousarray(tokens), np.ascontiguousarray(weights, dtype=np.float64),
            np.zeros((0, 0, 0), dtype=np.bool_) if charged is None
            else np.ascontiguousarray(charged, dtype=np.bool_), out)
    return out


@njit(cache=True, nogil=True)
def _shares(tokens, weights, charged, out):
    """token_shares into out [c, B, F] (zeros), charged [0, 0, 0]: all paid. Step by step:
    count each (layer, expert)'s takers, then add each token's w * paid / takers in (layer,
    slot) order (numpy's arithmetic and order, the figures are the same to the bit; a
    vectorized form spent most of its time on a [c * L * E] count and 4-d index arrays)."""
    chunk, batch, layers, k = tokens.shape
    fields, _, experts = weights.shape
    takers = np.zeros((layers, experts), dtype=np.int64)
    for s in range(chunk):
        for b in range(batch):
            for layer in range(layers):
                for j in range(k):
                    if tokens[s, b, layer, j] >= 0:
                        takers[layer, tokens[s, b, layer, j]] += 1
        for b in range(batch):
            for layer in range(layers):
                for j in range(k):
                    e = tokens[s, b, layer, j]
                    if e < 0:
                        continue
                    paid = 1.0 if len(charged) == 0 or charged[s, layer, e] else 0.0
                    for f in range(fields - 1):
                        out[s, b, f] += weights[f, layer, e] * paid / takers[layer, e]
                    out[s, b, fields - 1] += weights[fields - 1, layer, e] * 1.0 / takers[layer, e]
        for b in range(batch):
            for layer in range(layers):
                for j in range(k):
                    if tokens[s, b, layer, j] >= 0:
                        takers[layer, tokens[s, b, layer, j]] = 0


def attribute(unit_of: np.ndarray, per_step: np.ndarray, count: int,
              shares: np.ndarray | None = None) -> np.ndarray:
    """Each token's part of its step's figures, summed per unit.

    unit_of: [c, B] unit of each token (-1: none); per_step: [c, F] figures of each step;
    shares: [c, B, F] how the step's figure f is split among its tokens (normalised per
    step; equal parts where None or where a step's shares are all 0). Returns [count, F]."""
    chunk, batch = unit_of.shape
    per_step = np.asarray(per_step, dtype=np.float64).reshape(chunk, -1)
    fields = per_step.shape[1]
    part = np.full((chunk, batch, fields), 1.0 / batch)
    if shares is not None:
        total = shares.sum(axis=1, keepdims=True)
        part = np.where(total > 0, shares / np.where(total > 0, total, 1.0), part)
    has = unit_of >= 0
    values = (per_step[:, None, :] * part)[has]
    return np.stack([np.bincount(unit_of[has], weights=values[:, f], minlength=count)
                     for f in range(fields)], axis=1).reshape(count, fields)


@dataclass(frozen=True)
class Estimate:
    """A figure: its point estimate and its R bootstrap replicates ([R] float)."""

    point: float
    replicates: np.ndarray

    def ci95(self) -> list[float]:
        """The replicates' 2.5th and 97.5th percentiles (NaN ones left out). Where some are
        infinite (a ratio to a line that never stalls), the percentiles are taken without
        interpolating between neighbours: numpy's linear one computes inf - inf there (a
        RuntimeWarning and a NaN bound)."""
        if np.isnan(self.replicates).all():
            return [float("nan"), float("nan")]
        finite = bool(np.isfinite(self.replicates[~np.isnan(self.replicates)]).all())
        low, high = np.nanpercentile(self.replicates, (LOW, HIGH),
                                     method="linear" if finite else "inverted_cdf")
        return [float(low), float(high)]

    def ratio_to(self, other: Estimate) -> Estimate:
        """This figure over `other`, replicate by replicate (paired): a stall over a stall,
        where neither stalling (0 / 0) is 1, the same, and stalling beside a line that never
        does is inf."""
        return Estimate(_ratio(self.point, other.point), _ratio(self.replicates,
                                                                other.replicates))


def _divide(num: np.ndarray | float, den: np.ndarray | float) -> np.ndarray | float:
    """num / den, with 0 / 0 = 0 and x / 0 = inf (as a stall ratio reads)."""
    num, den = np.asarray(num, dtype=np.float64), np.asarray(den, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.where(den > 0, num / np.where(den > 0, den, 1.0),
                       np.where(num > 0, np.inf, 0.0))
    return float(out) if out.ndim == 0 else out


def _ratio(num: np.ndarray | float, den: np.ndarray | float) -> np.ndarray | float:
    """num / den with 0 / 0 = 1 and x / 0 = inf: two stalls compared (Estimate.ratio_to)."""
    num, den = np.asarray(num, dtype=np.float64), np.asarray(den, dtype=np.float64)
    out = np.where((num == 0) & (den == 0), 1.0, _divide(num, den))
    return float(out) if out.ndim == 0 else out


def ratio_estimate(num: np.ndarray, den: np.ndarray, weights: np.ndarray) -> Estimate:
    """sum num / sum den over units ([n] each), and over each replicate's weights [R, n]."""
    return Estimate(_divide(num.sum(), den.sum()), _divide(weights @ num, weights @ den))


def line_figures(sums: np.ndarray, tokens: np.ndarray, weights: np.ndarray, batch: int,
                 base_step_s: float) -> tuple[dict, Estimate]:
    """The figures of one line of a row with their intervals, and its stall estimate (s per
    step) for paired ratios.

    sums: [n, 4] attributed per-unit sums of FIELDS; tokens: [n] tokens per unit."""
    stall, staged, transfers, selected = (sums[:, i] for i in range(len(FIELDS)))
    stall_s = ratio_estimate(stall * batch, tokens, weights)
    miss = ratio_estimate(staged, selected, weights)
    figures = {"hit_rate": 1.0 - miss.point if selected.sum() > 0 else 1.0,
               "hit_rate_ci95": [1.0 - miss.ci95()[1], 1.0 - miss.ci95()[0]]
               if selected.sum() > 0 else [1.0, 1.0]}
    for name, field in (("staged_bytes_per_token", staged), ("transfers_per_token", transfers)):
        est = ratio_estimate(field, tokens, weights)
        figures[name], figures[f"{name}_ci95"] = est.point, est.ci95()
    low, high = stall_s.ci95()
    figures["stall_ms_per_step"] = stall_s.point * 1e3
    figures["stall_ms_per_step_ci95"] = [low * 1e3, high * 1e3]
    figures["tokens_per_s"] = tokens_per_s(batch, base_step_s, stall_s.point)
    figures["tokens_per_s_ci95"] = [tokens_per_s(batch, base_step_s, high),
                                    tokens_per_s(batch, base_step_s, low)]
    return figures, stall_s


def tokens_per_s(batch: int, base_step_s: float, stall_s: float) -> float:
    step = base_step_s + stall_s
    return batch / step if step > 0 else float("inf")


def estimable(units: Units) -> bool:
    """Whether `units` are enough for an interval (MIN_UNITS; see the module docstring)."""
    return units.count >= MIN_UNITS


def without_intervals(figures: dict) -> dict:
    """`figures` with every `<figure>_ci95` null, nested dicts too (too few units for one)."""
    return {k: None if k.endswith("_ci95") else without_intervals(v) if isinstance(v, dict)
            else v for k, v in figures.items()}


def verdict(ci95: list[float] | None) -> str:
    """A stall ratio to layer offload judged by its interval: "better" when all of it is
    below 1, "worse" when all of it is above 1, TOO_LITTLE without one, else "within
    noise"."""
    if ci95 is None:
        return TOO_LITTLE
    low, high = ci95
    if high < 1.0:
        return "better"
    if low > 1.0:
        return "worse"
    return "within noise"
