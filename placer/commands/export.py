"""`placer export sglang|trtllm|ktransformers|llamacpp`: a plan in serving engines' terms."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer

from placer.checkpoint.config import read_config
from placer.commands.common import command, print_json
from placer.errors import PlacerError
from placer.exporters.output import check_out
from placer.files import write_text_atomic
from placer.report.exporters import print_offload

PlanArg = Annotated[Path, typer.Argument(help="plan.json or manifest.json (or its dir).")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")]


GROUP_HELP = ("A plan in serving engines' terms: SGLang's expert locations (sglang), "
              "TensorRT-LLM's static placement (trtllm), sglang-kt's GPU experts "
              "(ktransformers), llama.cpp's arguments (llamacpp).")


def register(app: typer.Typer) -> None:
    export_app = typer.Typer(help=GROUP_HELP, no_args_is_help=True)
    app.add_typer(export_app, name="export")

    @command(export_app, "sglang")
    def sglang(
        plan: PlanArg,
        out: Annotated[Path, typer.Option(help="Expert location file to write (.json).")],
        logical_count: Annotated[bool, typer.Option(
            "--logical-count", help="Write the plan's calibration load instead "
                                    "({\"logical_count\": ...}): SGLang's own EPLB places the "
                                    "experts.")] = False,
        json_out: JsonOpt = False,
    ) -> None:
        """The plan's expert-parallel homes as SGLang's --init-expert-location file (card c =
        EP rank c), or with --logical-count its calibration load for SGLang's EPLB to place
        from; prints the server flags it needs."""
        from placer.exporters.sglang import (
            EPLB_WARNING,
            sglang_flags,
            write_sglang_location,
            write_sglang_logical_count,
        )
        from placer.plan.placement import read_plan

        inputs = check_out(plan, out)
        p = read_plan(plan)
        if logical_count:
            redundant = write_sglang_logical_count(p, out)
            summary = {"out": str(out), "mode": "logical_count", "ep_size": len(p.cards),
                       "redundant_experts": redundant}
            what = f"calibration load -> {out} (SGLang's EPLB places the experts)"
        else:
            location = write_sglang_location(p, out, inputs)
            redundant = location.redundant
            summary = {"out": str(out), "mode": "physical_to_logical_map",
                       "ep_size": location.ep_size, "slots_per_card": location.slots_per_card,
                       "redundant_experts": redundant}
            what = (f"expert locations -> {out} ({location.slots_per_card} slots per card; "
                    f"{redundant} replica slots fill cards that home fewer experts)")
        flags = sglang_flags(out, summary["ep_size"], redundant)
        if json_out:
            print_json({**summary, "flags": " ".join(flags), "warnings": [EPLB_WARNING]})
            return
        typer.echo(what)
        typer.echo(" ".join(flags))
        typer.echo(f"warning: {EPLB_WARNING}")

    @command(export_app, "trtllm")
    def trtllm(
        plan: PlanArg,
        out: Annotated[Path, typer.Option(
            help="Load balancer file to write (.yaml), for moe_config.load_balancer.")],
        json_out: JsonOpt = False,
    ) -> None:
        """The plan's expert-parallel homes as TensorRT-LLM's static expert placement (card c =
        EP rank c, layer_updates_per_iter 0); prints the options file and launch it needs, and
        where TensorRT-LLM would ignore it."""
        from placer.exporters.trtllm import write_trtllm_placement
        from placer.plan.placement import read_plan

        check_out(plan, out)
        placement = write_trtllm_placement(read_plan(plan), out, Path(plan).name)
        options = placement.extra_options(out)
        if json_out:
            print_json({"out": str(out), "num_slots": placement.num_slots,
                        "ep_size": placement.ep_size,
                        "slots_per_card": placement.slots_per_card,
                        "extra_llm_api_options": options,
                        "launch": placement.launch(Path("extra_llm_api_options.yaml")),
                        "warnings": placement.warnings})
            return
        typer.echo(f"static expert placement -> {out} ({placement.num_slots} slots, "
                   f"{placement.slots_per_card} per card)")
        typer.echo("# extra_llm_api_options.yaml:")
        typer.echo(options, nl=False)
        typer.echo(placement.launch(Path("extra_llm_api_options.yaml")))
        for warning in placement.warnings:
            typer.echo(f"warning: {warning}")

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
        from placer.exporters.ktransformers import write_kt_export
        from placer.plan.placement import read_plan

        inputs = check_out(plan, out, ("the config", config))
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
        devices: Annotated[str | None, typer.Option(
            help="Buffer type of each card, comma-separated, as llama.cpp --list-devices names "
                 "them (default CUDA0,CUDA1,...; ROCm0,... on HIP builds).")] = None,
        model: Annotated[Path | None, typer.Option(
            help="The GGUF for the llama-server command (plans solved with --engine "
                 "llamacpp), checked against the plan's model (default: the GGUF the plan "
                 "was solved from).")] = None,
        option: Annotated[str | None, typer.Option(
            help="Print this option of the plan's table instead of its choice (e.g. "
                 "'ncmoe', 'tuner 4096 MiB, share 0.9'), to A/B by hand.")] = None,
        llamacpp_version: Annotated[str | None, typer.Option(
            help="The llama.cpp build to print for: bNNNNN, vX.Y.Z or the first line of "
                 "`llama-server --version` (default: the plan's); flags it lacks are "
                 "refused.")] = None,
        json_out: JsonOpt = False,
    ) -> None:
        """For a plan solved with --engine llamacpp: the llama-server command (-ngl all, the
        host layers as -ncmoe N or -ot, --moe-cache-mib N). For any other plan, llama.cpp
        arguments for the layer-offload baseline at the plan's budget: the
        expert tensors of the first MoE layers to CPU (-ot, or --cpu-moe when every MoE layer
        is cold), the equivalent --n-cpu-moe, and on several cards each device's layers
        (-ot ...=CUDAi) and the dense split (-ngl all -ts)."""
        from placer.exporters.llamacpp import llamacpp_offload
        from placer.plan.placement import read_plan

        p = read_plan(plan)
        inputs = () if out is None else check_out(
            plan, out, ("--model", model),
            ("the plan's GGUF", Path(p.engine["gguf"]) if (p.engine or {}).get("gguf") else None))
        names = None if devices is None else [d.strip() for d in devices.split(",")]
        if p.engine is not None:
            _engine_export(p, EngineExport(model, option, llamacpp_version, names), out,
                           inputs, json_out)
            return
        for flag, given in (("--option", option), ("--llamacpp-version", llamacpp_version),
                            ("--model", model)):
            if given is not None:
                raise PlacerError(f"{flag} is for plans solved with --engine llamacpp; this "
                                  "plan's export is the layer-offload baseline")
        offload = llamacpp_offload(p, names)
        if out is not None:
            write_text_atomic(offload.args() + "\n", out, inputs)
        if json_out:
            print_json(offload.to_json())
        else:
            print_offload(p, offload)


@dataclass(frozen=True)
class EngineExport:
    """What `export llamacpp` was asked for an --engine llamacpp plan."""

    model: Path | None
    option: str | None
    version: str | None
    devices: list[str] | None


def _engine_export(p, asked: EngineExport, out: Path | None, inputs: tuple,
                   json_out: bool) -> None:
    """Print (and with --out write) the llama-server command of an --engine llamacpp plan."""
    from placer.exporters.llamacpp import (
        check_model,
        device_names,
        model_placeholder,
        plan_option,
        server_command,
    )
    from placer.plan.engine import plan_target
    from placer.plan.estimates import estimated_json
    from placer.report.exporters import predicted_comments

    engine = p.engine
    target = plan_target(p, asked.version)
    build = target.build
    placeholder = None
    if asked.model is not None:
        check_model(p, asked.model)
        model = str(asked.model)
    elif target.gguf is not None:
        model = str(target.gguf)
    else:
        placeholder = model_placeholder(p)
        model = placeholder.name
    names = None if asked.devices is None else device_names(p, asked.devices)
    chosen = plan_option(p, asked.option)
    line = server_command(p, build, model, chosen, names)
    if out is not None:
        write_text_atomic(line + "\n", out, inputs)
    if json_out:
        print_json({"command": line, "option": chosen.get("name", "chosen"),
                    "host_layers": chosen["host_layers"], "n_cpu_moe": chosen["n_cpu_moe"],
                    "moe_cache_mib": chosen["moe_cache_mib"], "slots": chosen["slots"],
                    "cpu_share": chosen.get("cpu_share", 0.0),
                    "pinned": chosen.get("pinned", True), "choice": engine["choice"],
                    "tensor_split": engine.get("tensor_split"), "context": engine.get("context"),
                    "devices": engine.get("devices"), "build": build.to_json(),
                    "build_label": build.label,
                    "model_placeholder": None if placeholder is None else {
                        "name": placeholder.name, "must_match": placeholder.must_match},
                    "estimated": estimated_json(p.hardware)})
        return
    what = (engine["choice"] if asked.option is None else f"option {chosen['name']!r}")
    typer.echo(f"# {what}: experts of decoder layers {chosen['host_layers']} in host memory, "
               f"cache {chosen['moe_cache_mib']} MiB ({chosen['slots'] or 'no'} slots per "
               "group)")
    typer.echo(f"# predicted for {build.label}")
    for comment in predicted_comments(p, chosen.get("name", "chosen")):
        typer.echo(comment)
    if placeholder is not None:
        typer.echo(f"# {placeholder.name}: your GGUF of this model, {placeholder.must_match} "
                   "(export again with --model YOUR.gguf to check it)")
    if engine.get("tensor_split"):
        host = set(chosen["host_layers"])
        for c in range(len(engine["tensor_split"])):
            mine = [x for x, d in zip(p.moe_layers, engine["devices"], strict=True) if d == c]
            typer.echo(f"# card {c} (-ts {engine['tensor_split'][c]:g}): MoE layers {mine}, "
                       f"host {[x for x in mine if x in host]}")
    typer.echo(line)
