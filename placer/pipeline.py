"""`placer plan`: from a checkpoint (or a GGUF) and a corpus to a plan, its held-out
evaluation and the command that runs it, in one go.

The stages are the very functions the single commands call: collect (`placer collect`),
split (`placer traces split`), solve (`placer solve` through the one engine dispatch,
placer.plan.engine), evaluate (`placer evaluate` on the held-out side) and export (the
command to run: `placer emit` + `placer serve`, or `placer export llamacpp`'s llama-server
line, naming the user's GGUF). Every option of every stage is checked, by the function the
single command checks it with, before the first stage runs: a refusal leaves `--out` as it
was. Each stage's output is kept under `--out`:

    OUT/traces/       collected routing, one trace file per corpus
    OUT/split/calib/  the calibration share of the sequences (what solve learns from)
    OUT/split/heldout/ the rest (what evaluate replays)
    OUT/plan.json     the plan
    OUT/evaluate.json the held-out report, and OUT/evaluate.txt as printed
    OUT/run.sh        the command to run the plan
    OUT/stages.json   what produced each output: its key and the inputs and options in it

A stage's key is a digest of its inputs (the model's files by name, size and mtime, the
corpora's bytes, the spec as parsed), its options and the key of the stage it reads. A rerun
skips every stage whose output is there and whose key is unchanged, and redoes the rest:
change `--offload` and collect and split are skipped, solve, evaluate and export rerun.
Directory outputs are filled beside their name and renamed in when complete
(`placer.files.directory_output`), files written atomically, and `stages.json` records a
stage only after its output is in place: an interrupted run resumes at the stage it was in.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shlex
import sys
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from placer.checkpoint.inventory import Inventory, read_inventory
from placer.errors import PlacerError
from placer.files import (
    check_outputs,
    directory_output,
    dumps_json,
    write_json_atomic,
    write_text_atomic,
)
from placer.hardware.context import with_context
from placer.hardware.spec import HardwareSpec, load_spec
from placer.plan.engine import Target, check_solve, is_gguf, plan_target, target_of
from placer.plan.options import SolveOptions
from placer.progress import StageSpinner
from traces.collecting.corpora import Corpus, open_corpus
from traces.collecting.runs import CollectOptions
from traces.formats.bounded import read_bounded
from traces.formats.jsontext import loads_json

if TYPE_CHECKING:
    from placer.plan.placement import Plan

STAGES = ("collect", "split", "solve", "evaluate", "export")
RECORD = "stages.json"
CHUNK = 1 << 20


@dataclass(frozen=True)
class PlanRequest:
    """What `placer plan` was asked: the model, corpora, spec and every stage's options."""

    model: Path
    corpora: tuple[Path, ...]
    hardware: str
    out: Path
    engine: str | None          # None: llamacpp for a GGUF, else placer (placer.plan.engine)
    collect: CollectOptions
    fraction: float = 0.5
    seed: int = 0
    solve: SolveOptions = field(default_factory=SolveOptions)
    oracle_time_limit: float = 10.0
    text_field: str = "text"
    llamacpp_version: str | None = None
    verbose: bool = False       # the full tables of plan and evaluate before the summary
    ctx: int | None = None      # --ctx / --kv-type: reserved_kv from the model's KV cache
    kv_type: str | None = None  # (placer.hardware.context.with_context)


@dataclass
class Stage:
    """One stage as run: its key, whether it was skipped, its one-line summary."""

    name: str
    key: str
    skipped: bool
    summary: str


