"""What `placer export llamacpp` prints besides the arguments of a plan's layer-offload
baseline: its cold layers and the tensors they move, each device's layers, warnings; and for
a llama.cpp plan's command, the option's predicted decode, marked where it rests on
ESTIMATED spec figures."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

from placer.plan.estimates import estimated_json
from placer.report.marks import MARK, spec_estimates, step_text

if TYPE_CHECKING:
    from placer.exporters.llamacpp import LlamaCppOffload
    from placer.plan.placement import Plan


def print_offload(plan: Plan, offload: LlamaCppOffload) -> None:
    """The layer-offload baseline at the plan's budget: its cold layers, the arguments, the
    GGUF tensors they move, the equivalent --n-cpu-moe, each device's layers, warnings."""
    typer.echo(f"# layer offload at this plan's budget: {len(offload.cold_layers)} of "
               f"{len(plan.moe_layers)} MoE layers cold (decoder layers "
               f"{offload.cold_layers or 'none'})")
    if offload.arg_list():
        typer.echo(offload.args())
    if offload.cold_layers:
        names = [t.replace("{layer}", "N") for t in offload.expert_tensors()]
        if not names:
            typer.echo("# GGUF tensors to CPU: blk.N.ffn_{gate,up,down}_exps of the cold layers "
                       "N (names of this architecture not known to placer)")
        else:
            typer.echo(f"# GGUF tensors to CPU ({offload.gguf_arch}), N in the cold layers: "
                       f"{', '.join(names)}")
    if offload.n_cpu_moe and not offload.all_cold:
        typer.echo(f"# equivalent: --n-cpu-moe {offload.n_cpu_moe}")
    for name, layers in offload.devices:
        typer.echo(f"# {name}: experts of decoder layers {layers or 'none'}")
    for warning in offload.warnings:
        typer.echo(f"# warning: {warning}")


def predicted_comments(plan: Plan, option: str) -> list[str]:
    """`option`'s predicted decode per traffic and concurrency (the ratio to -ncmoe first:
    an estimated base step moves it far less than the tok/s), as comment lines; where the
    spec's figures are estimated, the tok/s marked, its step range and the probes."""
    estimated = estimated_json(plan.hardware)
    lines = []
    for r in plan.predicted:
        fig = r["options"].get(option)
        if fig is None:  # a tuner option the table left out
            continue
        step = step_text(fig, fmt="{:.1f}")
        lines.append(f"# predicted decode {r['profile']} B={r['concurrency']}: stall "
                     f"{fig['ratio_to_ncmoe']:.3f}x -ncmoe's, {fig['tokens_per_s']:.2f} tok/s"
                     + (f" {MARK}" if estimated else "") + (f" ({step})" if step else ""))
    return lines + [f"# {MARK}: {e}" for e in spec_estimates(estimated)]
