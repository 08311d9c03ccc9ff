"""`placer traces stats|import`: look at a trace directory; import other tools' counts."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from placer.commands.common import command, print_json
from traces.importers import import_counts
from traces.profile import load_profile
from traces.stats import plot_heatmap, trace_stats


def register(app: typer.Typer) -> None:
    traces_app = typer.Typer(help="Inspect routing traces and import other tools' dumps.",
                             no_args_is_help=True)
    app.add_typer(traces_app, name="traces")

    @command(traces_app, "stats")
    def stats(
        trace_dir: Annotated[Path, typer.Argument(help="Trace directory.")],
        json_out: Annotated[bool, typer.Option("--json", help="Print the stats as JSON.")
                            ] = False,
        plot: Annotated[Path | None, typer.Option(
            help="Write a layers x experts heatmap (PNG) here.")] = None,
        phase: Annotated[str | None, typer.Option(
            help="Per-layer figures over prefill or decode rows only (default: all).")] = None,
        tag: Annotated[list[str] | None, typer.Option(help="Only these tags; repeatable.")
                       ] = None,
    ) -> None:
        """Summarize a trace directory: tokens, sequences, tags, per-layer skew.

        Per MoE layer: the entropy of expert use (bits) and the share of selections taken by
        the hottest 10% / 25% / 50% of experts; --plot writes a layers x experts heatmap."""
        result = trace_stats(trace_dir, phase=phase, tags=tag)
        if plot is not None:
            plot_heatmap(load_profile(trace_dir, phase=phase, tags=tag), plot)
        if json_out:
            print_json(result)
            return
        _print_stats(result)
        if plot is not None:
            typer.echo(f"heatmap -> {plot}")

    @command(traces_app, "import")
    def import_command(
        counts: Annotated[Path, typer.Argument(
            help="Count matrix (.npy or .csv), MoE layers x experts; row i = i-th MoE layer.")],
        out: Annotated[Path, typer.Option(help="New trace directory to store it in.")],
        top_k: Annotated[int, typer.Option(help="Experts each token selects (the model's k).")],
        tag: Annotated[str | None, typer.Option(help="Profile name (default: file stem).")
                       ] = None,
        tokens: Annotated[int | None, typer.Option(
            help="Tokens counted (default: largest row sum / top-k).")] = None,
    ) -> None:
        """Import another tool's expert-selection counts as a frequency-only profile.

        The matrix is stored as DIR/counts.parquet; it has no model fingerprint, so its use
        with a model is guarded by its shape (MoE layers x experts)."""
        path = import_counts(counts, out, top_k=top_k, tag=tag, tokens=tokens)
        profile = load_profile(out)
        typer.echo(f"{profile.name}: {len(profile.moe_layers)} MoE layers x "
                   f"{profile.num_experts} experts, {profile.tokens} tokens -> {path}")


def _print_stats(result: dict) -> None:
    console = Console()
    console.print(f"[bold]{result['name']}[/bold] ({result['kind']}): {result['tokens']} tokens, "
                  f"{result['sequences']} sequences, {len(result['moe_layers'])} MoE layers x "
                  f"{result['num_experts']} experts, top-{result['top_k']}")
    tags = Table("tag", "tokens", "sequences", title="per tag")
    for tag, entry in result["tags"].items():
        tags.add_row(tag, str(entry["tokens"]), str(entry["sequences"]))
    console.print(tags)
    if result["phases"]:
        console.print("phases: " + ", ".join(f"{k} {v}" for k, v in result["phases"].items()))
    layers = Table("layer", "entropy (bits)", "hot 10%", "hot 25%", "hot 50%",
                   title=f"per MoE layer ({result['layer_stats_phase'] or 'all'} rows)")
    for entry in result["layers"]:
        share = entry["hot_share"]
        layers.add_row(str(entry["layer"]), f"{entry['entropy_bits']:.2f}",
                       f"{share['10%']:.1%}", f"{share['25%']:.1%}", f"{share['50%']:.1%}")
    console.print(layers)
