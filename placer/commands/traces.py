"""`placer traces stats|import`: look at a trace directory; import other tools' counts."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from placer.commands.common import command, model_identity, print_json
from placer.errors import PlacerError
from placer.inventory import read_inventory
from traces.importers import import_counts, read_count_matrix
from traces.profile import load_profile
from traces.sglang import import_sglang
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
        sources: Annotated[list[Path], typer.Argument(
            help="A count matrix (.npy or .csv, MoE layers x experts), or SGLang expert "
                 "distribution dumps (.pt files, or a directory of them: one per rank).")],
        out: Annotated[Path, typer.Option(help="New trace directory to store it in.")],
        model: Annotated[Path | None, typer.Option(
            help="Checkpoint the statistics came from: supplies top-k and the MoE layers, "
                 "checks the shape; SGLang per_token dumps become real trace rows with its "
                 "fingerprint.")] = None,
        top_k: Annotated[int | None, typer.Option(
            help="Experts each token selects (the model's k); needed without --model.")
                         ] = None,
        tag: Annotated[str | None, typer.Option(
            help="Profile name (default: file stem; 'sglang' for dumps).")] = None,
        tokens: Annotated[int | None, typer.Option(
            help="Tokens counted in a count matrix (default: largest row sum / top-k).")
                          ] = None,
        json_out: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")
                            ] = False,
    ) -> None:
        """Import another tool's expert-selection statistics as a profile.

        A count matrix is stored as DIR/counts.parquet (frequencies only). SGLang dumps from
        --expert-distribution-recorder-mode stat|stat_approx|per_pass give counts too;
        per_token dumps with --model give one trace row per token and MoE layer, so the
        solver samples real co-selection from them. Counts carry no fingerprint: their use
        with a model is guarded by shape (MoE layers x experts)."""
        path = import_statistics(sources, out, model=model, top_k=top_k, tag=tag,
                                 tokens=tokens)
        profile = load_profile(out, phase=None)
        if json_out:
            print_json({"path": str(path), "name": profile.name, "per_token": profile.per_token,
                        "moe_layers": list(profile.moe_layers),
                        "num_experts": profile.num_experts, "top_k": profile.top_k,
                        "tokens": profile.tokens})
            return
        typer.echo(f"{profile.name}: {len(profile.moe_layers)} MoE layers x "
                   f"{profile.num_experts} experts, {profile.tokens} tokens"
                   f"{', per token' if profile.per_token else ''} -> {path}")


def import_statistics(sources: list[Path], out: Path, *, model: Path | None,
                      top_k: int | None, tag: str | None, tokens: int | None) -> Path:
    """`placer traces import`: SGLang dumps (.pt) or one count matrix into `out`."""
    identity = model_identity(read_inventory(model)) if model is not None else None
    if identity is not None:
        if top_k not in (None, identity.top_k):
            raise PlacerError(f"--top-k {top_k} differs from the model's {identity.top_k}")
        top_k = identity.top_k
    files = [f for s in sources for f in (sorted(s.glob("*.pt")) if s.is_dir() else [s])]
    dumps = [f for f in files if f.suffix == ".pt"]
    if dumps:
        if len(dumps) != len(files):
            raise PlacerError("give SGLang .pt dumps or one count matrix, not both")
        if tokens is not None:
            raise PlacerError("--tokens is for count matrices; SGLang dumps count their own")
        return import_sglang(dumps, out, identity=identity, top_k=top_k, tag=tag)
    if len(files) != 1:
        raise PlacerError(f"give one count matrix or SGLang .pt dumps ({len(files)} files)")
    if top_k is None:
        raise PlacerError("--top-k (or --model) is needed to import a count matrix")
    if identity is not None:
        shape = read_count_matrix(files[0]).shape
        if shape != (len(identity.moe_layers), identity.experts_per_layer):
            raise PlacerError(f"{files[0]} is {shape[0]} MoE layers x {shape[1]} experts, the "
                              f"model {len(identity.moe_layers)} x "
                              f"{identity.experts_per_layer}")
    return import_counts(files[0], out, top_k=top_k, tag=tag, tokens=tokens)


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
