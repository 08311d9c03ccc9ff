"""`placer bench --engine llamacpp --spec-out box.toml`: the spec's figures fitted to what
llama.cpp measured on this box, and how well they then predict the options not fitted.

The predicted time of a decode token under an option is, with the plan's spec (predict.py
`cost_terms`; solvers/llamacpp/cost.py), linear in four figures:

    step = base step + fixed + sync_s x (layers synced per step)
           + expert_s x (experts the CPU computes per step) + latency_s x (upload copies)

- base step (`[decode] base_step_ms` at 1): everything not spent on host experts;
- sync_s (`[host] sync_us`): a layer's hand-off, to the CPU (a host layer) or the read-back
  of the selection a cached fetch waits on: the per-layer sync of a cached fetch;
- expert_s (`[[host.expert]]`, the model's expert at one token): the CPU's time per expert;
- latency_s (`[card] latency_us`): each upload copy llama.cpp makes into the cache.

With the per-option counts from the recorded routing and each option's measured time per
token, the figures are a non-negative least-squares fit on at most 3 options (relative
error), fitted in the order base, sync, expert, latency: with n options the first n
figures that the options tell apart are fitted, the others kept as the spec says. Without
--calibrate-on the options are picked (`pick`) so that they tell apart as many figures as
any 3 of the options run can, the earliest in that order first: two cached options that
differ only in their uploads tell the latency apart but leave the CPU's expert time at the
spec's figure, which a held-out option computing its experts on the CPU then pays (a
software device's CPU backend, contended, ran its host layers 50% slower than the spec's
figure said). The
upload bandwidth (`h2d_bandwidth`) is kept: it multiplies the misses' bytes, which at a
bench's size are not told apart from the per-copy latency (the report says so).
The other options are then predicted with the fitted figures, and their error against
their measured tok/s is reported. The output target is checked before anything runs.
"""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path

import numpy as np
from scipy.optimize import nnls

from placer.errors import PlacerError
from placer.files import check_apart, write_text_atomic
from placer.hardware.timing import ExpertTiming
from placer.plan.llamacpp import plan_machine
from placer.plan.placement import Plan
from placer.serve.llamacpp.bench import BenchOption
from placer.serve.llamacpp.device import Device, other_device
from placer.serve.llamacpp.predict import TERMS

MAX_CALIBRATION = 3
FIGURES = ("base_s", *TERMS)


def check_spec_out(out: Path, inputs: list[tuple[str, Path]]) -> None:
    """One line for an output the run could not write, before anything is measured."""
    if out.suffix != ".toml":
        raise PlacerError(f"--spec-out writes a TOML spec: give a .toml path, not {out}")
    check_apart(out, inputs, what="--spec-out")
    parent = out.resolve().parent
    if not parent.is_dir():
        raise PlacerError(f"--spec-out: the folder {parent} does not exist")
    if out.exists() and not out.is_file():
        raise PlacerError(f"--spec-out: {out} exists and is not a file")


def calibration_options(options: list[BenchOption], given: str | None) -> tuple[str, ...] | None:
    """The names of the options to fit on (None: chosen after measuring, `pick`)."""
    if given is None:
        return None
    names = tuple(n.strip() for n in given.split(",") if n.strip())
    known = {o.name for o in options}
    if not 1 <= len(names) <= MAX_CALIBRATION or any(n not in known for n in names):
        raise PlacerError(f"--calibrate-on: 1 to {MAX_CALIBRATION} of the options run "
                          f"({', '.join(sorted(known))}), got {given!r}")
    return names


def design(row: dict) -> np.ndarray:
    """[1 + len(TERMS)] what each figure multiplies in the option's step time."""
    terms = row["model_terms"]
    return np.array([1.0, *(terms[t] for t in TERMS)])


def free_figures(x: np.ndarray) -> list[int]:
    """The columns of design rows `x` a fit on them tells apart, taken in order (base, sync,
    expert, latency): each one kept where it raises the rank, while the rank stays below
    the number of rows."""
    free: list[int] = []
    for j in range(x.shape[1]):
        trial = [*free, j]
        if len(trial) <= len(x) and np.linalg.matrix_rank(x[:, trial]) == len(trial):
            free = trial
    return free


def pick(rows: list[dict], count: int = MAX_CALIBRATION) -> tuple[str, ...]:
    """`count` options, the first among them, that tell apart the most figures, the earliest
    first (`free_figures`), and among those the ones whose design rows (each figure scaled
    to its largest term) span the largest volume over the figures they fit."""
    x = np.array([design(r) for r in rows])
    scaled = x / np.maximum(np.abs(x).max(axis=0), 1e-30)
    best: tuple | None = None
    for rest in itertools.combinations(range(1, len(rows)), min(count, len(rows)) - 1):
        taken = [0, *rest]
        free = free_figures(x[taken])
        volume = float(np.prod(np.linalg.svd(scaled[np.ix_(taken, free)], compute_uv=False)))
        key = (len(free), [-j for j in free], volume)
        if best is None or key > best[0]:
            best = (key, taken)
    assert best is not None
    return tuple(rows[i]["option"] for i in best[1])


