"""Properties of issue 44's classes 1, 3 and 7 (deliverable 8), run by hypothesis in one child
process under an address-space limit (tests/hostile_worker.py, as tests/test_hostile_properties
.py runs it): whatever the mutation, the command gives the unmutated result or one `error:`
line and exit 1; never a traceback, a crash of the child (an allocation past the limit), or
a run past TIME_BOUND.

- class 3, options: a random value for one numeric option of `solve` (and `traces split`):
  the table of option rules (traces/options.py) predicts the outcome: a value it refuses is
  one line naming the option; one it keeps runs (exit 0, or one line about something else);
  a spelling of the unmutated value ("00", " 1 , 2 ,") gives the unmutated plan;
- class 1, sizes: each file reader given a file of a random length (sparse, up to 2**40
  bytes) after a valid beginning;
- class 7, GGUF: a random layer index in a block tensor's name, and a random value in one
  split.* key of one part of a split model.

The suite runs CASES examples per property (derandomized); more with
PLACER_HOSTILE_CASES=200.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import tempfile
from pathlib import Path

import pytest
from gguf_files import write_moe_gguf
from hypothesis import given, settings
from hypothesis import strategies as st
from importer_files import write_config
from test_hostile_properties import SETTINGS, Worker, clean
from test_hostile_sizes import cases as size_cases
from test_hostile_sizes import sparse

from traces.errors import TraceError
from traces.formats.bounded import LINE_LIMITS
from traces.options import OVERRIDES, check_rules

CASES = int(os.environ.get("PLACER_HOSTILE_CASES", "6"))
FEW = settings(SETTINGS, max_examples=CASES)


@pytest.fixture(scope="module")
def worker():
    w = Worker()
    yield w
    w.close()


@pytest.fixture(scope="module")
def solve_base(worker, tmp_path_factory) -> tuple[Path, list[str], dict]:
    """A solve that succeeds (uniform placement from a config: no traces), and its plan."""
    root = tmp_path_factory.mktemp("solve")
    config = write_config(root / "model")
    args = ["solve", "--config", str(config), "--hardware", "1x-8gb-pcie3x4", "--solver",
            "uniform", "--offload", "0.5", "--concurrency", "1,2", "--weights", "1,1",
            "--seed", "0", "--time-limit", "60", "--out"]
    result = worker.run(*args, root / "base.json")
    assert result["code"] == 0, result
    return root, args, plan_of(root / "base.json")


def plan_of(path: Path) -> dict:
    plan = json.loads(path.read_text())
    plan["solver"].pop("seconds", None)
    return plan


def replace(args: list[str], flag: str, value: str) -> list[str]:
    out = list(args)
    out[out.index(flag) + 1] = value
    return out


NUMBERS = (st.integers(-2**70, 2**70) | st.floats(allow_nan=True, allow_infinity=True)
           | st.sampled_from([0, 1, -1, 2**31, 2**31 - 1, 2**63, 1e-300, 1e300]))
VALUES = (NUMBERS.map(str) | st.text(max_size=8)
          | st.lists(NUMBERS.map(str), min_size=0, max_size=4).map(",".join))
SOLVE_OPTIONS = ("--seed", "--time-limit", "--concurrency", "--weights", "--offload")
SPELLINGS = {"--seed": ["00", "+0"], "--concurrency": [" 1 , 2 ,", "01,02"],
             "--weights": ["1.0,1e0", " 1,1 "], "--offload": ["0.50", "5e-1"],
             "--time-limit": ["60.0", "6e1"]}


@FEW
@given(flag=st.sampled_from(SOLVE_OPTIONS), value=VALUES)
def test_solve_options_give_the_rules_verdict(worker, solve_base, flag: str,
                                              value: str) -> None:
    root, args, _ = solve_base
    name = flag.removeprefix("--").replace("-", "_")
    out = root / "m.json"
    out.unlink(missing_ok=True)
    result = worker.run(*replace(args, flag, value), out)
    clean(result, [flag, value])
    if result["code"] == 2:  # click could not parse it as the option's type: named too
        assert flag in result["stderr"] and not out.exists(), result
        return
    number = value
    if name in ("seed", "time_limit", "offload"):  # what the CLI passed, where Python agrees
        try:
            number = int(value) if name == "seed" else float(value)
        except ValueError:
            return
    try:
        check_rules({name: number, **({"concurrency": "1,2"} if name == "weights" else {}),
                     **({"weights": "1,1"} if name == "concurrency" else {})}, "solve")
    except TraceError:
        assert result["code"] == 1 and flag in result["stderr"], (value, result)
        assert not out.exists()


@FEW
@given(flag=st.sampled_from(sorted(SPELLINGS)), data=st.data())
def test_spellings_of_the_same_values_give_the_unmutated_plan(worker, solve_base, flag: str,
                                                              data) -> None:
    root, args, base = solve_base
    value = data.draw(st.sampled_from(SPELLINGS[flag]))
    out = root / "same.json"
    result = worker.run(*replace(args, flag, value), out)
    clean(result, [flag, value])
    assert result["code"] == 0, result
    assert plan_of(out) == base


@FEW
@given(value=VALUES, which=st.sampled_from(["--seed", "--fraction"]))
def test_traces_split_options(worker, value: str, which: str) -> None:
    """A random --seed or --fraction for `traces split`: refused in one line naming it when
    the table refuses it (a negative seed never reaches numpy), never a traceback."""
    with tempfile.TemporaryDirectory() as tmp:
        args = ["traces", "split", str(Path(tmp) / "nowhere"), "--out-a", str(Path(tmp) / "a"),
                "--out-b", str(Path(tmp) / "b"), which, value]
        result = worker.run(*args)
        clean(result, args)
        name = which.removeprefix("--")
        assert result["code"] in (1, 2), result  # the trace directory does not exist
        if result["code"] == 2:
            assert which in result["stderr"], result
            return
        try:
            number = int(value) if name == "seed" else float(value)
        except ValueError:
            return
        try:
            check_rules({name: number}, "split")
        except TraceError:
            assert which in result["stderr"], result
        assert not (Path(tmp) / "a").exists() and not (Path(tmp) / "b").exists()


def test_the_table_has_no_rule_that_a_flag_defeats() -> None:
    """A flag named like a ruled option is overridden away (collect --weights)."""
    assert OVERRIDES[("collect", "weights")] is None


@pytest.fixture(scope="module")
def readers(tmp_path_factory) -> list[tuple[list, Path, str, bytes]]:
    """Every reader's case (test_hostile_sizes.cases) with the first bytes of its file."""
    found = size_cases(tmp_path_factory.mktemp("readers"))
    return [(args, path, kind, head(path)) for args, path, kind in found]


