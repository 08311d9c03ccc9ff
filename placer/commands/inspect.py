"""`placer inspect`: the checkpoint inventory every stage uses."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from placer.checkpoint.config import DTYPE_HELP
from placer.commands.common import command, print_json, print_table
from placer.errors import PlacerError
from placer.units import format_bytes

if TYPE_CHECKING:
    from placer.checkpoint.inventory import Inventory


def register(app: typer.Typer) -> None:
    @command(app, "inspect")
    def inspect(
        checkpoint: Annotated[Path | None, typer.Argument(
            help="Checkpoint directory (config.json + *.safetensors), or a GGUF model file "
                 "(the first part of a split one).")] = None,
        config: Annotated[Path | None, typer.Option(
            help="Estimate the inventory from a config.json alone (plan before download).")
        ] = None,
        expert_dtype: Annotated[str | None, typer.Option(
            help=f"With --config: expert weight dtype ({DTYPE_HELP}; default: "
                 "the config's quantization method, else its torch_dtype, else bf16).")
        ] = None,
        dense_dtype: Annotated[str | None, typer.Option(
            help=f"With --config: dense weight dtype ({DTYPE_HELP}; default: "
                 "the config's torch_dtype, else bf16).")] = None,
        json_out: Annotated[bool, typer.Option("--json", help="Print the inventory as JSON.")
                            ] = False,
    ) -> None:
        """Read a checkpoint's config and safetensors headers, or a GGUF's metadata and tensor
        infos (never tensor bytes), and list its MoE layers, routed experts and their exact
        byte ranges."""
        from placer.checkpoint.estimate import estimate_inventory
        from placer.checkpoint.inventory import read_inventory

        if (checkpoint is None) == (config is None):
            raise PlacerError("give a CHECKPOINT directory or GGUF file, or --config config.json "
                              "(not both)")
        inv = (read_inventory(checkpoint) if checkpoint is not None
               else estimate_inventory(config, expert_dtype, dense_dtype))
        if json_out:
            print_json(inv.to_json())
        else:
            print_summary(inv)


def print_summary(inv: Inventory) -> None:
    """A human summary of an inventory."""
    d = inv.to_json(with_experts=False)
    table = Table(title=f"{inv.architecture} ({inv.model_type})"
                  + ("  (estimated from config)" if inv.estimated else ""), show_header=False)
    per = d["bytes_per_expert"]
    rows = [
        ("fingerprint", inv.fingerprint),
        ("layers", f"{inv.num_layers} ({len(inv.moe_layers)} MoE, dense: "
                   f"{list(inv.dense_layers) or 'none'})"),
        ("routed experts per layer", str(inv.experts_per_layer)),
        ("top-k", str(inv.top_k)),
        ("shared experts (dense)", str(inv.shared_experts)),
        ("bytes per expert", format_bytes(per["min"]) if per["min"] == per["max"]
         else f"{format_bytes(per['min'])} .. {format_bytes(per['max'])}"),
        ("expert tensors per expert", str(len(inv.experts[0].tensors))),
        ("expert bytes total", f"{format_bytes(inv.expert_bytes_total)} "
                               f"({inv.expert_bytes_total} B)"),
        ("dense bytes", f"{format_bytes(inv.dense_bytes)} ({inv.dense_bytes} B)"),
        ("files", str(len(inv.files))),
    ]
    for k, v in rows:
        table.add_row(k, v)
    print_table(table)
    first = inv.experts[0]
    sample = Table(title=f"layer {first.layer}, expert {first.expert}")
    columns = ("tensor", "dtype", "shape", "length") if inv.estimated else (
        "tensor", "dtype", "shape", "file", "offset", "length")
    for col in columns:
        sample.add_column(col)
    for t in first.tensors:
        where = () if inv.estimated else (str(t.file), str(t.offset))
        sample.add_row(t.name, t.dtype, str(list(t.shape)), *where, str(t.length))
    print_table(sample)