def fit(rows: list[dict], names: tuple[str, ...], spec_figures: np.ndarray) -> np.ndarray:
    """[4] base, sync, expert, latency seconds fitted on `names` (module docstring)."""
    chosen = [r for r in rows if r["option"] in names]
    x = np.array([design(r) for r in chosen])
    y = np.array([1.0 / r["measured_tokens_per_s"] - r["model_terms"]["fixed_s"]
                  for r in chosen])
    free = free_figures(x)
    figures = spec_figures.copy()
    kept = [j for j in range(x.shape[1]) if j not in free]
    target = (y - x[:, kept] @ figures[kept]) / y
    solution, _ = nnls(x[:, free] / y[:, None], target)
    figures[free] = solution
    return figures


def calibrate_spec(plan: Plan, report: dict, names: tuple[str, ...] | None, out: Path,
                   apart: list[tuple[str, Path]], device: Device | None = None) -> dict:
    """Fit, write the spec at `out` (its comment naming the device timed), and say how the
    other options are predicted."""
    rows = report["options"]
    names = names or pick(rows)
    spec = plan.hardware
    host = spec.host
    machine = plan_machine(plan)
    largest = np.unravel_index(np.argmax(machine.expert_bytes), machine.expert_bytes.shape)
    expert_s = float(machine.host.expert_seconds(machine.expert_bytes[largest],
                                                 machine.expert_flops[largest], 1.0))
    spec_figures = np.array([spec.base_step_s(1), host.sync_s, expert_s,
                             spec.cards[0].latency_s])
    figures = fit(rows, names, spec_figures)
    held = []
    for r in rows:
        predicted = 1.0 / (r["model_terms"]["fixed_s"] + design(r) @ figures)
        held.append({"option": r["option"], "fitted_on": r["option"] in names,
                     "measured_tokens_per_s": r["measured_tokens_per_s"],
                     "measured_tokens_per_s_ci95": r["measured_tokens_per_s_ci95"],
                     "calibrated_tokens_per_s": predicted,
                     "error": predicted / r["measured_tokens_per_s"] - 1.0})
    others = [abs(h["error"]) for h in held if not h["fitted_on"]]
    write_text_atomic(spec_text(plan, figures, device), out, apart, what="--spec-out")
    return {"options": list(names), "spec_out": str(out),
            "fitted": {"base_step_ms": figures[0] * 1e3, "sync_us": figures[1] * 1e6,
                       "expert_us": figures[2] * 1e6, "latency_us": figures[3] * 1e6},
            "kept": "h2d_bandwidth (the misses' bytes are not told apart from the per-copy "
                    "latency at this size)",
            "rows": held, "max_error_not_fitted": max(others) if others else None}


def spec_text(plan: Plan, figures: np.ndarray, device: Device | None = None) -> str:
    """The plan's spec with the fitted figures: the base step (every batch point scaled by
    the fitted step over the spec's at 1), sync, one `[[host.expert]]` of the model's expert
    at 1 token, each card's latency."""
    from placer.hardware.spec_toml import spec_toml

    spec = plan.hardware
    scale = figures[0] / spec.base_step_s(1)
    steps = tuple((b, float(f"{ms * scale:.4g}")) for b, ms in spec.base_step_ms)
    hidden = int(plan.model["hidden_size"])
    eb = float(plan.matrix("bytes").max())
    inter = max(1, round(eb / (3 * hidden * 4)))
    curve = ExpertTiming(hidden, inter, "float32", (1,),
                         (max(figures[2], 1e-9) * 3 * hidden * inter * 4 / eb,))
    host = dataclasses.replace(spec.host, sync_s=float(figures[1]), expert=(curve,))
    cards = tuple(dataclasses.replace(c, latency_s=float(figures[3])) for c in spec.cards)
    calibrated = dataclasses.replace(spec, base_step_ms=steps, host=host, cards=cards)
    if other_device(plan, device) is None:  # timed on another device, they stay estimates
        calibrated = calibrated.measured("base_step_ms", "host.sync_us", "card.latency_us")
    where = device.label if device is not None else "this box"
    return spec_toml(calibrated, "calibrated by placer bench --engine llamacpp (llama.cpp "
                                 f"measured on {where})")
