"""The CLI's error contract, as properties over generated bad input (hypothesis).

For every command and option: a bad value (negative or huge ints, NaN / inf / negative
floats, empty strings, paths that are missing, a file or a directory where the other is
wanted), a mutated plan (fields dropped, retyped, duplicated, out of range, a top-level list)
or a mutated hardware spec (NaN, inf, negative, wrong types, missing tables, non-UTF-8) gives
exit status 1 (2 for click's usage errors), exactly one line on stderr starting with
`error:`, no traceback, and no file left behind in the output location.

One tiny model is built and run through collect, solve and emit once for the module; every
other call fails at its inputs, so each example costs milliseconds. Examples are derandomized,
so a strategy marked xfail (a fault in a file this test's owner does not own) fails the same
way on every run.
"""

from __future__ import annotations

import copy
import json
import math
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from tiny_pipeline import BOX, Pipeline, build_pipeline, invoke

# No shrinking and one bug per test: a failing example is reported as found (and an xfail
# case stops at its first failure instead of replaying the command while it shrinks).
SETTINGS = settings(max_examples=4, deadline=None, derandomize=True, database=None,
                    phases=(Phase.explicit, Phase.generate), report_multiple_bugs=False,
                    suppress_health_check=[HealthCheck.function_scoped_fixture,
                                           HealthCheck.too_slow])


@pytest.fixture(scope="module")
def pipe(tmp_path_factory: pytest.TempPathFactory, prose: list[str]) -> Pipeline:
    return build_pipeline(tmp_path_factory.mktemp("cli-properties"), prose)


def snapshot(*dirs: Path) -> dict[Path, tuple[int, int]]:
    """Every file under `dirs` with its size and mtime."""
    return {f: (f.stat().st_size, f.stat().st_mtime_ns) for d in dirs for f in d.rglob("*")}


def assert_refused(args: list, pipe: Pipeline, work: Path) -> None:
    """The property: exit 1 (2 for usage errors), one `error:` line on stderr, no traceback,
    nothing written into `work` (where every output of `args` points) or the pipeline."""
    before = snapshot(work, pipe.root)
    result = invoke(*args)
    shown = " ".join(map(str, args))
    assert isinstance(result.exception, SystemExit), f"placer {shown}: {result.exception!r}"
    assert result.exit_code in (1, 2), f"placer {shown} exited {result.exit_code}"
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), f"placer {shown}: {lines}"
    assert "Traceback" not in result.output
    assert snapshot(work, pipe.root) == before, f"placer {shown} left files behind"


def workdir(pipe: Pipeline) -> Path:
    """A fresh directory per example: the output location, and where bad paths live."""
    work = Path(tempfile.mkdtemp(prefix="cli-properties-work", dir=pipe.root.parent))
    (work / "junk.bin").write_bytes(b"\x00\xffnot what you think\n")
    (work / "empty").mkdir()
    return work


def bad_path(kind: str, work: Path) -> Path:
    return {"missing": work / "no-such-thing", "file": work / "junk.bin",
            "dir": work / "empty"}[kind]


# --- bad option values -----------------------------------------------------------------------

NEG = st.integers(max_value=-1)
NON_POSITIVE = st.integers(max_value=0)
HUGE = st.integers(min_value=2**63, max_value=2**80)
BAD_FLOAT = st.sampled_from(["nan", "inf", "-inf", "-1", "-0.5", "NaN"])
EMPTY = st.sampled_from(["", " ", "\t"])
PATHS = st.sampled_from(["missing", "file", "dir"])
NOT_DIR = st.sampled_from(["missing", "file"])
DEVICES = st.sampled_from(["cuda:7", "gpu", "cuda:-1", "cpu:0", "meta", "", "cuda:x"])
BAD_LIST = st.sampled_from(["0", "-1", "", "x", "1,,x", "nan"])


@dataclass(frozen=True)
class Case:
    """`placer ARGS` with one option made bad: build(pipe, work, value) -> argv."""

    name: str
    values: st.SearchStrategy
    build: Callable[[Pipeline, Path, object], list]
    owner: str | None = None  # file whose fault it is, where this case is known to fail


def collect(pipe: Pipeline, work: Path, *extra) -> list:
    return ["collect", "--model", pipe.model, "--out", work / "traces", "--random-tokens", 8,
            "--max-length", 8, "--no-progress", *extra]


