"""Fit the share of the host's streaming bandwidth that llama.cpp's CPU expert matmuls reach,
and the share of a card's link at which it reads what spilled past its VRAM
(placer/hardware/host_fit.py), to the published runs of benchmarks/accuracy/groups.toml,
leave one group out; write placer/hardware/data/host_fit.csv.

    .venv/bin/python benchmarks/fit_host.py [--shares 0.2,...] [--spill-rates 1,...]
                                            [--reuse CSV] [--out CSV]

First the host share: every group is predicted at each share of the grid (bench_accuracy's
predictions, in this process, with placer.hardware.host_fit.using; spill rate 1), and a fit
picks the share with the least error over its groups: the mean over groups of each group's
mean squared log(pred / meas) (each group weighs the same, whatever its run count).
`--reuse CSV` takes this stage's rows from an earlier output instead of predicting again.
Then the spill rate, on the groups with a run placer predicts spilled: each is predicted at
each rate of the grid with the host share of the fit at hand, and a fit picks the rate with
the least mean over those groups of each group's mean squared log pair-ratio error (the
bar's r of docs/accuracy.md). One row per group leaves that group out of both fits
(bench_accuracy predicts the group with that row: its held-out figures); the row `none`,
fitted on every group, is what placer uses for a box it has not seen. The groups' boxes are
partly assumed (their RAM is not posted), so the host share also absorbs the RAM the specs
assume, and the spill rate the link they assume.
"""

from __future__ import annotations

import argparse
import csv
import io
import math
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_accuracy as bench  # noqa: E402

from placer.hardware.host_fit import ALL_GROUPS, HOST_FIT_TABLE, using  # noqa: E402

SHARES = (0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.5, 0.6, 0.75, 1.0)
SPILL_RATES = (0.1, 0.15, 0.25, 0.35, 0.5, 0.75, 1.0)
OUT = bench.REPO / "placer" / "hardware" / HOST_FIT_TABLE
FIELDS = ("held_out", "share", "groups", "runs", "rms_log_error", "spill_rate", "spill_groups",
          "spill_rms_log_error", "source")


class Predictions:
    """bench_accuracy's prediction of a group at a (host share, spill rate), memoized."""

    def __init__(self, groups: list[dict], work: Path) -> None:
        self.groups = {g["id"]: g for g in groups}
        self.work = work
        self.done: dict[tuple, bench.Group] = {}

    def __call__(self, gid: str, share: float, rate: float) -> bench.Group:
        key = (gid, share, rate)
        if key not in self.done:
            print(f"fit_host: {gid} at host share {share:g}, spill rate {rate:g}",
                  file=sys.stderr, flush=True)
            with using(share, rate):
                self.done[key] = bench.predict_group(self.groups[gid], self.work)
        return self.done[key]


def run_errors(g: bench.Group) -> list[float]:
    return [math.log(r.predicted / r.measured) for r in g.runs]


def pair_errors(g: bench.Group) -> list[float]:
    return [math.log(r) for _, _, r in bench.pairs(g)]


def best(grid: tuple[float, ...], ids: list[str], errors) -> tuple[float, float]:
    """(the grid's value with the least mean over `ids` of each one's mean squared error,
    that error's root)."""
    def loss(x: float) -> float:
        return sum(sum(e * e for e in errors(i, x)) / len(errors(i, x)) for i in ids) / len(ids)

    x = min(grid, key=loss)
    return x, math.sqrt(loss(x))


def host_rows(predict: Predictions, ids: list[str], shares: tuple[float, ...]) -> list[dict]:
    """Stage one: the host share of every fit (spill rate 1)."""
    rows = []
    for held in [ALL_GROUPS, *ids]:
        used = [i for i in ids if i != held]
        share, rms = best(shares, used, lambda i, s: run_errors(predict(i, s, 1.0)))
        rows.append({"held_out": held, "share": share, "groups": len(used),
                     "runs": sum(len(predict.groups[i]["runs"]) for i in used),
                     "rms_log_error": f"{rms:.3f}"})
    return rows


def spill_rows(predict: Predictions, rows: list[dict], rates: tuple[float, ...]) -> None:
    """Stage two: each fit's spill rate, on the groups that spill, at the fit's host share."""
    share = next(float(r["share"]) for r in rows if r["held_out"] == ALL_GROUPS)
    spilled = [i for i in predict.groups
               if any(r.spill_mib for r in predict(i, share, 1.0).runs)]
    for row in rows:
        used = [i for i in spilled if i != row["held_out"]]
        s = float(row["share"])
        rate, rms = best(rates, used, lambda i, r, s=s: pair_errors(predict(i, s, r)))
        row.update({"spill_rate": rate, "spill_groups": len(used),
                    "spill_rms_log_error": f"{rms:.3f}"})


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shares", default=",".join(f"{s:g}" for s in SHARES))
    parser.add_argument("--spill-rates", default=",".join(f"{s:g}" for s in SPILL_RATES))
    parser.add_argument("--reuse", type=Path, help="stage one's rows from an earlier output")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    groups = bench.load_groups(bench.GROUPS)
    ids = [g["id"] for g in groups]
    sources = {g["id"]: g["source"] for g in groups}
    with tempfile.TemporaryDirectory(prefix="fit-host-") as tmp:
        predict = Predictions(groups, Path(tmp))
        if args.reuse:
            rows = [{k: r[k] for k in FIELDS[:5]}
                    for r in csv.DictReader(io.StringIO(args.reuse.read_text()))]
        else:
            rows = host_rows(predict, ids, tuple(float(s) for s in args.shares.split(",")))
        spill_rows(predict, rows, tuple(float(s) for s in args.spill_rates.split(",")))
    for row in rows:
        row["source"] = "; ".join(f"{i}: {sources[i]}" for i in ids if i != row["held_out"])
    text = io.StringIO()
    writer = csv.DictWriter(text, FIELDS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    args.out.write_text(text.getvalue())
    print(text.getvalue())


if __name__ == "__main__":
    main()
