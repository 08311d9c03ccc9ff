"""`make bench`: every benchmark, one after another, each printing ratios against a baseline
it measures in the same run.

    .venv/bin/python benchmarks/run_all.py [--quick]

`--quick` passes each benchmark its small sizes (a smoke run, not figures to quote).
A benchmark that fails is reported and the rest still run; the exit status is 1 if any did.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
BENCHMARKS = (  # (script and its arguments, its quick-run arguments)
    ("bench_traces.py", ["--rows", "1000000", "--repeats", "5"]),
    ("bench_solvers.py", ["--quick"]),
    ("bench_emit.py", ["--quick"]),
    ("bench_runtime.py", ["--quick"]),
    ("bench_gpu.py", []),
    ("bench_cpu_experts.py", ["--quick"]),
    ("bench_routing.py", ["--quick"]),
    ("bench_cache.py", ["--quick"]),
    ("bench_gguf.py", ["--quick"]),
    ("bench_llamacpp.py", ["--quick"]),
    ("bench_llamacpp_measured.py", ["--quick"]),
    ("bench_llamacpp_measured.py --shape held-back", ["--quick"]),
    ("bench_accuracy.py", ["--only", "E_rtx5090_gptoss120b,F_rtx4070_gptoss120b"]),
    ("bench_split.py", ["--quick"]),
    ("bench_scale.py", ["--quick"]),
    ("bench_startup.py", ["--quick"]),
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run")
    args = parser.parse_args()
    failed = []
    for entry, quick_args in BENCHMARKS:
        script, *fixed = entry.split()
        argv = [sys.executable, str(HERE / script), *fixed, *(quick_args if args.quick else [])]
        print(f"\n=== {script} {' '.join(argv[2:])}", flush=True)
        start = time.perf_counter()
        code = subprocess.run(argv).returncode
        print(f"=== {script}: exit {code} after {time.perf_counter() - start:.1f} s", flush=True)
        if code != 0:
            failed.append(entry)
    if failed:
        print(f"failed: {', '.join(failed)}")
        sys.exit(1)


if __name__ == "__main__":
    main()
