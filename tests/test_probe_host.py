"""`placer probe --host` (no GPU needed): the roofline figures, the measured expert curves it
records as `[[host.expert]]`, how a spec reads them back, and the CPU-expert benchmark."""

from __future__ import annotations

import importlib.util
import json
import math
import re
import sys
import tomllib
from pathlib import Path

import pytest
import torch

from placer.errors import PlacerError
from placer.hardware.expert_probe import non_decreasing, pool_size, probe_expert, run_expert
from placer.hardware.probe import HostProbe, format_flops, host_fragment, last_level_cache_bytes
from placer.hardware.spec import parse_spec, spec_from_json
from placer.hardware.timing import ExpertTiming
from placer.plan.solve import host_of
from solvers.cpu import roofline_seconds

REPO = Path(__file__).resolve().parent.parent
# an 8 MiB copy, a 64-row matmul, a tiny expert at two token counts: a fast probe
SMALL = ("--mb", "8", "--tokens", "64", "--expert", "64x32", "--expert-tokens", "1,4")


@pytest.fixture(scope="module")
def bench():
    """benchmarks/bench_cpu_experts.py as a module (benchmarks/ is not a package)."""
    path = REPO / "benchmarks" / "bench_cpu_experts.py"
    spec = importlib.util.spec_from_file_location("bench_cpu_experts", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.usefixtures("quick_host_probe")
def test_probe_host_json_needs_no_gpu(cli, dtype: str) -> None:
    threads_before = torch.get_num_threads()
    out = json.loads(cli("probe", "--host", "--json", "--dtype", dtype, *SMALL).stdout)
    assert torch.get_num_threads() == threads_before  # the probe restores torch's threads
    for key in ("memory_bandwidth", "flops", "sync_us"):
        assert math.isfinite(out[key]) and out[key] > 0, key
    assert out["dtype"] == dtype
    assert out["buffer_bytes"] == 8 * 2**20 and out["matmul"] == [64, 2048, 768]
    assert out["sync_measured"] == torch.cuda.is_available()
    (timing,) = out["experts"]
    assert (timing["hidden"], timing["inter"], timing["dtype"]) == (64, 32, dtype)
    assert timing["tokens"] == [1, 4] and 0 < timing["seconds"][0] <= timing["seconds"][1]


@pytest.mark.usefixtures("quick_host_probe")
def test_probe_host_fragment_parses_as_the_host_table(cli) -> None:
    text = cli("probe", "--host", *SMALL).stdout
    host = tomllib.loads(text)["host"]
    assert set(host) == {"memory_bandwidth", "flops", "sync_us", "expert"}
    (expert,) = host["expert"]
    assert expert["hidden"] == 64 and expert["tokens"] == [1, 4] and len(expert["ms"]) == 2
    assert host["memory_bandwidth"].endswith("GB/s") and host["flops"].endswith("FLOPS")
    assert float(host["memory_bandwidth"].removesuffix("GB/s")) > 0
    assert isinstance(host["sync_us"], float) and host["sync_us"] > 0


def test_fragment_figures_and_comments() -> None:
    probe = HostProbe(memory_bandwidth=12.3456e9, flops=567.8e9, sync_us=30.0,
                      sync_measured=False, dtype="bfloat16", threads=4,
                      buffer_bytes=256 * 2**20, matmul=(1024, 2048, 768), copies=5, matmuls=30)
    text = host_fragment(probe)
    assert tomllib.loads(text)["host"] == {"memory_bandwidth": "12.35GB/s",
                                           "flops": "567.8GFLOPS", "sync_us": 30.0}
    assert "typical, not measured" in text and "torch bfloat16 matmul" in text
    measured = host_fragment(HostProbe(**{**probe.__dict__, "sync_us": 12.26,
                                          "sync_measured": True}))
    assert tomllib.loads(measured)["host"]["sync_us"] == 12.3
    assert "typical" not in measured


def test_fragment_is_read_by_the_hardware_spec() -> None:
    probe = HostProbe(memory_bandwidth=23.456e9, flops=1.234e12, sync_us=15.0,
                      sync_measured=True, dtype="float32", threads=2,
                      buffer_bytes=2**28, matmul=(1024, 2048, 768), copies=5, matmuls=30)
    spec = parse_spec({"name": "box", "cards": 1,
                       "card": {"vram": "24GiB", "h2d_bandwidth": "25GB/s", "latency_us": 10},
                       "decode": {"base_step_ms": {"1": 10.0}},
                       **tomllib.loads(host_fragment(probe))})
    assert spec.host.memory_bandwidth == 23.46e9
    assert spec.host.flops == pytest.approx(1.234e12, rel=1e-12)
    assert spec.host.sync_s == pytest.approx(15e-6, rel=1e-12) and spec.host.sockets == 1


def test_format_flops_units() -> None:
    assert format_flops(1.5e12) == "1.5TFLOPS"
    assert format_flops(393.52e9) == "393.5GFLOPS"
    assert format_flops(2e15) == "2PFLOPS"


def test_probe_host_bad_options_are_one_line(cli) -> None:
    result = cli("probe", "--host", "--dtype", "float16", ok=False)
    assert result.exit_code == 1 and "bfloat16, float32" in result.output
    assert "Traceback" not in result.output
    result = cli("probe", "--host", "--mb", "0", ok=False)
    assert result.exit_code == 1 and "--mb must be >= 1" in result.output
    result = cli("probe", "--host", "--tokens", "0", ok=False)
    assert result.exit_code == 1 and "--tokens must be >= 1" in result.output


def test_pool_outgrows_the_cache() -> None:
    for expert_bytes, cache in [(9_437_184, 32 * 2**20), (49_766_400, 32 * 2**20),
                                (1000, 10**6), (10**9, 0)]:
        count = pool_size(expert_bytes, cache)
        assert count * expert_bytes > 4 * cache and count >= 4
        assert count == 4 or (count - 1) * expert_bytes <= 4 * cache
    assert last_level_cache_bytes() >= 0


def test_run_expert_is_the_swiglu_expert() -> None:
    gen = torch.Generator().manual_seed(0)
    gate, up = torch.randn(6, 4, generator=gen), torch.randn(6, 4, generator=gen)
    down, x = torch.randn(4, 6, generator=gen), torch.randn(3, 4, generator=gen)
    g, u = x @ gate.T, x @ up.T
    expected = (g / (1 + torch.exp(-g)) * u) @ down.T
    torch.testing.assert_close(run_expert(x, (gate, up, down)), expected)


def test_non_decreasing_pools_adjacent_violators() -> None:
    assert non_decreasing([1.0, 3.0, 2.0, 4.0]) == [1.0, 2.5, 2.5, 4.0]
    assert non_decreasing([5.0, 1.0, 1.0, 7.0]) == [pytest.approx(7 / 3)] * 3 + [7.0]
    assert non_decreasing([1.0, 2.0]) == [1.0, 2.0] and non_decreasing([]) == []


def test_probed_curve_never_falls_and_reaches_the_cpu_model() -> None:
    """The probe's points never fall (medians, adjacent violators pooled); the spec reads its
    fragment back, in TOML and in a plan's JSON, and the cpu model predicts from it."""
    timing = probe_expert(64, 32, "float32", cache_bytes=0, threads=1, tokens=(1, 2, 8))
    assert timing.tokens == (1, 2, 8) and timing.expert_bytes == 3 * 64 * 32 * 4
    assert all(b >= a > 0 for a, b in zip(timing.seconds, timing.seconds[1:], strict=False))
    probe = HostProbe(memory_bandwidth=1e10, flops=1e11, sync_us=30.0, sync_measured=False,
                      dtype="float32", threads=1, buffer_bytes=2**23, matmul=(64, 2048, 768),
                      copies=5, matmuls=5, experts=(timing,))
    data = {"name": "box", "cards": 1,
            "card": {"vram": "24GiB", "h2d_bandwidth": "25GB/s", "latency_us": 10},
            "decode": {"base_step_ms": {"1": 10.0}}, **tomllib.loads(host_fragment(probe))}
    spec = parse_spec(data)
    (read,) = spec.host.expert
    assert read.tokens == timing.tokens and read.dtype == "float32"
    assert read.seconds == pytest.approx(timing.seconds, rel=1e-3)  # 4 significant digits
    assert spec.host.offload_min_batch == 32
    assert spec_from_json(json.loads(json.dumps(spec.to_json()))).host == spec.host
    solver_host = host_of(spec, 64)
    assert solver_host.curves[0].expert_bytes == timing.expert_bytes
    assert float(solver_host.expert_seconds(timing.expert_bytes, 1.0, 2)) == pytest.approx(
        read.seconds[1], rel=1e-12)


def test_bad_expert_tables_and_offload_are_one_line() -> None:
    base = {"name": "box", "cards": 1,
            "card": {"vram": "24GiB", "h2d_bandwidth": "25GB/s"},
            "decode": {"base_step_ms": {"1": 10.0}}}
    host = {"memory_bandwidth": "10GB/s", "flops": "1TFLOPS", "sync_us": 30.0}
    good = {"hidden": 8, "inter": 4, "dtype": "bfloat16", "tokens": [1, 2], "ms": [1.0, 2.0]}
    cases = [({"offload_min_batch": -1}, "offload_min_batch: expected an integer"),
             ({"expert": [{**good, "dtype": "fp8"}]}, "expert[0].dtype"),
             ({"expert": [{**good, "tokens": [2, 1]}]}, "expected ascending integers"),
             ({"expert": [{**good, "ms": [2.0, 1.0]}]}, "never fall"),
             ({"expert": [{**good, "ms": [1.0]}]}, "same length"),
             ({"expert": [{**good, "extra": 1}]}, "unknown field 'extra'"),
             ({"expert": {"hidden": 8}}, "expected a list of tables")]
    for extra, needle in cases:
        with pytest.raises(PlacerError, match=re.escape(needle)):
            parse_spec({**base, "host": {**host, **extra}})
    spec = parse_spec({**base, "host": {**host, "offload_min_batch": 0, "expert": [good]}})
    assert spec.host.offload_min_batch == 0
    assert spec.host.expert == (ExpertTiming(8, 4, "bfloat16", (1, 2), (1e-3, 2e-3)),)


def test_probe_host_bad_expert_options(cli) -> None:
    for args, needle in ((("--expert", "2048"), "HIDDENxINTER"),
                         (("--expert-tokens", "4,2"), "ascending counts")):
        result = cli("probe", "--host", *args, ok=False)
        assert result.exit_code == 1 and needle in result.output
        assert result.output.count("\n") == 1


def test_bench_rows_on_a_tiny_expert(bench) -> None:
    timing = ExpertTiming(64, 32, "bfloat16", (1, 4), (2e-5, 5e-5))
    rows = bench.measure("tiny", timing, [1, 2, 4], calls=3, memory_bandwidth=1e9, flops=1e10,
                         cache_bytes=0)
    assert [r.tokens for r in rows] == [1, 2, 4] and all(r.experts == 4 for r in rows)
    assert [r.predicted_s for r in rows] == pytest.approx([2e-5, 3e-5, 5e-5])
    for r in rows:
        assert r.expert_bytes == 3 * 64 * 32 * 2 and r.expert_flops == 2 * 3 * 64 * 32
        assert r.roofline_s == float(roofline_seconds(r.expert_bytes, r.expert_flops, r.tokens,
                                                      1e9, 1e10))
        assert 0 < r.best_s <= r.measured_s and math.isfinite(r.ratio)
