"""No command writes over, into, or around what it reads (issue 53, item 2): every output
option of every command that writes is walked against every input of that command. Each
case, an output equal to an input, inside an input directory, or a directory holding an
input, is refused by the one rule (placer.files.check_apart, applied by check_outputs) in
one line naming the option and the input, exit 1, and nothing is written or changed.

Before the rule covered every input, `export llamacpp plan.json --model tiny.gguf --out
tiny.gguf` replaced the GGUF with the 105-byte command line (and without --model, the plan's
own GGUF), `solve --traces T --out T/x.json` and `evaluate --traces T --plot T/e.png` wrote
inside the trace directory they read, all with exit 0."""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from cli_errors import assert_one_line_error
from llamacpp_tiny import two_card_plan

from placer.errors import PlacerError
from placer.files import check_outputs

FILE, DIRECTORY, CHECKPOINT = "file", "dir", "checkpoint"


@dataclass(frozen=True)
class Command:
    """A command that writes: its inputs (name -> (kind, file name)), its output options
    (option -> the suffix it requires, "" for any), and its argument list given the inputs'
    paths and one output option's path."""

    inputs: dict[str, tuple[str, str]]
    outputs: dict[str, str]
    args: Callable[[dict[str, Path], str, Path], list]


COMMANDS = {
    "solve": Command(
        {"model": (FILE, "m.gguf"), "spec": (FILE, "box.toml"), "traces": (DIRECTORY, "T")},
        {"--out": ".json"},
        lambda i, o, p: ["solve", "--model", i["model"], "--hardware", i["spec"], "--traces",
                         i["traces"], o, p]),
    "evaluate": Command(
        {"plan": (FILE, "plan.json"), "traces": (DIRECTORY, "T")},
        {"--out": ".json", "--plot": ".png"},
        lambda i, o, p: ["evaluate", i["plan"], "--traces", i["traces"], o, p]),
    "evaluate --flags": Command(
        {"model": (FILE, "m.gguf"), "spec": (FILE, "box.toml"), "traces": (DIRECTORY, "T")},
        {"--out": ".json"},
        lambda i, o, p: ["evaluate", "--flags", "-ngl 99", "--model", i["model"], "--hardware",
                         i["spec"], "--traces", i["traces"], o, p]),
    "emit": Command(
        {"plan": (FILE, "plan.json"), "model": (CHECKPOINT, "ckpt")}, {"--out": ""},
        lambda i, o, p: ["emit", "--plan", i["plan"], "--model", i["model"], o, p]),
    "plan": Command(
        {"model": (CHECKPOINT, "ckpt"), "corpus": (FILE, "c.jsonl"), "spec": (FILE, "box.toml")},
        {"--out": ""},
        lambda i, o, p: ["plan", "--model", i["model"], "--corpus", i["corpus"], "--hardware",
                         i["spec"], o, p]),
    "collect": Command(
        {"model": (CHECKPOINT, "ckpt"), "corpus": (FILE, "c.jsonl")}, {"--out": ""},
        lambda i, o, p: ["collect", "--model", i["model"], "--corpus", i["corpus"], o, p]),
    "collect --gguf": Command(
        {"gguf": (FILE, "m.gguf"), "corpus": (FILE, "c.jsonl")}, {"--out": ""},
        lambda i, o, p: ["collect", "--gguf", i["gguf"], "--corpus", i["corpus"], o, p]),
    "export sglang": Command(
        {"plan": (FILE, "plan.json")}, {"--out": ""},
        lambda i, o, p: ["export", "sglang", i["plan"], o, p]),
    "export trtllm": Command(
        {"plan": (FILE, "plan.json")}, {"--out": ""},
        lambda i, o, p: ["export", "trtllm", i["plan"], o, p]),
    "export ktransformers": Command(
        {"plan": (FILE, "plan.json"), "config": (FILE, "config.json")}, {"--out": ""},
        lambda i, o, p: ["export", "ktransformers", i["plan"], "--config", i["config"], o, p]),
    "hardware new": Command(
        {"model": (CHECKPOINT, "ckpt")}, {"--out": ".toml"},
        lambda i, o, p: ["hardware", "new", "--card", "RTX 3060", "--pcie", "3.0x16", "--ram",
                         "ddr4-3200x2", "--model", i["model"], o, p]),
    # --out may be --hardware itself: the documented in-place update (docs/cli.md), below
    "probe --host": Command(
        {"model": (FILE, "m.gguf"), "spec": (FILE, "box.toml")}, {"--out": ".toml"},
        lambda i, o, p: ["probe", "--host", "--model", i["model"], "--hardware", i["spec"],
                         o, p]),
    "probe --step": Command(
        {"model": (CHECKPOINT, "ckpt"), "spec": (FILE, "box.toml")}, {"--out": ".toml"},
        lambda i, o, p: ["probe", "--step", "--model", i["model"], "--hardware", i["spec"],
                         o, p]),
    "bench": Command(
        {"placed": (DIRECTORY, "placed"), "model": (CHECKPOINT, "ckpt"),
         "prompts": (FILE, "p.jsonl")},
        {"--spec-out": ".toml", "--plot": ".png"},
        lambda i, o, p: ["bench", i["placed"], "--model", i["model"], "--prompts",
                         i["prompts"], o, p]),
    "traces stats": Command(
        {"traces": (DIRECTORY, "T")}, {"--plot": ".png"},
        lambda i, o, p: ["traces", "stats", i["traces"], o, p]),
    "traces split": Command(
        {"traces": (DIRECTORY, "T")}, {"--out-a": "", "--out-b": ""},
        lambda i, o, p: ["traces", "split", i["traces"], o, p,
                         "--out-b" if o == "--out-a" else "--out-a",
                         i["traces"].parent.parent / "other-side"]),
    "traces import": Command(
        {"source": (FILE, "m.npy"), "model": (CHECKPOINT, "ckpt")}, {"--out": ""},
        lambda i, o, p: ["traces", "import", i["source"], "--format", "counts", "--model",
                         i["model"], o, p]),
}
UPDATED_IN_PLACE = {("probe --host", "--out", "spec"), ("probe --step", "--out", "spec")}


