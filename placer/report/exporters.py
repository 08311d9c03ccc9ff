"""What `placer export llamacpp` prints besides the arguments: the layer-offload baseline's
cold layers and tensors, or an --engine llamacpp plan's choice, build and cards."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:
    from placer.exporters.engine_command import ServerLine
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


def print_engine_command(plan: Plan, found: ServerLine, option: str | None) -> None:
    """An --engine llamacpp plan's llama-server line, after comments: the choice (or the
    option asked), the build, each card's layers."""
    engine, chosen = plan.engine, found.chosen
    what = (engine["choice"] if option is None else f"option {chosen['name']!r}")
    typer.echo(f"# {what}: experts of decoder layers {chosen['host_layers']} in host memory, "
               f"cache {chosen['moe_cache_mib']} MiB ({chosen['slots'] or 'no'} slots per "
               "group)")
    typer.echo(f"# predicted for {found.build.label}")
    if engine.get("tensor_split"):
        host = set(chosen["host_layers"])
        for c in range(len(engine["tensor_split"])):
            mine = [x for x, d in zip(plan.moe_layers, engine["devices"], strict=True) if d == c]
            typer.echo(f"# card {c} (-ts {engine['tensor_split'][c]:g}): MoE layers {mine}, "
                       f"host {[x for x in mine if x in host]}")
    typer.echo(found.line)