def head(path: Path) -> bytes:
    """The first 64 bytes of `path` (its 8 GiB hole is never read)."""
    with path.open("rb") as f:
        return f.read(64)


@FEW
@given(size=st.integers(0, 2**40), which=st.integers(0, 12))
def test_every_reader_under_a_random_size(worker, readers, size: int, which: int) -> None:
    """Class 1: one reader's file given a random length (a hole after a valid start). The
    streamed kinds (corpora, JSONL) are bounded per line, not in length, and an import hashes
    its sources first (linear time, constant memory): they get at most a line past their
    bound."""
    args, path, kind, start = readers[which % len(readers)]
    if kind in LINE_LIMITS:
        size %= LINE_LIMITS[kind] + (64 << 20)
    sparse(path, start, max(size, len(start)))
    result = worker.run(*args)
    clean(result, args)


# Class 7.

def blk_gguf(path: Path, index: str) -> Path:
    import numpy as np
    from gguf import GGUFWriter

    writer = GGUFWriter(path, "qwen3moe")
    writer.add_block_count(2)
    writer.add_expert_count(4)
    writer.add_expert_used_count(2)
    for name in ("blk.0.ffn_gate_exps.weight", f"blk.{index}.ffn_up_exps.weight"):
        writer.add_tensor(name, np.zeros((4, 8, 32), np.float32))
    for step in (writer.write_header_to_file, writer.write_kv_data_to_file,
                 writer.write_tensors_to_file, writer.close):
        step()
    return path


@FEW
@given(index=st.text(st.characters(categories=["Nd", "No"]) | st.sampled_from("0+- x"),
                     min_size=1, max_size=4).filter(lambda s: "." not in s))
def test_random_layer_indices(worker, index: str) -> None:
    """A block tensor named with any index: read as llama.cpp would find it (the decimal it
    writes, within block_count) or one line; never a layer counted twice."""
    if len(f"blk.{index}.ffn_up_exps.weight".encode()) >= 64:
        return
    with tempfile.TemporaryDirectory() as tmp:
        path = blk_gguf(Path(tmp) / "m.gguf", index)
        result = worker.run("inspect", path)
        clean(result, [index])
        if result["code"] == 0:
            assert index in ("0", "1"), index


@pytest.fixture(scope="module")
def split_parts(tmp_path_factory) -> list[Path]:
    root = tmp_path_factory.mktemp("split")
    write_moe_gguf(root / "m.gguf", split_max_tensors=4)
    return sorted(root.iterdir())


@FEW
@given(part=st.integers(0, 3), key=st.sampled_from(["split.no", "split.count",
                                                     "split.tensors.count"]),
       value=st.integers(0, 2**16 - 1))
def test_tampered_split_parts(worker, split_parts: list[Path], part: int, key: str,
                              value: int) -> None:
    """One split.* value of one part set at random: the model reads whole (the value was
    unchanged) or is refused in one line."""
    with tempfile.TemporaryDirectory() as tmp:
        parts = [Path(shutil.copy(p, tmp)) for p in split_parts]
        raw = bytearray(parts[part].read_bytes())
        kind, size = (2, 2) if key != "split.tensors.count" else (5, 4)  # UINT16 / INT32
        name = struct.pack("<Q", len(key)) + key.encode() + struct.pack("<I", kind)
        at = raw.index(name) + len(name)
        before = raw[at:at + size]
        raw[at:at + size] = value.to_bytes(size, "little")
        parts[part].write_bytes(bytes(raw))
        result = worker.run("inspect", parts[0], "--json")
        clean(result, [part, key, value])
        if bytes(before) != bytes(raw[at:at + size]):
            assert result["code"] == 1, (part, key, value, result["stdout"][:200])