def solve(pipe: Pipeline, work: Path, *extra, offload: bool = True) -> list:
    return ["solve", "--model", pipe.model, "--hardware", BOX, "--traces", pipe.traces,
            "--solver", "greedy", "--steps", 16, "--out", work / "plan.json",
            *(["--offload", 0.5] if offload else []), *extra]


def evaluate(pipe: Pipeline, work: Path, *extra) -> list:
    return ["evaluate", pipe.plan, "--traces", pipe.traces, "--steps", 8,
            "--oracle-time-limit", 1, "--plot", work / "e.png", *extra]


def run(pipe: Pipeline, work: Path, *extra, prompt: str = "hi") -> list:
    return ["run", pipe.placed, "--model", pipe.model, "--prompt", prompt,
            "--max-new-tokens", 2, *extra]


def serve(pipe: Pipeline, *extra) -> list:
    return ["serve", pipe.placed, "--model", pipe.model, "--device", "cpu", "--port", 0,
            *extra]


def prompts_file(work: Path) -> Path:
    prompts = work / "prompts.txt"
    prompts.write_text("Hello there\n\nGood morning\n")
    return prompts


def bench(pipe: Pipeline, work: Path, *extra) -> list:
    prompts = prompts_file(work)
    return ["bench", pipe.placed, "--model", pipe.model, "--prompts", prompts, "--device",
            "cpu", "--trials", 1, "--concurrency", 1, "--max-new-tokens", 2, *extra]


def plan_copy(pipe: Pipeline, work: Path) -> Path:
    copy_path = work / "plan.json"
    copy_path.write_bytes(pipe.plan.read_bytes())
    return copy_path


