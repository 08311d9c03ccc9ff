"""The staging runtime on a CUDA host: bandwidth, overhead, and the paired campaign.

    python benchmarks/bench_gpu.py [--quick] [--work bench-out/gpu] [--keep]
    python benchmarks/bench_gpu.py --smoke-cpu     # the same steps on a tiny model, on a CPU

Run from the project root (`make bench-gpu`); `pip install --no-deps --no-build-isolation -e .`
is enough once the dependencies are installed, and nothing is downloaded. Without CUDA it says
so and exits 0. Sections, in one run (about 5 minutes on one H200; `--quick` halves the model):

1. Staging bandwidth: a fetch of 8 cold parts of 8 / 22 / 44 MB through one card's
   `CardStager` (side stream, events, pinned memory) against a plain pinned
   `copy_(non_blocking=True)` of the same bytes, medians of 20 (target >= 0.9 x plain), and
   the per-fetch overhead when every expert is cached.
2. Runtime overhead: a qwen3_moe of 8 layers x 64 experts (top-8, hidden 1536, bf16, skewed
   routers: the size the issue measured) placed with every expert resident; its decode step
   against plain transformers' at B = 1 and 8 (target <= 1.10 x plain), logits checked equal.
   The same placement served as `placer bench` serves (continuous batching) gives the spec's
   base step at C = 1 and 8.
3. The paired campaign: traces collected on vicuna-bench prompts, a spec for this GPU (the
   bandwidth and fetch latency of 1, the base steps of 2), `placer solve --offload 0.35
   --concurrency 1,8` three ways: placer's default split (pinned experts and per-layer cache
   slots, the cached arm), the static ILP (`--cache 0`) and `--solver layer`, each emitted,
   then `placer bench` of the three on held-out mt-bench prompts at C = 1 and 8, three trials
   each. Printed: measured beside predicted tokens/s with intervals, and each arm's ratio to
   the split.

`--smoke-cpu` runs the same steps on this CPU with a small model (4 layers x 32 experts, top-4,
hidden 384, fp32; "staging" is a memcpy there), to check the script where there is no GPU:
its figures are not a GPU's.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from placed_models import OVERHEAD_TARGET, build_model, place, sync, time_arms

from placer.report.serving import print_bench
from placer.runtime.counters import StagingCounters
from placer.runtime.loader import load_placed
from placer.runtime.patch import load_staged_model
from placer.runtime.staging import CardStager
from placer.serve.bench import BenchOptions, bench
from solvers.cache import make_policy

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "examples" / "data"
BANDWIDTH_TARGET = 0.9


@dataclass(frozen=True)
class Size:
    layers: int
    experts: int
    top_k: int
    hidden: int
    dtype: str
    device: str
    prompts: int       # held-out prompts the campaign serves
    new_tokens: int
    trials: int
    concurrency: tuple[int, ...]


FULL = Size(8, 64, 8, 1536, "bfloat16", "cuda", 16, 32, 3, (1, 8))
QUICK = Size(8, 64, 8, 768, "bfloat16", "cuda", 12, 24, 3, (1, 8))
SMOKE = Size(4, 32, 4, 384, "float32", "cpu", 8, 16, 3, (1, 8))


def median_seconds(fn, repeats: int, device: torch.device) -> float:
    times = []
    for _ in range(repeats):
        sync(device)
        start = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def staging_bandwidth(device: torch.device, sizes_mb: tuple[int, ...] = (8, 22, 44),
                      experts: int = 8, repeats: int = 20) -> tuple[float, float]:
    """Section 1; returns (plain bandwidth of the largest size in B/s, per-fetch overhead in
    seconds). On a CPU the copies are memcpy: a nominal card for --smoke-cpu."""
    cuda = device.type == "cuda"
    plain_bw = 0.0
    for mb in sizes_mb:
        n = mb * 1_000_000
        host = [torch.randint(0, 255, (n,), dtype=torch.uint8) for _ in range(experts)]
        host = [h.pin_memory() for h in host] if cuda else host
        dst = torch.empty((experts, n), dtype=torch.uint8, device=device)
        stream = torch.cuda.Stream(device) if cuda else None

        def plain() -> None:
            with torch.cuda.stream(stream) if cuda else contextlib.nullcontext():
                for i, h in enumerate(host):
                    dst[i].copy_(h, non_blocking=cuda)

        stager = CardStager(0, device, staging_bytes=experts * (n + 256), slot_bytes=n,
                            cache=make_policy("lru", [[0]], experts),
                            counters=StagingCounters((0,), 1))
        keys = list(range(experts))
        _, views = stager.stage(0, keys, host)  # warm-up
        plain()
        assert all(torch.equal(v.cpu(), h) for v, h in zip(views, host, strict=True))
        t_plain = median_seconds(plain, repeats, device)
        t_stage = median_seconds(lambda: stager.stage(0, keys, host), repeats, device)
        total = experts * n
        plain_bw = total / t_plain
        ratio = t_plain / t_stage
        print(f"{experts} x {mb} MB: plain copy {plain_bw / 1e9:.2f} GB/s, runtime staging "
              f"{total / t_stage / 1e9:.2f} GB/s = {ratio:.3f} x plain "
              f"[{'PASS' if ratio >= BANDWIDTH_TARGET else 'MISS'} >= {BANDWIDTH_TARGET}]",
              flush=True)
    cached = CardStager(0, device, staging_bytes=1 << 20, slot_bytes=1 << 20,
                        cache=make_policy("lru", [[experts]], experts),
                        counters=StagingCounters((0,), 1))
    small = [torch.zeros(1 << 20, dtype=torch.uint8) for _ in range(experts)]
    small = [h.pin_memory() for h in small] if cuda else small
    keys = list(range(experts))
    cached.stage(0, keys, small)  # fills the cache; later fetches are all hits
    overhead = median_seconds(lambda: cached.stage(0, keys, small), repeats, device)
    print(f"per-fetch overhead (all {experts} experts cached, no copies): "
          f"{overhead * 1e6:.1f} us", flush=True)
    return plain_bw, overhead


def runtime_overhead(model: Path, placed: Path, size: Size, steps: int = 24) -> None:
    """Section 2: the all-resident runtime's decode step against plain transformers'."""
    from transformers import AutoModelForCausalLM

    dtype = getattr(torch, size.dtype)
    arms = {"plain": AutoModelForCausalLM.from_pretrained(model, dtype=dtype).to(size.device),
            "tables": load_staged_model(model, load_placed(placed, device=size.device),
                                        device=size.device, dtype=dtype)}
    for batch in (1, 8):
        ms = time_arms(arms, batch, steps, 3)
        plain, tables = ms["plain"], ms["tables"]
        print(f"B={batch}: plain {plain:.2f} ms/step, runtime (every expert resident) "
              f"{tables:.2f} ms/step = {tables / plain:.3f} x plain "
              f"[{'PASS' if tables / plain <= OVERHEAD_TARGET else 'MISS'} <= "
              f"{OVERHEAD_TARGET}]", flush=True)
    del arms
    if size.device == "cuda":
        torch.cuda.empty_cache()


def base_steps(model: Path, placed: Path, prompts: Path, size: Size) -> dict[int, float]:
    """The decode step (ms) of the all-resident placement served as the campaign serves
    (continuous batching) at each concurrency: the spec's base step."""
    report = bench([placed], model, prompts, BenchOptions(
        concurrency=size.concurrency, trials=1, max_new_tokens=size.new_tokens,
        device=size.device, cache_slots=0))
    base = {r["concurrency"]: r["measured_step_ms"] for r in report["arms"]}
    print("base step (every expert resident, continuous batching): "
          + ", ".join(f"{ms:.2f} ms at C={c}" for c, ms in base.items()), flush=True)
    return base


