"""`placer export sglang|llamacpp`: a plan in other serving tools' terms."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from placer.commands.common import command, print_json
from placer.export import llamacpp_offload, write_sglang_location
from placer.plan import read_plan


def register(app: typer.Typer) -> None:
    export_app = typer.Typer(help="Write a plan in other serving tools' formats.",
                             no_args_is_help=True)
    app.add_typer(export_app, name="export")

    @command(export_app, "sglang")
    def sglang(
        plan: Annotated[Path, typer.Argument(help="plan.json or manifest.json (or its dir).")],
        out: Annotated[Path, typer.Option(help="Expert location file to write (.json).")],
        json_out: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")
                            ] = False,
    ) -> None:
        """The plan's expert-parallel homes as SGLang's --init-expert-location file (card c =
        EP rank c); prints the server flags it needs."""
        location = write_sglang_location(read_plan(plan), out)
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

    @command(export_app, "llamacpp")
    def llamacpp(
        plan: Annotated[Path, typer.Argument(help="plan.json or manifest.json (or its dir).")],
        out: Annotated[Path | None, typer.Option(help="Also write the arguments here.")
                       ] = None,
        json_out: Annotated[bool, typer.Option("--json", help="Print as JSON.")] = False,
    ) -> None:
        """llama.cpp arguments for the layer-offload baseline at the plan's budget: the
        expert tensors of the first MoE layers to CPU (-ot), and the equivalent --n-cpu-moe."""
        p = read_plan(plan)
        offload = llamacpp_offload(p)
        if out is not None:
            out.write_text(offload.args() + "\n")
        if json_out:
            print_json({"cold_layers": offload.cold_layers, "override_tensor": offload.override,
                        "n_cpu_moe": offload.n_cpu_moe, "args": offload.args()})
            return
        typer.echo(f"# layer offload at this plan's budget: {len(offload.cold_layers)} of "
                   f"{len(p.moe_layers)} MoE layers cold (decoder layers "
                   f"{offload.cold_layers or 'none'})")
        if offload.cold_layers:
            typer.echo(offload.args())
        if offload.n_cpu_moe is not None:
            typer.echo(f"# equivalent: --n-cpu-moe {offload.n_cpu_moe}")
