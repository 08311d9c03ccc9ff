"""Emit and verify throughput against a plain `cp` of the same source bytes, same disk.

    .venv/bin/python benchmarks/bench_emit.py [--quick] [--hidden 1024]

Builds two real checkpoints of random-initialised (dense, not sparse) weights with
build_tiny_model — qwen3_moe (one tensor per expert) and gpt_oss (fused 3D expert tensors) —
in a temporary directory on the disk of the working directory, plans 30% of every card's
experts cold (mixed whole / paged / cold), then times, after one discarded warm-up pass of
each: `cp -r` of the checkpoint, `cp -r` + `sync`, `placer emit` (copy_file_range, fsync,
sha256 of sources and outputs) and `placer verify` (re-read and compare every byte, sha256
of outputs). Ratios are throughputs over cp's (target: emit >= 0.8 x cp + sync, the durable
copy emit does; cp alone is printed beside it).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np

from placer.emit import emit_placement
from placer.inventory import read_inventory
from placer.plan import build_plan, read_plan, write_json_atomic
from placer.tinymodel import build_tiny_model
from placer.verify import verify_placed

TEXTS = ["the quick brown fox jumps over the lazy dog"] * 50


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
    from placer.hardware import parse_spec

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


def bench(arch: str, hidden: int, root: Path) -> None:
    model = build_tiny_model(arch, root / arch, texts=TEXTS, layers=4, experts=32, top_k=4,
                             hidden=hidden)
    size = sum(f.stat().st_size for f in model.glob("*.safetensors"))
    plan = read_plan(make_plan(model, root))
    copy, placed = root / "copy", root / "placed"

    def cp(sync: bool) -> None:
        shutil.rmtree(copy, ignore_errors=True)
        subprocess.run(["cp", "-r", str(model), str(copy)], check=True)
        if sync:
            subprocess.run(["sync"], check=True)

    def emit() -> None:
        emit_placement(plan, model, placed, force=True)

    def verify() -> None:
        assert verify_placed(placed, model).ok

    for fn in (lambda: cp(False), emit, verify):  # warm-up: page cache, first-touch faults
        fn()
    t_cp, t_cps, t_emit, t_verify = (timed(lambda: cp(False)), timed(lambda: cp(True)),
                                     timed(emit), timed(verify))
    gb = size / 1e9
    print(f"{arch}: source {gb:.2f} GB of safetensors")
    print(f"  cp -r           {gb / t_cp:6.2f} GB/s")
    print(f"  cp -r + sync    {gb / t_cps:6.2f} GB/s")
    print(f"  placer emit     {gb / t_emit:6.2f} GB/s  = {t_cps / t_emit:.2f} x cp+sync, "
          f"{t_cp / t_emit:.2f} x cp  [{'PASS' if t_cps / t_emit >= 0.8 else 'MISS'} "
          f">= 0.8 x cp+sync]")
    print(f"  placer verify   {gb / t_verify:6.2f} GB/s  = {t_cp / t_verify:.2f} x cp")
    shutil.rmtree(copy, ignore_errors=True)
    shutil.rmtree(placed, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="hidden 256 (~50 MB per model)")
    parser.add_argument("--hidden", type=int, default=1024, help="model width (1024: ~1 GB)")
    args = parser.parse_args()
    hidden = 256 if args.quick else args.hidden
    with tempfile.TemporaryDirectory(dir=Path.cwd(), prefix=".bench-emit-") as tmp:
        for arch in ("qwen3_moe", "gpt_oss"):
            bench(arch, hidden, Path(tmp))


if __name__ == "__main__":
    main()
