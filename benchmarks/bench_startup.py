"""How long `placer` takes to start: `placer --version`, `placer --help` and every command's
`--help`, each a fresh process, against the interpreter's own start in the same run.

    .venv/bin/python benchmarks/bench_startup.py [--quick] [--repeats 7]

Each is run `--repeats` times, interleaved (a neighbour's burst falls on all alike), and the
fastest run counts (start-up is a floor: what is above it is the machine's load, not placer).
Baseline: `python -c pass` with the same interpreter and environment. Target: every one under
0.4 s on an idle machine (issue 43); the table marks each row against it, and says how loaded
the machine was (the 1-minute load average over the cores) so that a miss on a busy machine
reads as such; the CPU column (user + system time of the process) is what start-up costs
whatever the load. `--quick`: `--version`, `--help` and `solve --help` only, 3 repeats.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TARGET_S = 0.4


def command_paths() -> list[list[str]]:
    """argv of every command's --help (groups and their commands), from the app itself."""
    from typer.main import get_command

    from placer.cli import app

    def walk(cmd, path: list[str]):
        yield path
        for name, sub in getattr(cmd, "commands", {}).items():
            yield from walk(sub, [*path, name])

    return [[*p, "--help"] for p in walk(get_command(app), [])]


def seconds(argv: list[str], env: dict) -> tuple[float, float]:
    """(Wall, CPU) seconds of one run of `argv`: CPU time (user + system of the child) is
    what start-up costs itself; on a loaded machine wall time adds the wait for a core."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(argv, env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   check=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def fastest(a: tuple[float, float], b: tuple[float, float]) -> tuple[float, float]:
    """The faster run by wall time (with its CPU time)."""
    return min(a, b)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    repeats = 3 if args.quick else args.repeats
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    runs = [["--version"], *([["--help"], ["solve", "--help"]] if args.quick
                             else command_paths())]
    baseline = [sys.executable, "-c", "pass"]
    best = {tuple(r): (float("inf"), float("inf")) for r in runs}
    base = (float("inf"), float("inf"))
    for _ in range(repeats):
        base = fastest(base, seconds(baseline, env))
        for r in runs:
            best[tuple(r)] = fastest(best[tuple(r)],
                                     seconds([sys.executable, "-m", "placer", *r], env))
    load = os.getloadavg()[0] / (os.cpu_count() or 1)
    print(f"start-up, fastest of {repeats} fresh processes each; load {load:.2f} per core "
          f"(idle: under 0.1); interpreter alone (python -c pass): {base[0] * 1e3:.0f} ms wall, "
          f"{base[1] * 1e3:.0f} ms CPU")
    print(f"{'command':34s} {'wall s':>7s} {'CPU s':>6s} {'wall over python':>17s} {'target':>7s}")
    for r, (wall, cpu) in best.items():
        mark = "ok" if wall < TARGET_S else "MISS"
        print(f"{'placer ' + ' '.join(r):34s} {wall:7.3f} {cpu:6.3f} {wall / base[0]:16.1f}x "
              f"{mark:>7s}")
    worst = max(wall for wall, _ in best.values())
    print(f"slowest: {worst:.3f} s ({'under' if worst < TARGET_S else 'OVER'} the "
          f"{TARGET_S} s target{'' if load < 0.1 else ', on a loaded machine'})")


if __name__ == "__main__":
    main()
