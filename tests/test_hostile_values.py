"""Option values and specs as a hostile user types them (issue 27): each is one line on
stderr naming the option or field and what was expected, exit 1, never a traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_errors import assert_one_line_error
from tiny_pipeline import BOX, Pipeline, build_pipeline, invoke

HUGE = "99999999999999999999"
LONG_PATH = "/tmp/" + "/".join(["a" * 200] * 25)  # 5 kB: past PATH_MAX


@pytest.fixture(scope="module")
def pipe(tmp_path_factory: pytest.TempPathFactory, prose: list[str]) -> Pipeline:
    return build_pipeline(tmp_path_factory.mktemp("values"), prose)


def solve(p: Pipeline, out: Path, *extra: object) -> list:
    return ["solve", "--model", p.model, "--hardware", BOX, "--traces", p.traces, "--solver",
            "greedy", "--steps", 8, "--out", out, *extra]


def collect_server(p: Pipeline, out: Path, *extra: object) -> list:
    return ["collect", "--engine", "sglang", "--model", p.model, "--corpus", p.root / "c.jsonl",
            "--out", out, "--no-progress", *extra]


CASES = {
    "solve --page-size 1e30": (lambda p, w: solve(p, w / "p.json", "--offload", 0.5,
                                                  "--page-size", "1e30"),
                               "--page-size must be 1..2**60 bytes"),
    "solve --budget 1e30": (lambda p, w: solve(p, w / "p.json", "--budget", "1e30"),
                            "--budget must be 0..2**60 bytes"),
    "evaluate --cache-slots 10**20": (
        lambda p, w: ["evaluate", p.plan, "--traces", p.traces, "--cache-slots", HUGE],
        "--cache-slots: expected an integer of at most 9223372036854775807"),
    "evaluate --cache-slots 2**40": (
        lambda p, w: ["evaluate", p.plan, "--traces", p.traces, "--cache-slots", 2**40],
        "--cache-slots must be in 0.."),
    "probe --host --mb 10**12": (lambda p, w: ["probe", "--host", "--mb", 10**12],
                                 "is more than this host can hold twice"),
    "probe --host --tokens 10**12": (lambda p, w: ["probe", "--host", "--tokens", 10**12],
                                     "expected a positive count up to 16384"),
    "collect --tag of 300 bytes": (
        lambda p, w: ["collect", "--model", p.model, "--corpus", p.root / "c.jsonl", "--tag",
                      "t" * 300, "--out", w / "t", "--no-progress"],
        "is 300 characters long: at most 200"),
    "collect --server http://[::1": (
        lambda p, w: collect_server(p, w / "t", "--server", "http://[::1"),
        "expected http://HOST:PORT (Invalid IPv6 URL)"),
    "collect --server of a 300-character host": (
        lambda p, w: collect_server(p, w / "t", "--server", f"http://{'h' * 300}:30000"),
        "is not one DNS can carry"),
    "collect --request-timeout nan": (
        lambda p, w: collect_server(p, w / "t", "--server", "http://127.0.0.1:9",
                                    "--request-timeout", "nan"),
        "--request-timeout: expected a finite number, got nan"),
    "collect --request-timeout inf": (
        lambda p, w: collect_server(p, w / "t", "--server", "http://127.0.0.1:9",
                                    "--request-timeout", "inf"),
        "--request-timeout: expected a finite number, got inf"),
    "inspect a path past PATH_MAX": (lambda p, w: ["inspect", LONG_PATH],
                                     "CHECKPOINT: a path of 5029 bytes (at most 4095"),
    "solve --out past PATH_MAX": (lambda p, w: solve(p, LONG_PATH + "/p.json", "--offload", 0.5),
                                  "--out: a path of 5036 bytes"),
    "solve --out onto a symlink loop": (
        lambda p, w: solve(p, w / "loop", "--offload", 0.5),
        "Too many levels of symbolic links"),
    "export sglang --out onto a symlink loop": (
        lambda p, w: ["export", "sglang", p.plan, "--out", w / "loop.json"],
        "Too many levels of symbolic links"),
    "export llamacpp --out onto a symlink loop": (
        lambda p, w: ["export", "llamacpp", p.plan, "--out", w / "loop"],
        "Too many levels of symbolic links"),
    "export ktransformers --out onto a symlink loop": (
        lambda p, w: ["export", "ktransformers", p.plan, "--union", "--out", w / "loop.pt"],
        "Too many levels of symbolic links"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_hostile_option_values_are_one_line(pipe: Pipeline, tmp_path: Path, case: str) -> None:
    (pipe.root / "c.jsonl").write_text(json.dumps({"text": "To be, or not to be"}) + "\n")
    for name in ("loop", "loop.json", "loop.pt"):
        (tmp_path / name).symlink_to(name)
    build, needle = CASES[case]
    assert_one_line_error(invoke(*build(pipe, tmp_path)), needle)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["loop", "loop.json", "loop.pt"]


SPECS = {
    "[host] flops = 5e-324": (("flops = \"5GFLOPS\"", "flops = 5e-324"),
                              "host.flops: expected a finite number >= 1e+06"),
    "[host] flops = \"1e-300FLOPS\"": (("flops = \"5GFLOPS\"", "flops = \"1e-300FLOPS\""),
                                       "host.flops: expected a finite number >= 1e+06"),
    "h2d_bandwidth of 1 B/s": (("h2d_bandwidth = \"0.5GB/s\"", "h2d_bandwidth = \"1B/s\""),
                               "h2d_bandwidth: expected a positive rate from 1MB/s"),
    "a deeply nested table": (("sync_us = 5.0", "sync_us = 5.0\nx = " + "[" * 3000 + "]" * 3000),
                              "nested too deeply to be a spec"),
    "nested 100 deep": (("sync_us = 5.0", "sync_us = 5.0\nx = " + "[" * 100 + "]" * 100),
                        "nested deeper than 64 levels"),
    "a 5000-digit integer": (("sockets", "x"), "invalid TOML"),
}


@pytest.mark.parametrize("case", sorted(SPECS))
def test_hostile_specs_are_one_line(pipe: Pipeline, tmp_path: Path, case: str) -> None:
    (old, new), needle = SPECS[case]
    text = BOX.read_text()
    if case == "a 5000-digit integer":
        text = text.replace("sync_us = 5.0", "sync_us = 5.0\nsockets = " + "7" * 5000)
    else:
        assert old in text
        text = text.replace(old, new)
    spec = tmp_path / "box.toml"
    spec.write_text(text)
    for args in (["hardware", "show", spec],
                 ["solve", "--model", pipe.model, "--hardware", spec, "--traces", pipe.traces,
                  "--offload", 0.5, "--execution", "cpu", "--solver", "greedy", "--steps", 8,
                  "--out", tmp_path / "p.json"]):
        assert_one_line_error(invoke(*args), needle)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["box.toml"]