def run_plan(req: PlanRequest, *, progress: bool, say: Callable[[str], None]) -> dict:
    """Run (or resume) every stage of `req` (module docstring); `say` gets one line per stage
    and the evaluation table. Returns {stage: Stage}, the report and the command to run."""
    check_paths(req)
    inv = read_inventory(req.model)
    spec, ctx_note = with_context(load_spec(req.hardware), inv.config, req.ctx, req.kv_type)
    if ctx_note:
        say(ctx_note)
    target, corpora = check_request(req, inv, spec)
    out = Path(req.out)
    record = read_record(out)
    stages: dict[str, Stage] = {}

    def stage(name: str, inputs: dict, outputs: tuple[Path, ...], work: Callable[[], str]
              ) -> None:
        index = STAGES.index(name) + 1
        key = digest({"stage": name, **inputs})
        done = record.get(name)
        if done is not None and done["key"] == key:
            changed = changed_output(done, outputs)
            if changed is None:
                stages[name] = Stage(name, key, True, str(outputs[0]))
                say(f"[{index}/{len(STAGES)}] {name}: skipped ({outputs[0]} is complete and "
                    "its inputs and options are unchanged)")
                return
            say(f"[{index}/{len(STAGES)}] {name}: {changed} since placer plan wrote it: "
                "running it again")
        theirs = [p for p in outputs if os.path.lexists(p)] if name not in record else []
        if theirs:
            raise PlacerError(f"{theirs[0]} exists and placer plan did not write it (no "
                              f"{name} in {out / RECORD}): give another --out")
        say(f"[{index}/{len(STAGES)}] {name} ...")
        summary = work()
        record[name] = {"key": key, "outputs": [str(p) for p in outputs], "inputs": inputs,
                        "files": fingerprint(outputs)}
        write_json_atomic(record, out / RECORD)
        stages[name] = Stage(name, key, False, summary)
        say(f"[{index}/{len(STAGES)}] {name}: {summary}")

    made = [p for p in [out, *out.parents] if not os.path.lexists(p)]
    out.mkdir(parents=True, exist_ok=True)
    try:
        return run_stages(req, inv, spec, target, corpora, out, stage, stages, progress, say)
    except BaseException:
        if not record:  # nothing done here: leave no folder behind either
            for path in made:
                with contextlib.suppress(OSError):
                    path.rmdir()
        raise


def run_stages(req: PlanRequest, inv: Inventory, spec: HardwareSpec, target: Target,
               corpora: list[Corpus], out: Path, stage: Callable, stages: dict[str, Stage],
               progress: bool, say: Callable[[str], None]) -> dict:
    """The five stages in order, through `stage` (run_plan's: skip or run and record)."""
    collected, split = out / "traces", out / "split"
    calib, heldout = split / "calib", split / "heldout"
    plan_path, report_path, run_path = out / "plan.json", out / "evaluate.json", out / "run.sh"

    collect_inputs = {"model": model_files(req.model),
                      "corpora": [[str(c.path), c.sha256] for c in corpora],
                      "options": {k: v for k, v in asdict(req.collect).items()
                                  if k not in ("progress", "device", "tokenizer")},
                      "text_field": req.text_field,
                      **({"tokenizer": model_files(req.collect.tokenizer)}
                         if req.collect.tokenizer is not None else {})}
    stage("collect", collect_inputs, (collected,),
          lambda: run_collect(req, inv, corpora, collected, progress))
    split_inputs = {"traces": stages["collect"].key, "fraction": req.fraction, "seed": req.seed}
    stage("split", split_inputs, (calib, heldout), lambda: run_split(collected, split, req,
                                                                     progress))
    solve_inputs = {"traces": stages["split"].key, "spec": spec.to_json(),
                    "engine": target.engine, "options": asdict(req.solve),
                    "build": None if target.build is None else target.build.to_json(),
                    "gguf": None if target.gguf is None else str(target.gguf)}
    stage("solve", solve_inputs, (plan_path, plan_path.with_suffix(".txt")),
          lambda: run_solve(req, inv, spec, target, calib, plan_path, progress))
    eval_inputs = {"plan": stages["solve"].key, "heldout": stages["split"].key,
                   "oracle_time_limit": req.oracle_time_limit}
    stage("evaluate", eval_inputs, (report_path, report_path.with_suffix(".txt")),
          lambda: run_evaluate(plan_path, heldout, report_path, req, progress))
    from placer.plan.estimates import estimated_json
    from placer.plan.placement import read_plan
    from placer.report.figures import shell_lines
    from placer.report.plan import plan_summary

    plan = read_plan(plan_path)  # read once, as evaluate and the user read it
    command = run_command(req, plan, plan_path)
    stage("export", {"plan": stages["solve"].key, "command": command}, (run_path,),
          lambda: write_command(command, run_path))

    followups = follow_ups(req, plan, plan_path, heldout)
    report = read_json(report_path)
    if req.verbose:
        say(read_text(plan_path.with_suffix(".txt")).rstrip("\n"))
        say(read_text(out / "evaluate.txt").rstrip("\n"))
    say("\n".join(plan_summary(plan, report, command, out)))
    say("\n".join(["then, as you need them:",
                   *(line for f in followups for line in shell_lines(f))]))
    return {"stages": stages, "report": report, "estimated": estimated_json(plan.hardware),
            "command": command, "followups": followups, "out": str(out)}


