"""SIGINT during the ILP (SCIP through OR-Tools) is not swallowed: SCIP would catch it, stop
and return its best so far, and the command (`evaluate`'s oracle, `solve`) would go on and
write its outputs as if never interrupted. Left to Python, it raises KeyboardInterrupt when
the solve returns (within its time limit), and the command exits 130 writing nothing."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parent
SOLVE = f"""
import sys
sys.path[:0] = [{str(TESTS)!r}, {str(TESTS.parent / "benchmarks")!r}]
from bench_solvers import make_problem
from solvers.static import ilp
problem = make_problem(8, 64, 4, 4, 512, 2048, 0)
print("solving", flush=True)
ilp.solve(problem, time_limit=3.0, seed=0)
print("solved", flush=True)
"""


def test_sigint_during_the_ilp_raises_keyboard_interrupt_after_it():
    child = subprocess.Popen([sys.executable, "-c", SOLVE], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    try:
        assert child.stdout.readline() == "solving\n"
        time.sleep(1.0)  # SCIP is in its branch and bound (the whole 3 s on this problem)
        child.send_signal(signal.SIGINT)
        out = child.communicate(timeout=60)[0]
    finally:
        child.kill()
    assert child.returncode != 0 and "KeyboardInterrupt" in out, out[-2000:]
    assert "solved" not in out
