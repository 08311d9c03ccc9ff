"""Which cache policy serves a split: the row of least held-out objective, guarded by the
same folds with their experts renamed.

Rows. Each policy of `choices` (CHOICES, the rows of solvers/cache_table.py that auto tries;
or the one fitted policy a user named), per layer and pooled (one pool of each card's slots
that every layer shares), serves the split's pins and slots; where the split is not the plain
cache, each of them but a fitted one also serves the plain cache's (the whole budget as even
per-layer slots, nothing pinned), among them the engines' own caches, ENGINE_CACHES per
layer. A row is judged fold by fold: for each held-out entry, the plan the split judged there
(chosen on the other units), its pins ranked as the split ranked them for that entry, its
misses counted on the entry itself; a fitted policy's weights for an entry are fitted on
that entry's training entries only (solvers/cache/learn.py; the pooled row runs the same
weights). The row of least held-out objective (the split's: the stall, or the regret under
--robust) is the objective's pick; where it is a fitted policy, its weights are then fitted
on every calibration fold (`with_weights`).

The guard, where the engines are rows (the plain cache's, or the split's where the split is
the plain cache). Every row is also judged on traffic unlike the calibration: the held-out
folds with each layer's experts renamed (the --robust twins, or by default the same renaming
applied here; solvers/cache/costs.py `unlike`). The pick's renamed stall is compared with the
better engine's there: the paired ratio over the folds, with a 95% t interval from the fold
by fold ratios. The pick serves unless one of its tests fires (`guard` says which, in order):

- ABOVE (a): it stalls more than the better engine beyond the interval (issue #42's test of
  the plan served, on the renamed folds);
- SMALL_GAIN (b): not an engine, its held-out objective is less than MIN_GAIN below the least
  engine row's (which policy is best moves between tasks by a few percent, which the renamed
  folds cannot show: a smaller gain is not taken for one);
- LOOSE (c): not an engine, the interval's top is above 1 + MIN_GAIN (folds too few or too
  unlike each other to bound its loss to the engines by the gain asked of it do not back it).

Where one fires, the better engine on the renamed folds serves: not the next row the same
folds liked, since the folds were wrong about the pick and the rows they rank next gained on
the same calibration. docs/cache-split.md ("The default", and the tables of the guard's
rules and of the cases checked apart) has the cases each test and MIN_GAIN were set and
checked on, and the rules this one replaced.

Cost: one replay per row, held-out entry and renaming (its own fold and, by default where the
guard runs, its renamed copy), and one fit of a fitted policy per training set. Beyond
POLICY_KEYS requests in all, each fold is judged on its first steps only (a prefix, the same
for every row), and the figures are scaled to the split's: a row's stall is the split's times
its ratio to the split's own policy on the prefix (ratios between rows, the guard's, are
unscaled).
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

import numpy as np
from scipy.stats import t as student

from solvers.cache import make_policy
from solvers.cache.costs import CostTable, first, pins_of
from solvers.cache.learn import fit_learned
from solvers.cache.replay import Requests
from solvers.cache_table import AUTO_POLICIES, policy_row

CHOICES = AUTO_POLICIES  # the policies auto judges: solvers/cache_table.py's rows marked auto
ENGINE_CACHES = ("lru", "lfuda")  # the engines' own caches: per layer, the whole budget, no pins
SPLIT, PLAIN = "split", "plain cache"  # whose pins and slots a row serves
POLICY_KEYS = 1e8     # requests the choice replays at most (beyond: a prefix of each fold)
FIT_KEYS = 2.4e7      # requests the held-out fits of the learned weights replay per round
MIN_GAIN = 0.05       # a pick other than an engine: below the engines' objective by this much
ABOVE, SMALL_GAIN, LOOSE = "above", "small_gain", "loose_interval"  # the guard's tests, in order


class Row(NamedTuple):
    """One way to serve: `policy`, per layer or `pooled`, on `plan`'s pins and slots (SPLIT or
    PLAIN). (A tuple: (plan, policy, pooled).)"""

    plan: str
    policy: str
    pooled: bool


@dataclass(frozen=True)
class PolicyChoice:
    """The chosen policy (`name`, `pooled`; learned: `weights` [L, 7], `calibration` [L, E]
    and `transition` [L, E, E]) serving `plan`'s pins and slots (SPLIT: the chosen
    candidate's; PLAIN: the plain cache's), its held-out `stall_s` (and on renamed folds
    `unlike_stall_s`), `objective`, the share of each fold replayed (`judged`, 1: all of it),
    every row and the `guard`'s finding (None where it could not run: no plain cache among
    the candidates)."""

    name: str
    pooled: bool
    stall_s: float
    objective: float
    unlike_stall_s: float | None
    judged: float
    weights: np.ndarray | None = None
    calibration: np.ndarray | None = None
    transition: np.ndarray | None = None  # learned: [L, E, E] (solvers/cache/learn.py)
    rows: list[dict] = field(default_factory=list)
    plan: str = SPLIT
    guard: dict | None = None


@dataclass(frozen=True)
class Folds:
    """What the rows are judged on: the split's cost `table` (its entries: the held-out folds
    of every scenario) and per entry [F] the objective's `weight`, the stall's `share` and
    whether it is a `renamed` twin (--robust); the split's own held-out stall `split_stall`;
    the `seed` of the renaming and of the fits."""

    table: CostTable
    weight: np.ndarray
    share: np.ndarray
    renamed: np.ndarray
    split_stall: float
    seed: int = 0

    @property
    def own_share(self) -> np.ndarray:
        """[F] the stall's share of each entry of the calibration's own folds."""
        return self.share * ~self.renamed


@dataclass(frozen=True)
class Served:
    """The pins and slots rows of `plan` (SPLIT or PLAIN) serve, per held-out entry n: the
    plan judged there (`plans[n]`, with p and q [C, L]) and its pins (`pins[n]` [L, E])."""

    plan: str
    plans: dict[int, Any]
    pins: dict[int, np.ndarray]


def entry_pins(table: CostTable, n: int, p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """[L, E] the pins of p[c, l] per (card, layer) for entry n, ranked as the split ranked
    them for that entry (on its training entries, under the layer's q slots)."""
    home = table.problem.home
    pinned = np.zeros(home.shape, dtype=bool)
    for slots in np.unique(q):
        pinned |= pins_of(table.rank(n, int(slots)), first(np.where(q == slots, p, 0),
                                                           home.shape[1]), home)
    return pinned


def prefix(requests: Requests, share: float) -> Requests:
    """The first steps of `requests` holding about `share` of its requests (at least one)."""
    steps, layers, experts = requests.shape
    if share >= 1.0:
        return requests
    cut = int(np.searchsorted(requests.offsets, share * len(requests.keys), side="right"))
    keep = max(1, cut // layers)
    tokens = requests.tokens if np.ndim(requests.tokens) == 0 else requests.tokens[:keep]
    return Requests(requests.keys[:requests.offsets[keep * layers]],
                    requests.offsets[:keep * layers + 1], (keep, layers, experts), tokens)


def paired_ratio(mine: np.ndarray, other: np.ndarray, share: np.ndarray
                 ) -> tuple[float, float, float]:
    """(ratio, low, high): sum(share * mine) / sum(share * other) over the entries, with a
    95% t interval from the entries' own ratios (paired: the same folds; one entry: none)."""
    ratio = float(share @ mine) / max(float(share @ other), 1e-300)
    each = mine / np.maximum(other, 1e-300)
    if len(each) < 2:
        return ratio, ratio, ratio
    half = float(student.ppf(0.975, len(each) - 1) * each.std(ddof=1) / np.sqrt(len(each)))
    return ratio, ratio - half, ratio + half


def guard(objective: dict[Row, float], twin: dict[Row, np.ndarray], share: np.ndarray,
          chosen: Row, plan: str = PLAIN) -> tuple[Row, dict]:
    """The row to serve and what the guard found (module docstring). The engines are
    `plan`'s rows of ENGINE_CACHES per layer; `objective`: each row's held-out objective;
    `twin`: each row's stall on the renamed folds ([entries], weighed by `share`). The
    objective's pick `chosen` serves unless a test fires (`fired`: ABOVE, SMALL_GAIN, LOOSE,
    those that did, in that order; `why`: the first's reason); else the better engine on the
    renamed folds serves."""
    engines = [Row(plan, name, False) for name in ENGINE_CACHES]
    best = min(engines, key=lambda r: float(share @ twin[r]))

    def ratio(row: Row) -> tuple[float, float, float]:
        return paired_ratio(twin[row], twin[best], share)

    mine, low, high = ratio(chosen)
    gain = objective[chosen] / max(min(objective[e] for e in engines), 1e-300)
    engine = chosen in engines
    tests = {ABOVE: (low > 1.0, "above the better engine on the renamed folds"),
             SMALL_GAIN: (not engine and gain > 1.0 - MIN_GAIN,
                          f"less than {MIN_GAIN:.0%} below the engines on its own folds"),
             LOOSE: (not engine and high > 1.0 + MIN_GAIN,
                     f"the renamed folds do not bound its loss to them under {MIN_GAIN:.0%}")}
    fired = [name for name, (failed, _) in tests.items() if failed]
    pick = best if fired else chosen
    served, served_low, served_high = ratio(pick)
    return pick, {"engine": best[1], "renamed_ratio": mine, "renamed_ratio_ci95": [low, high],
                  "objective_ratio": gain, "min_gain": MIN_GAIN, "switched": pick != chosen,
                  "fired": fired, "why": tests[fired[0]][1] if fired else None,
                  "instead_of": None if pick == chosen else list(chosen),
                  "served": list(pick),
                  "served_renamed_ratio": served,
                  "served_renamed_ratio_ci95": [served_low, served_high]}


def choose_policy(folds: Folds, choices: tuple[str, ...], split: list,
                  plain: list | None = None, split_is_plain: bool = False) -> PolicyChoice:
    """The row of least held-out objective, guarded (module docstring), among `choices` on
    the split's pins and slots, whose per-unit plans `split` are ([(held-out entries [F]
    bool, plan with p, q [C, L])], as the split judged them), and on the plain cache's per-unit
    plans `plain` (None where the split is the plain cache, `split_is_plain`, or there is
    none: then the guard does not run)."""
    rows = rows_of(choices, plain is not None)
    engines = PLAIN if plain is not None else SPLIT if split_is_plain else None
    guarded = engines is not None and set(ENGINE_CACHES) <= set(choices)
    twins = guarded and not folds.renamed.any()  # by default the renamed copies are replayed
    sets = {SPLIT: split, PLAIN: plain}
    serving = {name: served(folds.table, name, sets[name]) for name in dict.fromkeys(
        row.plan for row in rows)}
    judged = judged_share(folds, rows, serving, 2 if twins else 1)
    base = Row(SPLIT, folds.table.problem.policy, False)  # the split's own: scales the prefix
    replayed = rows + ([base] if judged < 1.0 and base not in rows else [])
    stall = replay_rows(folds, replayed, serving, judged, twins)
    base_stall = float(folds.own_share @ stall[base][False]) if base in stall else 0.0
    scale = folds.split_stall / base_stall if base_stall > 0 and judged < 1.0 else 1.0
    figures = [row_figures(folds, row, stall[row], twins, scale) for row in rows]
    best = min(figures, key=lambda f: f["objective"])
    pick, found = Row(best["plan"], best["policy"], best["pooled"]), None
    if guarded:
        twin_share = folds.own_share if twins else folds.share * folds.renamed
        kept = twin_share > 0
        pick, found = guard({row: f["objective"] for row, f in zip(rows, figures, strict=True)},
                            {row: stall[row][twins][kept] for row in rows}, twin_share[kept],
                            pick, engines)
    for row, f in zip(rows, figures, strict=True):
        f["chosen"] = row == pick
    best = next(f for f in figures if f["chosen"])
    return PolicyChoice(best["policy"], best["pooled"], best["stall_s"], best["objective"],
                        best["unlike_stall_s"], judged, rows=figures, plan=best["plan"],
                        guard=found)


def rows_of(choices: tuple[str, ...], plain: bool) -> list[Row]:
    """Each policy of `choices` per layer and pooled on the split's pins and slots, then
    (`plain`) each but a fitted one on the plain cache's."""
    rows = [Row(SPLIT, name, pooled) for name in choices for pooled in (False, True)]
    if plain:
        rows += [Row(PLAIN, name, pooled) for name in choices if not policy_row(name).fitted
                 for pooled in (False, True)]
    return rows


def served(table: CostTable, plan: str, per_unit: list) -> Served:
    """`plan`'s pins and slots per held-out entry, from its per-unit plans."""
    plans = {int(n): got for held, got in per_unit for n in np.flatnonzero(held)}
    return Served(plan, plans, {n: entry_pins(table, n, got.p, got.q)
                                for n, got in plans.items()})


def judged_share(folds: Folds, rows: list[Row], serving: dict[str, Served], copies: int
                 ) -> float:
    """The share of each fold the rows replay (1: all of it; less beyond POLICY_KEYS)."""
    total = copies * sum(len(folds.table.entries[n].requests.keys)
                         for row in rows for n in serving[row.plan].plans)
    return min(1.0, POLICY_KEYS / max(total, 1))


def replay_rows(folds: Folds, rows: list[Row], serving: dict[str, Served], judged: float,
                twins: bool) -> dict[Row, dict[bool, np.ndarray]]:
    """Each row's stall per entry ([F], 0 where not held out) on its held-out folds (False)
    and (`twins`) on them renamed here (True), a fitted policy with the weights of each
    entry's training entries; every fit and replay on all cores."""
    table, home = folds.table, folds.table.problem.home
    layers, experts = home.shape
    split = serving[SPLIT]
    steps = {False: {n: prefix(table.entries[n].requests, judged) for n in split.plans}}
    if twins:
        steps[True] = {n: steps[False][n].relabeled(home, folds.seed + table.entries[n].fold)
                       for n in split.plans}
    fits = {} if not any(policy_row(r.policy).fitted for r in rows) else {
        table.entries[n].train: n for n in split.plans}  # each training set: its last entry
    per_fit = int(FIT_KEYS // max(1, len(fits)))

    def fit(n: int) -> dict:
        return fit_learned([table.entries[m].requests for m in table.entries[n].train],
                           ~split.pins[n], home, split.plans[n].q, seed=folds.seed,
                           limit=per_fit).options

    def replay(job: tuple[Row, int, bool]) -> float:
        row, n, copy = job
        on = serving[row.plan]
        options = fitted[table.entries[n].train] if policy_row(row.policy).fitted else {}
        cache = make_policy(row.policy, on.plans[n].q, layers * experts, pooled=row.pooled,
                            **options)
        return float(table.seconds(n, steps[copy][n].misses(cache, ~on.pins[n], home)).sum())

    jobs = [(row, n, copy) for row in rows for n in serving[row.plan].plans
            for copy in ((False, True) if twins else (False,))]
    stall = {row: {copy: np.zeros(len(table.entries)) for copy in (False, True)}
             for row in rows}
    with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        fitted = dict(zip(fits, pool.map(fit, fits.values()), strict=True))
        for (row, n, copy), got in zip(jobs, pool.map(replay, jobs), strict=True):
            stall[row][copy][n] = got
    return stall


def row_figures(folds: Folds, row: Row, stall: dict[bool, np.ndarray], twins: bool,
                scale: float) -> dict:
    """A row's held-out objective and stall (and renamed stall, where measured), scaled."""
    renamed = folds.share * folds.renamed
    unlike = float((folds.own_share if twins else renamed) @ stall[twins]) * scale \
        if twins or folds.renamed.any() else None
    return {"plan": row.plan, "policy": row.policy, "pooled": row.pooled,
            "objective": float(folds.weight @ stall[False]) * scale,
            "stall_s": float(folds.own_share @ stall[False]) * scale,
            "unlike_stall_s": unlike}


def with_weights(choice: PolicyChoice, table: CostTable, pinned: np.ndarray,
                 quotas: np.ndarray, seed: int = 0) -> PolicyChoice:
    """The choice with the learned weights of the final plan (pinned [L, E], quotas [C, L]),
    fitted on every calibration fold (each fold's calibration share from the folds of other
    sequences), where the learned policy (a fitted one) was chosen. Fitted per layer, pooled
    or not, as the folds' weights were: the pooled learned policy is judged with them."""
    if not policy_row(choice.name).fitted:
        return choice
    calib = table.calibration
    fit = fit_learned([table.entries[n].requests for n in calib], ~pinned, table.problem.home,
                      quotas, seed=seed,
                      units=[table.entries[n].unit for n in calib])
    return replace(choice, weights=fit.weights, calibration=fit.calibration,
                   transition=fit.transition)