def check_paths(req: PlanRequest) -> None:
    """Refuse, before reading anything, what no stage would take: no corpus, an --out on or
    inside an input."""
    if not req.corpora:
        raise PlacerError("give at least one --corpus to collect routing on")
    tokenizer = req.collect.tokenizer
    if tokenizer is not None and not Path(tokenizer).is_dir():
        raise PlacerError(f"--tokenizer {tokenizer}: expected a directory holding a "
                          "tokenizer (a checkpoint's tokenizer.json, tokenizer_config.json)")
    spec_file = Path(req.hardware) if os.path.isfile(req.hardware) else None
    check_outputs([("--out", req.out)], [("the checkpoint", req.model),
                                         ("the tokenizer", req.collect.tokenizer),
                                         ("the hardware spec", spec_file),
                                         *(("the corpus", c) for c in req.corpora)],
                  directory=True)


def check_request(req: PlanRequest, inv: Inventory, spec: HardwareSpec
                  ) -> tuple[Target, list[Corpus]]:
    """Every option of every stage, checked by the function its single command checks it
    with, and every corpus read through (collect's validation, which also hashes it), before
    the first stage runs; the Target the plan is for and the corpora."""
    from placer.predict.evaluate import EvalOptions
    from placer.predict.evaluate import check_options as check_eval
    from traces.collecting.collect import check_options as check_collect
    from traces.options import check_rules

    if not 0 <= req.seed < 2**63:
        raise PlacerError(f"--seed: expected an integer in 0..2**63-1, got {req.seed}")
    target = target_of(req.engine, req.llamacpp_version, req.model)
    check_collect(req.collect)
    if not is_gguf(req.model):
        from placer.hardware.devices import check_device

        check_device(req.collect.device)
    check_rules({"fraction": req.fraction, "seed": req.seed}, "split", error=PlacerError)
    check_eval(EvalOptions(oracle_time_limit=req.oracle_time_limit))
    check_solve(inv, spec, req.solve, target, traces=1)
    return target, [open_corpus(p, text_field=req.text_field) for p in req.corpora]


def read_record(out: Path) -> dict:
    """What produced each output under `out` ({} where nothing was recorded yet), read as any
    input is: bounded, strict, every entry of the shape placer writes; anything else stops in
    one line (placer will not guess which outputs it wrote)."""
    path = out / RECORD
    try:
        record = loads_json(read_bounded(path, "plan", error=PlacerError), str(path),
                            PlacerError)
        bad = record_problem(record)
    except FileNotFoundError:
        return {}
    except PlacerError as exc:
        bad = str(exc).removeprefix(f"{path}: ")
    if bad:
        raise PlacerError(f"{path}: {bad}; it is placer plan's record of what it wrote: "
                          f"remove {out} (or give another --out) to start again")
    return record


def record_problem(record: object) -> str | None:
    """What is wrong with a stages.json (None: nothing)."""
    if not isinstance(record, dict):
        return "expected an object of stages"
    for name, entry in record.items():
        if name not in STAGES:
            return f"unknown stage {name[:40]!r}"
        if not (isinstance(entry, dict) and isinstance(entry.get("key"), str)
                and isinstance(entry.get("outputs"), list)
                and isinstance(entry.get("files"), list)):
            return f"{name}: expected key, outputs and files"
    return None


