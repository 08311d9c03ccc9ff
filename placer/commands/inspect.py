"""`placer inspect`: the checkpoint inventory every stage uses."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from placer.commands import solve_options as so
from placer.commands.common import command, print_json
from placer.errors import PlacerError
from placer.report.inventory import print_summary


def register(app: typer.Typer) -> None:
    @command(app, "inspect")
    def inspect(
        checkpoint: Annotated[Path | None, typer.Argument(
            help="Checkpoint directory (config.json + *.safetensors), or a GGUF model file "
                 "(the first part of a split one).")] = None,
        config: Annotated[Path | None, typer.Option(
            help="Estimate the inventory from a config.json alone (plan before download).")
        ] = None,
        expert_dtype: so.ExpertDtype = None,
        dense_dtype: so.DenseDtype = None,
        json_out: Annotated[bool, typer.Option("--json", help="Print the inventory as JSON.")
                            ] = False,
    ) -> None:
        """Read a checkpoint's config and safetensors headers, or a GGUF's metadata and tensor
        infos (never tensor bytes), and list its MoE layers, routed experts and their exact
        byte ranges."""
        from placer.checkpoint.source import model_inventory

        if (checkpoint is None) == (config is None):
            raise PlacerError("give a CHECKPOINT directory or GGUF file, or --config config.json "
                              "(not both)")
        inv = model_inventory(checkpoint, config, expert_dtype, dense_dtype)
        if json_out:
            print_json(inv.to_json())
        else:
            print_summary(inv)