def placer(*args: object) -> None:
    """`placer ARGS` in a child process (its output kept unless it fails)."""
    argv = [sys.executable, "-m", "placer", *map(str, args)]
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"placer {' '.join(argv[3:])} failed:\n{done.stderr[-3000:]}")


def write_spec(path: Path, bandwidth: float, latency_s: float, base: dict[int, float]) -> Path:
    """A one-card spec of this box: the measured bandwidth, fetch latency and base steps."""
    if torch.cuda.is_available():
        name = torch.cuda.get_device_name(0).replace('"', "")
        vram = torch.cuda.get_device_properties(0).total_memory
    else:
        name, vram = "cpu", 1 << 40
    host_ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    points = dict(sorted(base.items()))
    for small, large in itertools.pairwise(list(points)):  # a spec's steps never fall
        points[large] = max(points[large], points[small])
    steps = ", ".join(f"{b} = {ms:.3f}" for b, ms in points.items())
    path.write_text(f'name = "bench-gpu"\ndescription = "measured by bench_gpu.py"\n'
                    f'host_ram = "{host_ram // 2**30}GiB"\ncards = 1\n\n[card]\n'
                    f'model = "{name}"\nvram = "{vram // 2**30}GiB"\n'
                    f'h2d_bandwidth = "{bandwidth / 1e9:.3f}GB/s"\n'
                    f"latency_us = {max(latency_s * 1e6, 1.0):.1f}\n\n"
                    f"[decode]\nbase_step_ms = {{ {steps} }}\n")
    return path