OPTION_CASES = [
    # collect
    Case("collect --seed", NEG | HUGE, lambda p, w, v: collect(p, w, "--seed", v)),
    Case("collect --device", DEVICES, lambda p, w, v: collect(p, w, "--device", v)),
    Case("collect --batch-size", NON_POSITIVE, lambda p, w, v: collect(p, w, "--batch-size", v)),
    Case("collect --max-length", NON_POSITIVE, lambda p, w, v: collect(p, w, "--max-length", v)),
    Case("collect --max-new-tokens", NON_POSITIVE,
         lambda p, w, v: collect(p, w, "--max-new-tokens", v)),
    Case("collect --max-tokens", NON_POSITIVE, lambda p, w, v: collect(p, w, "--max-tokens", v)),
    Case("collect --random-tokens", NEG, lambda p, w, v: collect(p, w, "--random-tokens", v)),
    Case("collect --mode", EMPTY, lambda p, w, v: collect(p, w, "--mode", v)),
    Case("collect --dtype", EMPTY, lambda p, w, v: collect(p, w, "--dtype", v)),
    Case("collect --corpus", PATHS, lambda p, w, v: collect(p, w, "--corpus", bad_path(v, w))),
    Case("collect --model", PATHS, lambda p, w, v: ["collect", "--model", bad_path(v, w),
                                                    "--out", w / "t", "--random-tokens", 8]),
    Case("collect --out", st.just("file"),
         lambda p, w, v: ["collect", "--model", p.model, "--out", bad_path(v, w),
                          "--random-tokens", 8, "--max-length", 8, "--no-progress"]),
    # solve
    Case("solve --time-limit", BAD_FLOAT, lambda p, w, v: solve(p, w, "--time-limit", v)),
    Case("solve --offload", BAD_FLOAT | st.sampled_from(["0", "1", "2"]),
         lambda p, w, v: solve(p, w, "--offload", v, offload=False)),
    Case("solve --steps", NON_POSITIVE, lambda p, w, v: solve(p, w, "--steps", v)),
    Case("solve --seed", NEG | HUGE, lambda p, w, v: solve(p, w, "--seed", v)),
    Case("solve --budget", st.sampled_from(["-1GB", "x", "", "nan", "1e400GB"]),
         lambda p, w, v: solve(p, w, "--budget", v, offload=False)),
    Case("solve --concurrency", BAD_LIST, lambda p, w, v: solve(p, w, "--concurrency", v)),
    Case("solve --weights", BAD_LIST, lambda p, w, v: solve(p, w, "--weights", v)),
    Case("solve --page-size", BAD_LIST, lambda p, w, v: solve(p, w, "--page-size", v)),
    Case("solve --traces", PATHS, lambda p, w, v: ["solve", "--model", p.model, "--hardware",
                                                   BOX, "--traces", bad_path(v, w), "--offload",
                                                   0.5, "--out", w / "plan.json"]),
    Case("solve --hardware", PATHS,
         lambda p, w, v: solve(p, w)[:3] + ["--hardware", bad_path(v, w)] + solve(p, w)[5:]),
    Case("solve --solver/--ep/--execution", st.sampled_from(["--solver", "--ep", "--execution"]),
         lambda p, w, v: solve(p, w, v, "bogus")),
    # emit
    Case("emit --align", st.integers(max_value=7) | st.sampled_from([12, 100, 4097]),
         lambda p, w, v: ["emit", "--plan", p.plan, "--model", p.model, "--out", w / "placed",
                          "--align", v]),
    Case("emit --plan", PATHS, lambda p, w, v: ["emit", "--plan", bad_path(v, w), "--model",
                                                p.model, "--out", w / "placed"]),
    Case("emit --model", PATHS, lambda p, w, v: ["emit", "--plan", p.plan, "--model",
                                                 bad_path(v, w), "--out", w / "placed"]),
    Case("emit --out", st.just("file"), lambda p, w, v: ["emit", "--plan", p.plan, "--model",
                                                         p.model, "--out", bad_path(v, w)]),
    # verify
    Case("verify PLACED", PATHS, lambda p, w, v: ["verify", bad_path(v, w), "--model",
                                                  p.model]),
    Case("verify --model", PATHS, lambda p, w, v: ["verify", p.placed, "--model",
                                                   bad_path(v, w)]),
    # evaluate
    Case("evaluate --steps", NON_POSITIVE, lambda p, w, v: evaluate(p, w, "--steps", v)),
    Case("evaluate --seed", NEG | HUGE, lambda p, w, v: evaluate(p, w, "--seed", v)),
    Case("evaluate --oracle-time-limit", BAD_FLOAT,
         lambda p, w, v: evaluate(p, w, "--oracle-time-limit", v)),
    Case("evaluate --folds", NON_POSITIVE, lambda p, w, v: evaluate(p, w, "--curve", "--folds",
                                                                    v)),
    Case("evaluate --cache-slots", NEG, lambda p, w, v: evaluate(p, w, "--cache-slots", v)),
    Case("evaluate --concurrency", BAD_LIST, lambda p, w, v: evaluate(p, w, "--concurrency", v)),
    Case("evaluate --plot", st.sampled_from(["x.json", "x.txt"]),
         lambda p, w, v: evaluate(p, w)[:-2] + ["--plot", w / v]),
    Case("evaluate PLAN", PATHS, lambda p, w, v: ["evaluate", bad_path(v, w), "--traces",
                                                  p.traces]),
    Case("evaluate --traces", PATHS, lambda p, w, v: ["evaluate", p.plan, "--traces",
                                                      bad_path(v, w)]),
    # run
    Case("run --cache-slots", NEG | st.integers(min_value=2**16 + 1),
         lambda p, w, v: run(p, w, "--cache-slots", v)),
    Case("run --prompt", EMPTY, lambda p, w, v: run(p, w, prompt=v)),
    Case("run --device", DEVICES, lambda p, w, v: run(p, w, "--device", v)),
    Case("run --max-new-tokens", NON_POSITIVE, lambda p, w, v: run(p, w, "--max-new-tokens", v)),
    Case("run PLACED", PATHS, lambda p, w, v: ["run", bad_path(v, w), "--model", p.model,
                                               "--prompt", "hi"]),
    # serve (every case fails before the server would start)
    Case("serve --port", NEG | st.integers(min_value=65536),
         lambda p, w, v: serve(p, "--port", v)),
    Case("serve --cache-slots", NEG | st.integers(min_value=2**16 + 1),
         lambda p, w, v: serve(p, "--cache-slots", v)),
    Case("serve --device", DEVICES, lambda p, w, v: serve(p, "--device", v)),
    Case("serve --kv-tokens", NON_POSITIVE, lambda p, w, v: serve(p, "--kv-tokens", v)),
    Case("serve --max-prompt-tokens", NON_POSITIVE,
         lambda p, w, v: serve(p, "--max-prompt-tokens", v)),
    Case("serve --batching", EMPTY | st.just("bogus"), lambda p, w, v: serve(p, "--batching", v)),
    Case("serve --host", st.sampled_from(["no such host", "256.1.1.1"]),
         lambda p, w, v: serve(p, "--host", v)),
    Case("serve PLACED", PATHS, lambda p, w, v: ["serve", bad_path(v, w), "--model", p.model,
                                                 "--port", 0, "--device", "cpu"]),
    # bench
    Case("bench --concurrency", BAD_LIST, lambda p, w, v: bench(p, w, "--concurrency", v)),
    Case("bench --trials", NON_POSITIVE, lambda p, w, v: bench(p, w, "--trials", v)),
    Case("bench --max-new-tokens", NON_POSITIVE,
         lambda p, w, v: bench(p, w, "--max-new-tokens", v)),
    Case("bench --cache-slots", NEG, lambda p, w, v: bench(p, w, "--cache-slots", v)),
    Case("bench --device", DEVICES, lambda p, w, v: bench(p, w, "--device", v)),
    Case("bench --plot", st.sampled_from(["x.json", "x.txt"]),
         lambda p, w, v: bench(p, w, "--plot", w / v)),
    Case("bench --prompts", PATHS, lambda p, w, v: ["bench", p.placed, "--model", p.model,
                                                    "--prompts", bad_path(v, w)]),
    Case("bench PLACED", PATHS, lambda p, w, v: ["bench", bad_path(v, w), "--model", p.model,
                                                 "--prompts", prompts_file(w)]),
    # inspect, hardware, traces
    Case("inspect CHECKPOINT", PATHS, lambda p, w, v: ["inspect", bad_path(v, w)]),
    Case("inspect --config", PATHS, lambda p, w, v: ["inspect", "--config", bad_path(v, w)]),
    Case("inspect --expert-dtype", EMPTY | st.just("int3"),
         lambda p, w, v: ["inspect", "--config", p.model / "config.json", "--expert-dtype", v]),
    Case("hardware show", PATHS, lambda p, w, v: ["hardware", "show", bad_path(v, w)]),
    Case("traces stats", PATHS, lambda p, w, v: ["traces", "stats", bad_path(v, w)]),
    Case("traces stats --phase", st.sampled_from(["bogus", "", "Decode"]),
         lambda p, w, v: ["traces", "stats", p.traces, "--phase", v]),
    Case("traces stats --plot", st.sampled_from(["x.json", "empty", "nodir/x.png"]),
         lambda p, w, v: ["traces", "stats", p.traces, "--plot", w / v]),
    Case("traces import", NOT_DIR, lambda p, w, v: ["traces", "import", bad_path(v, w), "--out",
                                                    w / "imported", "--model", p.model]),
    # export
    Case("export sglang PLAN", PATHS, lambda p, w, v: ["export", "sglang", bad_path(v, w),
                                                       "--out", w / "loc.json"]),
    Case("export sglang --out PLAN", st.just(None),
         lambda p, w, v: ["export", "sglang", plan_copy(p, w), "--out", w / "plan.json"]),
    Case("export llamacpp PLAN", PATHS, lambda p, w, v: ["export", "llamacpp", bad_path(v, w),
                                                         "--out", w / "args.txt"]),
    Case("export llamacpp --out PLAN", st.just(None),
         lambda p, w, v: ["export", "llamacpp", plan_copy(p, w), "--out", w / "plan.json"]),
    Case("export ktransformers PLAN", PATHS,
         lambda p, w, v: ["export", "ktransformers", bad_path(v, w), "--out", w / "f.pt"]),
]


