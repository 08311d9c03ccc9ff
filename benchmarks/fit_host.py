"""Fit the share of the host's streaming bandwidth that llama.cpp's CPU expert matmuls reach
(placer/hardware/host_fit.py) to the published runs of benchmarks/accuracy/groups.toml, leave
one group out, and write placer/hardware/data/host_fit.csv.

    .venv/bin/python benchmarks/fit_host.py [--shares 0.2,0.3,...] [--out CSV]

Every group is predicted at each share of the grid (bench_accuracy's predictions, in this
process, with placer.hardware.host_fit.using). A fit picks the share of the grid with the
least error over its groups: the mean over groups of each group's mean squared log(pred /
meas) of its runs (each group weighs the same, whatever its run count). One fit per group
leaves that group out (bench_accuracy predicts the group with it: its held-out figures); the
fit on every group is what placer uses for a box it has not seen. The groups' boxes are
partly assumed (their RAM is not posted), so the share also absorbs the RAM the specs assume.
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
OUT = bench.REPO / "placer" / "hardware" / HOST_FIT_TABLE
FIELDS = ("held_out", "share", "groups", "runs", "rms_log_error", "source")


def errors(groups: list[dict], shares: tuple[float, ...]) -> dict[float, dict[str, list]]:
    """{share: {group id: [log(pred / meas) of each run]}}."""
    out: dict[float, dict[str, list]] = {}
    with tempfile.TemporaryDirectory(prefix="fit-host-") as tmp:
        for share in shares:
            print(f"fit_host: share {share:g}", file=sys.stderr, flush=True)
            with using(share):
                done = [bench.predict_group(g, Path(tmp)) for g in groups]
            out[share] = {g.id: [math.log(r.predicted / r.measured) for r in g.runs]
                          for g in done if not g.skipped}
    return out


def fit(table: dict[float, dict[str, list]], ids: list[str]) -> tuple[float, float, int]:
    """(share, rms log error, runs) of the grid's best share over the groups `ids`."""
    def loss(share: float) -> float:
        return sum(sum(e * e for e in table[share][i]) / len(table[share][i])
                   for i in ids) / len(ids)

    best = min(table, key=loss)
    return best, math.sqrt(loss(best)), sum(len(table[best][i]) for i in ids)


def rows(table: dict[float, dict[str, list]], sources: dict[str, str]) -> list[dict]:
    ids = list(next(iter(table.values())))
    out = []
    for held in [ALL_GROUPS, *ids]:
        used = [i for i in ids if i != held]
        share, rms, runs = fit(table, used)
        out.append({"held_out": held, "share": share, "groups": len(used), "runs": runs,
                    "rms_log_error": f"{rms:.3f}",
                    "source": "; ".join(f"{i}: {sources[i]}" for i in used)})
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shares", help="comma-separated grid (default: %(default)s)",
                        default=",".join(f"{s:g}" for s in SHARES))
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    groups = bench.load_groups(bench.GROUPS)
    table = errors(groups, tuple(float(s) for s in args.shares.split(",")))
    text = io.StringIO()
    writer = csv.DictWriter(text, FIELDS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows(table, {g["id"]: g["source"] for g in groups}))
    args.out.write_text(text.getvalue())
    print(text.getvalue())


if __name__ == "__main__":
    main()