def fingerprint(outputs: tuple[Path, ...]) -> list:
    """What each output holds, cheaply: every file under it (a file, or a directory's files)
    by relative name, size and the SHA-256 of its first and last MiB; what is not a file or
    directory, by its kind. A stage output that was replaced, truncated or edited no longer
    matches, and its stage runs again."""
    rows = []
    for output in outputs:
        if output.is_dir():
            files = sorted(f for f in output.rglob("*") if f.is_file())
        else:
            files = [output] if output.is_file() else []
        if not files:
            rows.append([str(output), "missing" if not os.path.lexists(output) else "empty"])
        for f in files:
            rows.append([str(f), *ends_digest(f)])
    return rows


def ends_digest(path: Path) -> list:
    """[size, SHA-256 of the first and the last MiB] of a file."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        h.update(f.read(CHUNK))
        if size > 2 * CHUNK:
            f.seek(size - CHUNK)
        h.update(f.read(CHUNK))
    return [size, h.hexdigest()]


def changed_output(done: dict, outputs: tuple[Path, ...]) -> str | None:
    """Which of a recorded stage's outputs differs from what it wrote (None: none does)."""
    was = done["files"]
    for output in outputs:
        rows = fingerprint((output,))
        if [r for r in was if Path(r[0]) == output or output in Path(r[0]).parents] != rows:
            return f"{output} changed"
    return None


def read_text(path: Path) -> str:
    """A stage's text output, read as a user's file is: bounded, UTF-8."""
    raw = read_bounded(path, "plan", error=PlacerError)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PlacerError(f"{path}: not UTF-8 text (byte {exc.start})") from None


def read_json(path: Path) -> dict:
    """A stage's JSON output (the evaluation report), read as a user's file is."""
    report = loads_json(read_bounded(path, "plan", error=PlacerError), str(path), PlacerError)
    if not isinstance(report, dict) or not isinstance(report.get("results"), list):
        raise PlacerError(f"{path}: expected the evaluation report (an object with results)")
    return report


def check_replaceable(out: Path) -> None:
    """A directory output about to be written anew must be a directory (placer's own, the
    record says) or absent: placer removes no file it did not write."""
    if os.path.lexists(out) and (out.is_symlink() or not out.is_dir()):
        raise PlacerError(f"{out} is no longer the directory placer plan wrote there: move it "
                          "away (or give another --out) and run plan again")


def digest(obj: Any) -> str:
    return hashlib.sha256(dumps_json(obj, indent=None).encode()).hexdigest()


def model_files(model: Path) -> list:
    """The model's files (a GGUF file, or the checkpoint or tokenizer directory's) by name,
    size and modification time: a model rewritten in place changes its key."""
    paths = [model] if model.is_file() else sorted(p for p in model.iterdir() if p.is_file())
    return [[p.name, st.st_size, st.st_mtime_ns] for p in paths for st in [p.stat()]]


def run_collect(req: PlanRequest, inv: Inventory, corpora: list[Corpus], out: Path,
                progress: bool) -> str:
    """`placer collect` over every corpus into `out` (filled beside it, renamed in)."""
    from traces.collecting.collect import collect

    options = CollectOptions(**{**asdict(req.collect), "progress": progress})
    identity = inv.identity()
    check_replaceable(out)
    with directory_output(out, replace=True, what="the stage output") as temp:
        if is_gguf(req.model):
            from traces.llamacpp.collect import collect_gguf

            results = collect_gguf(req.model, corpora, temp, identity, options)
        else:
            results = collect(req.model, corpora, temp, identity, options)
    return ", ".join(f"{r.tag} {r.tokens} tokens, {r.sequences} sequences" for r in results)