def held_out_prompts(path: Path, count: int) -> Path:
    """The first `count` mt-bench questions (vicuna-bench calibrates the plans)."""
    lines = (DATA / "mt_bench_questions.jsonl").read_text().splitlines()[:count]
    path.write_text("\n".join(lines) + "\n")
    return path


def campaign(model: Path, root: Path, spec: Path, prompts: Path, size: Size) -> None:
    """Section 3 (see module docstring)."""
    placer("collect", "--model", model, "--corpus", DATA / "vicuna_bench_questions.jsonl",
           "--mode", "generate", "--max-new-tokens", 16, "--max-length", 256,
           "--device", size.device, "--out", root / "traces", "--no-progress")
    arms = []
    for name, how in (("split", []), ("ilp", ["--cache", 0, "--solver", "ilp"]),
                      ("layer", ["--solver", "layer"])):
        placer("solve", "--model", model, "--hardware", spec, "--traces", root / "traces",
               "--offload", 0.35, "--concurrency", ",".join(map(str, size.concurrency)),
               *how, "--time-limit", 30, "--out", root / f"{name}.json")
        placer("emit", "--plan", root / f"{name}.json", "--model", model, "--out",
               root / name)
        arms.append(root / name)
    opts = BenchOptions(concurrency=size.concurrency, trials=size.trials,
                        max_new_tokens=size.new_tokens, device=size.device)
    print_bench(bench(arms, model, prompts, opts))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smaller model (hidden 768)")
    parser.add_argument("--smoke-cpu", action="store_true",
                        help="the same steps on a small model on this CPU")
    parser.add_argument("--work", type=Path, default=REPO / "bench-out" / "gpu",
                        help="where the model, traces and placements are written")
    parser.add_argument("--keep", action="store_true", help="keep --work afterwards")
    args = parser.parse_args()
    if not args.smoke_cpu and not torch.cuda.is_available():
        print("skipped: no CUDA device (torch.cuda.is_available() is False)")
        return
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    size = SMOKE if args.smoke_cpu else QUICK if args.quick else FULL
    start = time.perf_counter()
    device = torch.device("cuda:0" if size.device == "cuda" else "cpu")
    print(f"{torch.cuda.get_device_name(0) if size.device == 'cuda' else 'CPU'}, torch "
          f"{torch.__version__}", flush=True)
    bandwidth, latency = staging_bandwidth(device, *((8,), 8, 5) if args.smoke_cpu else ())
    root = args.work
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    try:
        model = build_model(root, layers=size.layers, experts=size.experts, top_k=size.top_k,
                            hidden=size.hidden, dtype=size.dtype)
        print(f"model: qwen3_moe {size.layers} layers x {size.experts} experts, top-"
              f"{size.top_k}, hidden {size.hidden}, {size.dtype} "
              f"({time.perf_counter() - start:.0f} s)", flush=True)
        resident = place(model, root / "resident")
        runtime_overhead(model, resident, size)
        prompts = held_out_prompts(root / "prompts.jsonl", size.prompts)
        base = base_steps(model, resident, prompts, size)
        shutil.rmtree(resident)
        spec = write_spec(root / "box.toml", bandwidth, latency, base)
        campaign(model, root, spec, prompts, size)
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    print(f"bench_gpu: {time.perf_counter() - start:.0f} s", flush=True)


if __name__ == "__main__":
    main()