@pytest.mark.parametrize("case", [pytest.param(c, id=c.name) for c in OPTION_CASES])
def test_bad_option_value_is_one_line(pipe: Pipeline, case: Case) -> None:
    @SETTINGS
    @given(value=case.values)
    def check(value: object) -> None:
        work = workdir(pipe)
        assert_refused(case.build(pipe, work, value), pipe, work)

    check()


# --- mutated plans -----------------------------------------------------------------------------

def plan_fields(d: dict) -> list[tuple]:
    """Paths of the plan fields every command reads (mutating any must be refused)."""
    paths = [("model",), ("hardware",), ("budget",), ("page_size",), ("ep",), ("solver",),
             ("cards",), ("experts",), ("model", "moe_layers"), ("model", "experts_per_layer"),
             ("model", "top_k"), ("model", "fingerprint"), ("hardware", "cards"),
             ("hardware", "base_step_ms"), ("hardware", "host_ram")]
    for c in range(len(d["cards"])):
        paths += [("cards", c, k) for k in ("index", "budget_bytes", "staging_bytes",
                                            "resident_bytes", "homed_bytes")]
        paths += [("hardware", "cards", c, k) for k in ("vram", "h2d_bandwidth", "latency_s")]
    for i in (0, len(d["experts"]) // 2, len(d["experts"]) - 1):
        paths += [("experts", i, k) for k in ("layer", "expert", "card", "bytes", "pages")]
        paths += [("experts", i, "pages", 0, k) for k in ("index", "offset", "length",
                                                          "resident")]
    return paths


def _node(d: dict, path: tuple) -> tuple[object, object]:
    node = d
    for k in path[:-1]:
        node = node[k]
    return node, path[-1]


WRONG = {int: ["7", 1.5, None, [], {}, True, -1, float("nan")],
         str: [5, None, [], {}, True],
         bool: ["yes", 1, None, []],
         dict: [[], "x", None, 5],
         list: [{}, "x", None, 5, []],
         float: ["fast", None, [], True, -1.0, float("nan"), float("inf")]}


@st.composite
def mutated_plans(draw: st.DrawFn, base: dict) -> object:
    d = copy.deepcopy(base)
    kind = draw(st.sampled_from(["drop", "retype", "duplicate", "range", "top-list"]))
    if kind == "top-list":
        return [d]
    if kind == "duplicate":
        i = draw(st.integers(0, len(d["experts"]) - 2))
        d["experts"][i + 1] = copy.deepcopy(d["experts"][i])
        return d
    if kind == "range":
        i = draw(st.integers(0, len(d["experts"]) - 1))
        field = draw(st.sampled_from(["layer", "expert", "card"]))
        limit = {"layer": d["model"]["num_layers"], "expert": d["model"]["experts_per_layer"],
                 "card": len(d["cards"])}[field]
        d["experts"][i][field] = draw(st.integers(limit, limit + 1000) | st.integers(-1000, -1))
        return d
    node, key = _node(d, draw(st.sampled_from(plan_fields(base))))
    if kind == "drop":
        if isinstance(node, list):
            del node[key]
        else:
            node.pop(key)
        return d
    value = node[key]
    wrong = WRONG[float if isinstance(value, float) else type(value)]
    if value is None:  # page_size of a one-page plan
        wrong = ["x", 1.5, [], -1, 0]
    node[key] = draw(st.sampled_from([w for w in wrong if w != value or isinstance(w, bool)]))
    return d


def test_mutated_plan_is_one_line(pipe: Pipeline) -> None:
    base = json.loads(pipe.plan.read_text())

    @settings(SETTINGS, max_examples=30)
    @given(plan=mutated_plans(base),
           command=st.sampled_from(["emit", "evaluate", "export llamacpp"]))
    def check(plan: object, command: str) -> None:
        work = workdir(pipe)
        path = work / "plan.json"
        path.write_text(json.dumps(plan))
        args = {"emit": ["emit", "--plan", path, "--model", pipe.model, "--out", work / "out"],
                "evaluate": ["evaluate", path, "--traces", pipe.traces, "--steps", 8,
                             "--plot", work / "e.png"],
                "export llamacpp": ["export", "llamacpp", path, "--out", work / "args.txt"]}
        assert_refused(args[command], pipe, work)

    check()


# --- mutated hardware specs ---------------------------------------------------------------------

def toml_value(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float) and not math.isfinite(v):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    return "{ " + ", ".join(f"{json.dumps(str(k))} = {toml_value(x)}" for k, x in v.items()) + " }"


def to_toml(spec: dict) -> str:
    """A spec dict as TOML: scalars and inline values first, then [card], [[link]], [decode],
    [host] (whatever of them is a table)."""
    tables = {k: v for k, v in spec.items() if k in ("card", "decode", "host")
              and isinstance(v, dict)}
    links = spec.get("link") if isinstance(spec.get("link"), list) and all(
        isinstance(x, dict) for x in spec["link"]) else None
    lines = [f"{k} = {toml_value(v)}" for k, v in spec.items()
             if k not in tables and not (k == "link" and links is not None)]
    for name, table in tables.items():
        lines += [f"[{name}]", *(f"{json.dumps(str(k))} = {toml_value(v)}"
                                 for k, v in table.items())]
    for link in links or []:
        lines += ["[[link]]", *(f"{k} = {toml_value(v)}" for k, v in link.items())]
    return "\n".join(lines) + "\n"


SPEC_FIELDS = [("host_ram",), ("cards",), ("card",), ("decode",), ("card", "vram"),
               ("card", "h2d_bandwidth"), ("card", "latency_us"), ("card", "reserved_kv"),
               ("link", 0, "bandwidth"), ("link", 0, "cards"), ("decode", "base_step_ms"),
               ("decode", "base_step_ms", "1"), ("host", "memory_bandwidth"), ("host", "flops"),
               ("host", "sync_us"), ("host", "sockets")]
SPEC_WRONG = [float("nan"), float("inf"), float("-inf"), -1, -1.5, "5us", ["x"], True, {},
              "fast", 1e30, 2**70, "1e400GB", 0]
REQUIRED_SPEC = [("decode",), ("cards",), ("card", "vram"), ("card", "h2d_bandwidth"),
                 ("decode", "base_step_ms"), ("host", "flops"), ("link", 0, "bandwidth")]


@st.composite
def mutated_specs(draw: st.DrawFn, base: dict) -> bytes:
    d = copy.deepcopy(base)
    kind = draw(st.sampled_from(["retype", "drop", "duplicate-batch", "non-utf8"]))
    if kind == "non-utf8":
        text = to_toml(d).encode()
        at = draw(st.integers(0, len(text) - 1))
        return text[:at] + draw(st.sampled_from([b"\xff", b"\xc3\x28", b"\x80"])) + text[at:]
    if kind == "duplicate-batch":
        d["decode"]["base_step_ms"][draw(st.sampled_from(["01", "001", "+1"]))] = 2.0
        return to_toml(d).encode()
    path = draw(st.sampled_from(REQUIRED_SPEC if kind == "drop" else SPEC_FIELDS))
    node, key = _node(d, path)
    if kind == "drop":
        node.pop(key)
    else:
        node[key] = draw(st.sampled_from([w for w in SPEC_WRONG if _wrong_for(path, w)]))
    return to_toml(d).encode()


def _wrong_for(path: tuple, value: object) -> bool:
    """Whether `value` is invalid at `path` (0 is a valid reserve, size or latency)."""
    if value == 0 and not isinstance(value, bool):
        return path[-1] in ("h2d_bandwidth", "bandwidth", "memory_bandwidth", "flops",
                            "sockets", "1", "cards", "vram")
    return True


def test_mutated_spec_is_one_line(pipe: Pipeline) -> None:
    import tomllib

    base = tomllib.loads(BOX.read_text())

    @settings(SETTINGS, max_examples=30)
    @given(spec=mutated_specs(base), command=st.sampled_from(["hardware show", "solve"]))
    def check(spec: bytes, command: str) -> None:
        work = workdir(pipe)
        path = work / "box.toml"
        path.write_bytes(spec)
        args = ["hardware", "show", path] if command == "hardware show" else [
            "solve", "--model", pipe.model, "--hardware", path, "--traces", pipe.traces,
            "--offload", 0.5, "--solver", "greedy", "--steps", 16, "--out", work / "p.json"]
        assert_refused(args, pipe, work)

    check()


# --- the contract itself ------------------------------------------------------------------------

@pytest.mark.parametrize("args,message", [
    (["solve", "--bogus"], "error: No such option: --bogus"),
    (["hardware", "show"], "error: Missing argument 'name'."),
    (["collect", "--seed", "x"], "error: Invalid value for '--seed'"),
    (["emit", "--plan"], "error: Option '--plan' requires an argument."),
    (["hardware", "show", "1x-h200", "extra"], "error: Got unexpected extra argument(s)"),
])
def test_usage_errors_are_one_line_exit_2(args: list, message: str) -> None:
    result = invoke(*args)
    assert result.exit_code == 2 and isinstance(result.exception, SystemExit)
    assert result.stderr.startswith(message) and result.stderr.count("\n") == 1
    assert result.stdout == ""


def test_output_is_not_cut_when_not_a_terminal(tmp_path: Path) -> None:
    long_name = "an unusually long card model name " * 4
    path = tmp_path / "box.toml"
    path.write_text(BOX.read_text().replace('model = "toy"', f"model = {json.dumps(long_name)}"))
    shown = invoke("hardware", "show", path).stdout
    # tables fit 100 columns: a long cell wraps onto more lines of its column, nothing is cut
    models = " ".join(line.split("│")[2].strip() for line in shown.splitlines()
                      if line.startswith("│"))
    assert " ".join(long_name.split()) in " ".join(models.split())
    help_text = invoke("solve", "--help").stdout
    assert max(len(line) for line in help_text.splitlines()) > 80
    assert "Plan from a config.json alone, before downloading the weights." in help_text


# --- issue 27: paths into a checkpoint ---------------------------------------------------------

def writers(pipe: Pipeline, work: Path) -> dict[str, Callable[[Path], list]]:
    """Every command that writes, as a function of where its output goes."""
    return {
        "solve": lambda out: solve(pipe, work, "--out", out.with_suffix(".json")),
        "export sglang": lambda out: ["export", "sglang", pipe.plan, "--out",
                                      out.with_suffix(".json")],
        "export llamacpp": lambda out: ["export", "llamacpp", pipe.plan, "--out", out],
        "export ktransformers": lambda out: ["export", "ktransformers", pipe.plan, "--union",
                                             "--out", out.with_suffix(".pt")],
        "collect": lambda out: ["collect", "--model", pipe.model, "--random-tokens", 8,
                                "--max-length", 8, "--out", out, "--no-progress"],
        "traces import": lambda out: ["traces", "import", pipe.traces / "x.npy", "--top-k", 2,
                                      "--out", out],
        "traces stats --plot": lambda out: ["traces", "stats", pipe.traces, "--plot",
                                            out.with_suffix(".png")],
        "evaluate --plot": lambda out: evaluate(pipe, work, "--plot", out.with_suffix(".png")),
        "emit": lambda out: ["emit", "--plan", pipe.plan, "--model", pipe.model, "--out", out],
        "bench --plot": lambda out: ["bench", pipe.placed, "--model", pipe.model, "--prompts",
                                     work / "junk.bin", "--plot", out.with_suffix(".png")],
        "bench --spec-out": lambda out: ["bench", pipe.placed, "--prompts", work / "junk.bin",
                                         "--spec-out", out.with_suffix(".toml")],
        "probe --step --out": lambda out: ["probe", "--step", "--model", pipe.model,
                                           "--hardware", BOX, "--out", out.with_suffix(".toml")],
        "traces split": lambda out: ["traces", "split", pipe.traces, "--out-a", out,
                                     "--out-b", work / "b"],
        "plan": lambda out: ["plan", "--model", pipe.model, "--corpus", work / "c.jsonl",
                             "--hardware", BOX, "--out", out],
    }


NAMES_IN_A_CHECKPOINT = st.lists(
    st.sampled_from(["config.json", "model.safetensors", "tokenizer.json", "sub", "new",
                     ".hidden"]) | st.text("abcxyz_-.", min_size=1, max_size=8).filter(
        lambda s: s not in (".", "..")), min_size=1, max_size=3)


def test_no_writer_lands_in_a_checkpoint(pipe: Pipeline) -> None:
    """Whatever the path under the checkpoint (its own files, new names, nested, through a
    link to it), every writer refuses it in one line and the checkpoint is left as it was."""

    @settings(SETTINGS, max_examples=24)
    @given(writer=st.sampled_from(sorted(writers(pipe, pipe.root))),
           names=NAMES_IN_A_CHECKPOINT, via_link=st.booleans())
    def check(writer: str, names: list[str], via_link: bool) -> None:
        work = workdir(pipe)
        base = pipe.model
        if via_link:
            (work / "link").symlink_to(pipe.model)
            base = work / "link"
        out = base.joinpath(*names)
        assert_refused(writers(pipe, work)[writer](out), pipe, work)

    check()


# --- issue 27: integers past int64 and floats that are not numbers, in every option ----------

def numeric_options() -> list[tuple[str, str, str]]:
    """(command, option, "integer" or "float") for every numeric option of every command."""

    import typer

    from placer.cli import app

    found = []

    def walk(command, path: list[str]) -> None:
        for name, sub in getattr(command, "commands", {}).items():
            walk(sub, [*path, name])
        for param in getattr(command, "params", []):
            kind = {"IntParamType": "integer", "IntRange": "integer", "FloatParamType": "float",
                    "FloatRange": "float"}.get(type(param.type).__name__)
            if param.param_type_name == "option" and kind:
                found.append((" ".join(path), param.opts[0], kind))

    walk(typer.main.get_command(app), [])
    return found


def command_base(pipe: Pipeline, work: Path) -> dict[str, list]:
    """Each command with numeric options, with its required arguments."""
    return {"collect": collect(pipe, work), "solve": solve(pipe, work),
            "emit": ["emit", "--plan", pipe.plan, "--model", pipe.model, "--out",
                     work / "placed"],
            "evaluate": evaluate(pipe, work), "run": run(pipe, work),
            "probe": ["probe", "--host"],
            "hardware new": ["hardware", "new", "--card", "RTX 3060", "--pcie", "4.0x16",
                             "--ram", "ddr5-6000x2"],
            "traces import": ["traces", "import", pipe.traces, "--out", work / "i"],
            "traces split": ["traces", "split", pipe.traces, "--out-a", work / "a",
                             "--out-b", work / "b"],
            "bench": ["bench", pipe.placed, "--model", pipe.model, "--prompts",
                      work / "junk.bin"],
            "serve": ["serve", pipe.placed, "--model", pipe.model],
            "plan": ["plan", "--model", pipe.model, "--corpus", work / "corpus.jsonl",
                     "--hardware", BOX, "--out", work / "p"]}


def test_every_numeric_option_refuses_what_no_option_means(pipe: Pipeline) -> None:
    """An integer past int64 (which numpy, torch and the solvers cannot hold) or a float that
    is not a number, in any numeric option: one line naming the option, before anything
    runs. A new numeric option is covered by itself; a new command needs its base above."""
    options = numeric_options()
    assert len(options) > 20 and {c for c, _, _ in options} <= set(command_base(pipe,
                                                                               pipe.root))

    @settings(SETTINGS, max_examples=30)
    @given(option=st.sampled_from(options),
           huge=st.integers(2**63, 10**40) | st.integers(-10**40, -2**63 - 1),
           not_a_number=st.sampled_from(["nan", "inf", "-inf"]))
    def check(option: tuple[str, str, str], huge: int, not_a_number: str) -> None:
        command, flag, kind = option
        work = workdir(pipe)
        value = huge if kind == "integer" else not_a_number
        args = command_base(pipe, work)[command] + [flag, value]
        assert_refused(args, pipe, work)
        assert flag in invoke(*args).stderr

    check()


# --- issue 27: slow and broken servers ---------------------------------------------------------

def server_faults() -> st.SearchStrategy:
    """A misbehaving server's answer to every request (tests/raw_server.py)."""
    from raw_server import drip, http_reply, once, stream
    from test_input_properties import json_values

    body = st.binary(max_size=60)
    return st.one_of(
        st.tuples(st.just("drip"), st.floats(0.05, 0.2)).map(
            lambda t: drip(http_reply(b'{"output_ids": [1]}' + b" " * 100), t[1])),
        st.integers(2**21, 2**62).map(lambda n: once(http_reply(b"{}", length=n))),
        st.just(stream(b"HTTP/1.1 200 OK\r\n\r\n", b"[" * 65536, 256)),
        body.map(lambda b: once(b.replace(b"\r\n", b"") + b"\r\n\r\n")),  # garbage status
        body.map(lambda b: once(http_reply(b, length=len(b) + 10))),      # cut short
        body.map(lambda b: once(http_reply(b))),                          # not JSON
        st.integers(400, 599).flatmap(lambda code: body.map(
            lambda b: once(http_reply(b, status=f"{code} X\r\nX-Junk: \n")))),
        st.integers(65, 5000).map(lambda d: once(http_reply(b"[" * d + b"]" * d))),
        st.integers(21, 5000).map(lambda d: once(http_reply(b'{"output_ids": [' + b"7" * d
                                                             + b"]}"))),
        json_values.map(lambda v: once(http_reply(json.dumps(v).encode()))))


def test_a_misbehaving_server_is_one_line(pipe: Pipeline, monkeypatch) -> None:
    """Replies that drip, that are huge or cut short, garbage status lines, error statuses,
    bodies that are not JSON, nested or of huge integers, JSON of any shape: `collect
    --server` ends in one line and leaves nothing, each reply bounded by its deadline."""
    from raw_server import raw_server

    import traces.collecting.server

    monkeypatch.setattr(traces.collecting.server, "sleep", lambda s: None)
    corpus = pipe.root / "one.jsonl"
    corpus.write_text(json.dumps({"text": "To be, or not to be"}) + "\n")

    @settings(SETTINGS, max_examples=12)
    @given(answer=server_faults())
    def check(answer) -> None:
        work = workdir(pipe)
        with raw_server(answer) as (url, _):
            assert_refused(["collect", "--server", url, "--engine", "sglang", "--model",
                            pipe.model, "--corpus", corpus, "--out", work / "t",
                            "--no-progress", "--concurrency", 1, "--max-new-tokens", 2,
                            "--request-timeout", 0.5], pipe, work)

    check()
