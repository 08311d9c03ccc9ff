"""Fit the decode step's constants (placer/hardware/step_fit.py) to the published llama.cpp
measurements in docs/research/llamacpp-measurements/ and write them to
placer/hardware/data/step_fit.csv, the file `hardware new` and `probe --step --estimate` read;
prints what was left out and why, and the table docs/hardware.md shows.

    python benchmarks/fit_step.py [--check]

--check writes nothing and fails where the shipped file differs from a fresh fit."""

from __future__ import annotations

import sys
from pathlib import Path

from placer.hardware.backends import read_fit_rows
from placer.hardware.step_fit import fit_all, fit_csv, fit_table, read_runs

REPO = Path(__file__).resolve().parent.parent
RESEARCH = REPO / "docs" / "research" / "llamacpp-measurements"
SHIPPED = REPO / "placer" / "hardware" / "data" / "step_fit.csv"


def fitted() -> tuple[str, list[tuple[str, str]]]:
    """step_fit.csv's text from the research CSVs, and the card labels left out."""
    runs, left = read_runs((RESEARCH / "dense_scoreboard.csv").read_text(encoding="utf-8"),
                           (RESEARCH / "cards.csv").read_text(encoding="utf-8"))
    return fit_csv(fit_all(runs)), left


def main(argv: list[str]) -> int:
    text, left = fitted()
    for label, why in left:
        print(f"left out: {label}: {why}")
    if "--check" in argv:
        same = SHIPPED.read_text(encoding="utf-8") == text
        print(f"{SHIPPED}: {'as fitted' if same else 'DIFFERS from a fresh fit'}")
        return 0 if same else 1
    tmp = SHIPPED.with_suffix(".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(SHIPPED)
    print(f"wrote {SHIPPED}")
    print(fit_table(read_fit_rows(text)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
