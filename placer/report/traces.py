"""What `placer traces stats` prints: tokens, sequences and tags of a trace directory, and per
MoE layer the entropy of expert use and the share of its hottest experts."""

from __future__ import annotations

from rich.table import Table

from placer.report.figures import bold, print_table
from placer.report.figures import console as rich_console


def print_stats(result: dict) -> None:
    """The stats of a trace directory (traces.storing.stats.trace_stats)."""
    console = rich_console()
    console.print(bold(result["name"]), f"({result['kind']}): {result['tokens']} tokens, "
                  f"{result['sequences']} sequences, {len(result['moe_layers'])} MoE layers x "
                  f"{result['num_experts']} experts, top-{result['top_k']}")
    tags = Table("tag", "tokens", "sequences", title="per tag")
    for tag, entry in result["tags"].items():
        tags.add_row(tag, str(entry["tokens"]), str(entry["sequences"]))
    print_table(tags, console)
    if result["phases"]:
        console.print("phases: " + ", ".join(f"{k} {v}" for k, v in result["phases"].items()))
    layers = Table("layer", "entropy (bits)", "hot 10%", "hot 25%", "hot 50%",
                   title=f"per MoE layer ({result['layer_stats_phase'] or 'all'} rows)")
    for entry in result["layers"]:
        share = entry["hot_share"]
        layers.add_row(str(entry["layer"]), f"{entry['entropy_bits']:.2f}",
                       f"{share['10%']:.1%}", f"{share['25%']:.1%}", f"{share['50%']:.1%}")
    print_table(layers, console)
