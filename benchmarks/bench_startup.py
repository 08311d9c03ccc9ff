"""How long `placer` takes to start: `placer --version`, `placer --help` and every command's
`--help`, each a fresh process, against the interpreter's own start in the same run.

    .venv/bin/python benchmarks/bench_startup.py [--quick] [--repeats 7] [--against DIR]

Each is run `--repeats` times, interleaved (a neighbour's burst falls on all alike), and the
fastest run counts (start-up is a floor: what is above it is the machine's load, not placer).
Baseline: `python -c pass` with the same interpreter and environment (the "x python" column
is each command's wall time over it); a second floor, `import typer.rich_utils`, is what any
help typer renders with rich costs before placer does anything. Target: every one under
0.4 s on an idle machine (issue 43); the table marks each row against it, and says how loaded
the machine was (the 1-minute load average over the cores) so that a miss on a busy machine
reads as such; the CPU column (user + system time of the process) is what start-up costs
whatever the load. `--against DIR`: the same commands from another checkout of placer (say a
`git worktree` of main), interleaved in the same run, and this tree's time over its.
`--quick`: `--version`, `--help`, `solve --help` and `export llamacpp --help`, 3 repeats.
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
NEVER = (float("inf"), float("inf"))  # a command that failed (or is missing in a tree)


def command_paths() -> list[list[str]]:
    """argv of every command's --help (groups and their commands), from the app itself."""
    from typer.main import get_command

    from placer.cli import app

    def walk(cmd, path: list[str]):
        yield path
        for name, sub in getattr(cmd, "commands", {}).items():
            yield from walk(sub, [*path, name])

    return [[*p, "--help"] for p in walk(get_command(app), [])]


def seconds(argv: list[str], tree: Path) -> tuple[float, float]:
    """(Wall, CPU) seconds of one run of `argv` with placer from `tree` (NEVER where it exits
    non-zero): CPU time (user + system of the child) is what start-up costs itself; on a
    loaded machine wall time adds the wait for a core. It runs in `tree` (`python -m` and
    `-c` put the working directory first on the path, before PYTHONPATH)."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(argv, env=env, cwd=tree, stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        return NEVER
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--against", type=Path, help="another placer checkout to compare")
    args = parser.parse_args()
    repeats = 3 if args.quick else args.repeats
    trees = {"this": REPO, **({"against": args.against.resolve()} if args.against else {})}
    runs = [["--version"], *([["--help"], ["solve", "--help"], ["export", "llamacpp", "--help"]]
                             if args.quick else command_paths())]
    floors = {"python -c pass": [sys.executable, "-c", "pass"],
              "import typer.rich_utils": [sys.executable, "-c", "import typer.rich_utils"]}
    best = {(tree, tuple(r)): NEVER for tree in trees for r in runs}
    floor = dict.fromkeys(floors, NEVER)
    for _ in range(repeats):
        for name, argv in floors.items():
            floor[name] = min(floor[name], seconds(argv, REPO))
        for r in runs:
            for tree in trees:
                key = (tree, tuple(r))
                best[key] = min(best[key],
                                seconds([sys.executable, "-m", "placer", *r], trees[tree]))
    report(best, floor, runs, repeats, args.against)


def report(best: dict, floor: dict, runs: list[list[str]], repeats: int,
           against: Path | None) -> None:
    load = os.getloadavg()[0] / (os.cpu_count() or 1)
    base = floor["python -c pass"][0]
    print(f"start-up, fastest of {repeats} fresh processes each; load {load:.2f} per core "
          f"(idle: under 0.1)")
    for name, (wall, cpu) in floor.items():
        print(f"  floor: {name}: {wall * 1e3:.0f} ms wall, {cpu * 1e3:.0f} ms CPU")
    extra = f" {'against s':>9s} {'CPU s':>6s} {'this/against':>12s}" if against else ""
    print(f"{'command':34s} {'wall s':>7s} {'CPU s':>6s} {'x python':>8s} {'target':>7s}{extra}")
    for r in runs:
        wall, cpu = best[("this", tuple(r))]
        mark = "ok" if wall < TARGET_S else "MISS"
        line = (f"{'placer ' + ' '.join(r):34s} {wall:7.3f} {cpu:6.3f} {wall / base:7.1f}x "
                f"{mark:>7s}")
        if against:
            other, other_cpu = best[("against", tuple(r))]
            line += (f" {other:9.3f} {other_cpu:6.3f} {wall / other:11.2f}x"
                     if other != NEVER[0] else f" {'failed':>9s} {'-':>6s} {'-':>12s}")
        print(line)
    worst = max(best[("this", tuple(r))][0] for r in runs)
    print(f"slowest: {worst:.3f} s ({'under' if worst < TARGET_S else 'OVER'} the "
          f"{TARGET_S} s target{'' if load < 0.1 else ', on a loaded machine'})")
    if against:
        print(f"against: {against}")


if __name__ == "__main__":
    main()