def run_split(collected: Path, out: Path, req: PlanRequest, progress: bool) -> str:
    """`placer traces split` by sequence into out/calib (--fraction) and out/heldout (the
    rest), both filled beside `out` and renamed in together."""
    from traces.storing.split import split_traces

    check_replaceable(out)
    with StageSpinner("split:", None, enabled=progress) as spinner, \
            directory_output(out, replace=True, what="the stage output") as temp:
        spinner.show("by sequence")
        result = split_traces(collected, temp / "calib", temp / "heldout",
                              fraction=req.fraction, seed=req.seed)
    return (f"{result.sequences[0]} sequences ({result.tokens[0]} tokens) to calibrate on, "
            f"{result.sequences[1]} ({result.tokens[1]} tokens) held out")


def run_solve(req: PlanRequest, inv: Inventory, spec: HardwareSpec, target: Target,
              calib: Path, out: Path, progress: bool) -> str:
    """`placer solve` on the calibration traces, for `target`, to `out`, and its full tables
    beside it (plan.txt, from the plan as written: no wall-clock seconds)."""
    from placer.plan.engine import solve
    from placer.plan.placement import read_plan
    from placer.report.solve_summary import report_solve

    with printed_to_stderr():
        limit = req.solve.time_limit if req.solve.solver == "ilp" else None
        with StageSpinner("solve:", limit, enabled=progress) as spinner:
            plan = solve(inv, spec, [calib], req.solve, target, spinner.stage)
        write_json_atomic(plan.to_json(), out)
    report_solve(read_plan(out), out, quiet=True)
    return f"{out} ({len(plan.cards)} card{'s' if len(plan.cards) != 1 else ''})"


@contextlib.contextmanager
def printed_to_stderr() -> Iterator[None]:
    """Nothing a stage's library code prints reaches stdout but its summary."""
    with contextlib.redirect_stdout(sys.stderr):
        yield


def run_evaluate(plan_path: Path, heldout: Path, out: Path, req: PlanRequest,
                 progress: bool) -> str:
    """`placer evaluate` of the plan on the held-out traces: the report to `out` (JSON) and
    its full tables beside it (evaluate.txt)."""
    from placer.plan.placement import read_plan
    from placer.predict.evaluate import EvalOptions, evaluate
    from placer.report.evaluate import report_evaluate

    report = evaluate(read_plan(plan_path), [heldout],
                      EvalOptions(oracle_time_limit=req.oracle_time_limit), progress=progress)
    report_evaluate(report, out, quiet=True)
    verdicts = sorted({r["verdict"] for r in report["results"]})
    return f"{out} ({len(report['results'])} rows; against layer offload: {', '.join(verdicts)})"


def run_command(req: PlanRequest, plan: Plan, plan_path: Path) -> str:
    """The command that runs `plan` (written to `plan_path`): for placer's runtime the placed
    directory emitted and served; for llama.cpp the llama-server line on the user's GGUF."""
    if plan.engine is not None:
        from placer.exporters.llamacpp import server_command

        return server_command(plan, plan_target(plan).build, str(req.model))
    placed = req.out / "placed"
    q = shlex.quote
    return (f"placer emit --plan {q(str(plan_path))} --model {q(str(req.model))} --out "
            f"{q(str(placed))} && placer serve {q(str(placed))}")


def follow_ups(req: PlanRequest, plan: Plan, plan_path: Path, heldout: Path) -> list[str]:
    """The commands a user runs next on `plan`, each as it runs from where `placer plan` ran:
    the evaluation on the held-out traffic again (after editing the spec, say), and the
    llama-server line again (`export llamacpp`, whose --option picks another row) or the
    check of the placed directory once it is emitted."""
    q = shlex.quote
    lines = [f"placer evaluate {q(str(plan_path))} --traces {q(str(heldout))}"]
    if plan.engine is not None:
        lines.append(f"placer export llamacpp {q(str(plan_path))}")
    else:
        lines.append(f"placer verify {q(str(req.out / 'placed'))}")
    return lines


def write_command(command: str, out: Path) -> str:
    write_text_atomic(f"#!/bin/sh\n# written by placer plan\n{command}\n", out)
    return f"{out}"
