"""`placer export sglang|ktransformers|llamacpp`: a plan in serving engines' terms."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from placer.checkpoint.config import read_config
from placer.commands.common import command, print_json
from placer.exporters.ktransformers import write_kt_export
from placer.exporters.llamacpp import LlamaCppOffload, llamacpp_offload
from placer.exporters.output import check_out
from placer.exporters.sglang import write_sglang_location
from placer.files import write_text_atomic
from placer.plan.placement import read_plan

PlanArg = Annotated[Path, typer.Argument(help="plan.json or manifest.json (or its dir).")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")]


def register(app: typer.Typer) -> None:
    export_app = typer.Typer(help="Write a plan in serving engines' formats.",
                             no_args_is_help=True)
    app.add_typer(export_app, name="export")

    @command(export_app, "sglang")
    def sglang(
        plan: PlanArg,
        out: Annotated[Path, typer.Option(help="Expert location file to write (.json).")],
        json_out: JsonOpt = False,
    ) -> None:
        """The plan's expert-parallel homes as SGLang's --init-expert-location file (card c =
        EP rank c); prints the server flags it needs."""
        inputs = check_out(plan, out)
        location = write_sglang_location(read_plan(plan), out, inputs)
        flags = [f"--init-expert-location {out}", f"--ep-size {location.ep_size}"]
        if location.redundant:
            flags.append(f"--ep-num-redundant-experts {location.redundant}")
        if json_out:
            print_json({"out": str(out), "ep_size": location.ep_size,
                        "slots_per_card": location.slots_per_card,
                        "redundant_experts": location.redundant, "flags": " ".join(flags)})
            return
        typer.echo(f"expert locations -> {out} ({location.slots_per_card} slots per card; "
                   f"{location.redundant} replica slots fill cards that home fewer experts)")
        typer.echo(" ".join(flags))

    @command(export_app, "ktransformers")
    def ktransformers(
        plan: PlanArg,
        out: Annotated[Path, typer.Option(help="Frequency file to write (.pt).")],
        config: Annotated[Path | None, typer.Option(
            help="The model's config.json (needed where the model has dense layers: "
                 "sglang-kt counts its MoE layers from it).")] = None,
        union: Annotated[bool, typer.Option(
            help="Export the union of the cards' resident sets (sglang-kt keeps one GPU set "
                 "for all its tensor-parallel ranks).")] = False,
        json_out: JsonOpt = False,
    ) -> None:
        """The plan's resident experts as sglang-kt's GPU expert set: a logical_count file for
        --kt-expert-placement-strategy frequency, and the --kt-gpu-experts-ratio that makes the
        engine keep exactly those experts on the GPU."""
        inputs = check_out(plan, out, config)
        export = write_kt_export(read_plan(plan), out,
                                 None if config is None else read_config(config), inputs,
                                 union=union)
        flags = export.flags(out)
        if json_out:
            print_json({"file": str(out), "gpu_experts": export.gpu_experts, "flags": flags})
            return
        typer.echo(f"GPU expert set -> {out} ({export.gpu_experts} experts over "
                   f"{len(export.engine_moe_layers)} MoE layers)")
        typer.echo(" ".join(flags))

    @command(export_app, "llamacpp")
    def llamacpp(
        plan: PlanArg,
        out: Annotated[Path | None, typer.Option(help="Also write the arguments here.")
                       ] = None,
        json_out: JsonOpt = False,
    ) -> None:
        """llama.cpp arguments for the layer-offload baseline at the plan's budget: the
        expert tensors of the first MoE layers to CPU (-ot), and the equivalent --n-cpu-moe."""
        inputs = check_out(plan, out) if out is not None else ()
        p = read_plan(plan)
        offload = llamacpp_offload(p)
        if out is not None:
            write_text_atomic(offload.args() + "\n", out, inputs)
        if json_out:
            print_json({"cold_layers": offload.cold_layers, "override_tensor": offload.override,
                        "n_cpu_moe": offload.n_cpu_moe, "args": offload.args(),
                        "gguf_arch": offload.gguf_arch, "tensors": offload.tensor_names()})
            return
        typer.echo(f"# layer offload at this plan's budget: {len(offload.cold_layers)} of "
                   f"{len(p.moe_layers)} MoE layers cold (decoder layers "
                   f"{offload.cold_layers or 'none'})")
        if offload.cold_layers:
            typer.echo(offload.args())
            _echo_tensors(offload)
        if offload.n_cpu_moe is not None:
            typer.echo(f"# equivalent: --n-cpu-moe {offload.n_cpu_moe}")


def _echo_tensors(offload: LlamaCppOffload) -> None:
    names = [t.replace("{layer}", "N") for t in offload.expert_tensors()]
    if not names:
        typer.echo("# GGUF tensors to CPU: blk.N.ffn_{gate,up,down}_exps of the cold layers N "
                   "(names of this architecture not known to placer)")
        return
    typer.echo(f"# GGUF tensors to CPU ({offload.gguf_arch}), N in the cold layers: "
               f"{', '.join(names)}")
