"""What `placer inspect` prints: a checkpoint's inventory and one expert's tensors."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.table import Table

from placer.report.figures import print_table
from placer.units import format_bytes

if TYPE_CHECKING:
    from placer.checkpoint.inventory import Inventory


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
