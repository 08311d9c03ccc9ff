"""Emit and verify throughput against a plain `cp` of the same source bytes, same disk.

    .venv/bin/python benchmarks/bench_emit.py [--quick] [--repeats 3]

Builds two real checkpoints of a few GB of random-initialised (dense, not sparse) weights
with build_tiny_model, qwen3_moe (one tensor per expert, 3.4 GB) and gpt_oss (fused 3D
expert tensors, 3.3 GB), in a child process (so this one holds no torch state), in a
temporary directory on the disk of the working directory, plans 30% of every card's experts
cold (mixed whole / paged / cold), then times, after one discarded warm-up pass of each:
`cp -r` of the checkpoint, `cp -r` + `sync`, `placer emit` (read, write, fsync, sha256 of
sources and outputs), the same emit again with the source's sha256 remembered from the first
(placer/placed/digests.py: re-emitting from an unchanged checkpoint hashes only the outputs), and
`placer verify` (re-read and compare every byte, sha256 of outputs).

Every timed step writes into a directory that does not exist, after the previous outputs
were deleted and synced, so each gets the same kind of free memory and disk. (Timing
`emit --force` over an existing placed directory measures something else: the old files
live until the new ones are whole, and on a VM whose freed pages the hypervisor has
reclaimed, writing into never-touched pages cost emit 3x.) The steps are interleaved
`--repeats` times and the medians are reported. Ratios are throughputs over cp's (target:
emit >= 0.8 x cp + sync, the durable copy emit does; cp alone is printed beside it).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from placer.checkpoint.inventory import read_inventory
from placer.files import write_json_atomic
from placer.placed import digests
from placer.placed.emit import emit_placement
from placer.placed.verify import verify_placed
from placer.plan.placement import build_plan, read_plan

TEXTS = ["the quick brown fox jumps over the lazy dog"] * 50
HIDDEN = {"qwen3_moe": 2048, "gpt_oss": 1024}  # model widths giving 3.4 and 3.3 GB


def make_plan(model: Path, root: Path) -> Path:
    inv = read_inventory(model)
    sizes = inv.expert_bytes()
    layers, experts = sizes.shape
    page = int(sizes.max()) // 4
    pages = -(-sizes // page)
    rng = np.random.default_rng(0)
    resident = np.where(rng.random(sizes.shape) < 0.3, rng.integers(0, 2, sizes.shape), pages)
    home = np.tile(np.arange(experts) * 2 // experts, (layers, 1))
    plan = build_plan(inv, _spec(), home=home,
                      resident_pages=resident, page_size=page,
                      budget_bytes=np.array([1 << 40] * 2), staging_bytes=np.zeros(2, int),
                      budget={"mode": "budget", "value": None, "concurrency": [1]},
                      ep="contiguous", solver={"name": "bench"})
    path = root / "plan.json"
    write_json_atomic(plan.to_json(), path)
    return path


def _spec():
    from placer.hardware.spec import parse_spec

    return parse_spec({"name": "bench", "host_ram": "1TiB", "cards": 2,
                       "card": {"model": "x", "vram": "1TiB", "h2d_bandwidth": "50GB/s",
                                "latency_us": 5.0},
                       "link": [{"name": "a", "cards": [0], "bandwidth": "50GB/s"},
                                {"name": "b", "cards": [1], "bandwidth": "50GB/s"}],
                       "decode": {"base_step_ms": {"1": 10.0}}})


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def build_model(arch: str, hidden: int, root: Path) -> Path:
    """build_tiny_model in a child process; the checkpoint's directory."""
    code = ("from pathlib import Path; from placer.checkpoint.tiny import build_tiny_model;"
            f"build_tiny_model({arch!r}, Path({str(root / arch)!r}), texts={TEXTS!r},"
            f" layers=4, experts=32, top_k=4, hidden={hidden})")
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
    return root / arch


def bench(arch: str, hidden: int, root: Path, repeats: int) -> None:
    model = build_model(arch, hidden, root)
    size = sum(f.stat().st_size for f in model.glob("*.safetensors"))
    plan = read_plan(make_plan(model, root))
    copy, placed = root / "copy", root / "placed"

    def clean() -> None:
        shutil.rmtree(copy, ignore_errors=True)
        shutil.rmtree(placed, ignore_errors=True)
        os.sync()

    def cp(sync: bool) -> None:
        subprocess.run(["cp", "-r", str(model), str(copy)], check=True)
        if sync:
            subprocess.run(["sync"], check=True)

    def emit(remembered: bool) -> None:
        if not remembered:
            digests.cache_file().unlink(missing_ok=True)
        emit_placement(plan, model, placed)

    def verify() -> None:
        assert verify_placed(placed, model).ok

    steps = {"cp": lambda: cp(False), "cp+sync": lambda: cp(True),
             "emit": lambda: emit(False), "emit again": lambda: emit(True), "verify": verify}
    times: dict[str, list[float]] = {name: [] for name in steps}
    for rep in range(repeats + 1):  # the first pass warms the page cache and is discarded
        for name, fn in steps.items():
            if name != "verify":  # verify reads what emit just wrote
                clean()
            t = timed(fn)
            if rep:
                times[name].append(t)
    clean()
    t_cp, t_cps, t_emit, t_again, t_verify = (statistics.median(times[n]) for n in steps)
    gb = size / 1e9
    print(f"{arch}: source {gb:.2f} GB of safetensors, median of {repeats} interleaved runs")
    print(f"  cp -r           {gb / t_cp:6.2f} GB/s")
    print(f"  cp -r + sync    {gb / t_cps:6.2f} GB/s")
    for label, name, t in (("placer emit    ", "emit", t_emit),
                           ("  again        ", "emit again", t_again)):
        print(f"  {label} {gb / t:6.2f} GB/s  = {t_cps / t:.2f} x cp+sync, {t_cp / t:.2f} x cp  "
              f"[{'PASS' if t_cps / t >= 0.8 else 'MISS'} >= 0.8 x cp+sync]  (runs: "
              f"{', '.join(f'{t_cps / x:.2f}' for x in times[name])} x the median cp+sync)")
    print(f"  placer verify   {gb / t_verify:6.2f} GB/s  = {t_cp / t_verify:.2f} x cp")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="hidden 256 (~50-200 MB per model)")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs of each step")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=Path.cwd(), prefix=".bench-emit-") as tmp:
        os.environ["PLACER_CACHE_DIR"] = str(Path(tmp) / "cache")
        for arch, hidden in HIDDEN.items():
            bench(arch, 256 if args.quick else hidden, Path(tmp), args.repeats)


if __name__ == "__main__":
    main()