def make_input(holder: Path, kind: str, name: str) -> Path:
    """One input in its own folder `holder` (so that the folder holds it and nothing else)."""
    holder.mkdir(parents=True)
    path = holder / name
    if kind == FILE and name.endswith(".npy"):
        np.save(path, np.ones((2, 4), np.int64))
    elif kind == FILE:
        path.write_bytes(b"input bytes of " + name.encode())
    else:
        path.mkdir()
        (path / "x.parquet").write_bytes(b"rows")
        if kind == CHECKPOINT:  # placer.files.is_checkpoint
            (path / "config.json").write_text("{}")
            (path / "model.safetensors").write_bytes(b"weights")
    return path


def cases() -> list:
    """(command, option, input, how) for every output option against every input: equal to
    it, inside it (a directory), holding it."""
    found = []
    for name, cmd in COMMANDS.items():
        for option, suffix in cmd.outputs.items():
            for role, (kind, file_name) in cmd.inputs.items():
                hows = ["holding"]
                if kind != FILE:
                    hows.append("inside")
                if (name, option, role) not in UPDATED_IN_PLACE and (
                        not suffix or file_name.endswith(suffix)):
                    hows.append("equal")
                found += [pytest.param(name, option, role, how, id=f"{name} {option} {how} "
                                       f"{role}") for how in hows]
    return found


def snapshot(root: Path) -> dict[str, str]:
    """Every path under `root` and its bytes' digest (directories: "dir")."""
    return {str(p.relative_to(root)): "dir" if p.is_dir() else
            hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*"))}


@pytest.mark.parametrize(("name", "option", "role", "how"), cases())
def test_no_output_is_on_inside_or_around_an_input(cli, tmp_path: Path, name: str,
                                                   option: str, role: str, how: str) -> None:
    cmd = COMMANDS[name]
    suffix = cmd.outputs[option]
    paths = {r: make_input(tmp_path / f"h-{r}{suffix}", kind, file_name)
             for r, (kind, file_name) in cmd.inputs.items()}
    given = paths[role]
    out = {"equal": given, "inside": given / f"x{suffix}", "holding": given.parent}[how]
    before = snapshot(tmp_path)
    result = cli(*cmd.args(paths, option, out), ok=False)
    assert_one_line_error(result, f"{option} {out} ", str(given))
    assert any(said in result.output for said in (" is inside ", " holds ", " is ")), \
        result.output
    assert snapshot(tmp_path) == before


@pytest.fixture(scope="module")
def llamacpp_plan(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    plan, model, _ = two_card_plan(tmp_path_factory.mktemp("llamacpp"))
    return plan, model


@pytest.mark.parametrize("with_model", [True, False])
def test_export_llamacpp_never_writes_over_the_gguf(cli, tmp_path: Path, llamacpp_plan,
                                                   with_model: bool) -> None:
    """The issue's case: --out onto --model's GGUF, or (without --model) the plan's own."""
    plan_src, plan_gguf = llamacpp_plan
    plan = tmp_path / "plan.json"
    shutil.copy(plan_src, plan)
    model = tmp_path / "m" / "copy.gguf"
    model.parent.mkdir()
    shutil.copy(plan_gguf, model)
    target, role = (model, "--model") if with_model else (plan_gguf, "the plan's GGUF")
    extra = ["--model", model] if with_model else []
    before = snapshot(tmp_path), hashlib.sha256(plan_gguf.read_bytes()).hexdigest()
    for out in (target, target.parent):
        result = cli("export", "llamacpp", plan, *extra, "--out", out, ok=False)
        assert_one_line_error(result, f"--out {out} ", f"{role} {target}"
                              if out == target.parent else f"{role} ({target})")
    assert (snapshot(tmp_path), hashlib.sha256(plan_gguf.read_bytes()).hexdigest()) == before
    written = tmp_path / "serve.sh"
    cli("export", "llamacpp", plan, *extra, "--out", written)
    assert written.read_text().startswith("llama-server ")


def test_the_spec_probe_updates_may_be_its_own_output(tmp_path: Path) -> None:
    """`probe --hardware box.toml --out box.toml` is documented (docs/cli.md): the spec it
    read is replaced whole with the measured table in place. Only that input may be the
    output, and nothing may hold it or lie inside anything else."""
    spec, model = tmp_path / "box.toml", tmp_path / "m.gguf"
    spec.write_text("x")
    model.write_text("y")
    inputs = [("the checkpoint", model), ("--hardware", spec)]
    check_outputs([("--out", spec)], inputs, updates=spec)
    with pytest.raises(PlacerError, match=r"^--out .*m.gguf is the checkpoint \("):
        check_outputs([("--out", model)], inputs, updates=spec)
    with pytest.raises(PlacerError, match="^--out .* is the hardware spec"):
        check_outputs([("--out", spec)], [("the hardware spec", spec)])
