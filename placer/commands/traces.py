"""`placer traces stats|split|import`: look at a trace directory, split it in two, import
other tools' counts."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from placer.commands.common import command, print_json
from placer.errors import PlacerError
from placer.files import check_outputs, removed_on_failure, write_bytes_atomic
from placer.report.traces import print_stats
from traces.choices import FORMAT_NAMES

GROUP_HELP = ("Routing traces: summarize one (stats), split one into calibration and held-out "
              "traffic (split), import other engines' routing (import).")


def register(app: typer.Typer) -> None:
    traces_app = typer.Typer(help=GROUP_HELP, no_args_is_help=True)
    app.add_typer(traces_app, name="traces")

    @command(traces_app, "stats")
    def stats(
        trace_dir: Annotated[Path, typer.Argument(help="Trace directory.")],
        json_out: Annotated[bool, typer.Option(
            "--json", help="Print the stats as JSON, with each MoE layer's per-expert "
                           "selection counts.")] = False,
        plot: Annotated[Path | None, typer.Option(
            help="Write a layers x experts heatmap to this path (a *.png name).")] = None,
        phase: Annotated[str | None, typer.Option(
            help="Per-layer figures over prefill or decode rows only (default: all): "
                 "prefill or decode.")] = None,
        tag: Annotated[list[str] | None, typer.Option(help="Only these tags; repeatable.")
                       ] = None,
    ) -> None:
        """Summarize a trace directory: tokens, sequences, tags, per-layer skew.

        Per MoE layer (its decoder layer index, for collected traces and imports alike): the
        entropy of expert use (bits) and the share of selections taken by the hottest 10% /
        25% / 50% of experts; --plot writes a layers x experts heatmap."""
        from traces.storing.profile import load_profile
        from traces.storing.stats import check_plot_path, heatmap_png, trace_stats

        profile = None
        if plot is not None:
            check_outputs([("--plot", plot)], [("the trace directory", trace_dir)])
            check_plot_path(plot)
            profile = load_profile(trace_dir, phase=phase, tags=tag)
        result = trace_stats(trace_dir, phase=phase, tags=tag, profile=profile)
        if profile is not None:
            write_bytes_atomic(heatmap_png(profile), plot, what="--plot")
        if json_out:
            print_json(result)
            return
        print_stats(result)
        if plot is not None:
            typer.echo(f"heatmap -> {plot}")

    @command(traces_app, "split")
    def split(
        trace_dir: Annotated[Path, typer.Argument(help="Per-token trace directory to split.")],
        out_a: Annotated[Path, typer.Option(
            help="New trace directory for the --fraction of sequences (or the --tag rows), "
                 "e.g. the calibration set.")],
        out_b: Annotated[Path, typer.Option(
            help="New trace directory for the rest, e.g. the held-out set.")],
        fraction: Annotated[float, typer.Option(
            help="Share of the sequences that goes to --out-a, drawn at random with --seed "
                 "(at least one sequence each side).")] = 0.5,
        seed: Annotated[int, typer.Option(help="Seed of the draw.")] = 0,
        tag: Annotated[list[str] | None, typer.Option(
            help="Split by tag instead: rows of these tags to --out-a, the rest to --out-b; "
                 "repeatable.")] = None,
        json_out: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")
                            ] = False,
    ) -> None:
        """Split a trace into two trace datasets (calibration and held-out traffic from one
        collection): by sequence, a seeded random --fraction to --out-a, or by --tag. Every
        sequence goes whole to one side; each output keeps the source's files, schema and
        metadata (fingerprint, tags), so every command reads it as the same model's trace.
        Both are written completely or not at all."""
        from traces.storing.split import split_traces

        check_outputs([("--out-a", out_a), ("--out-b", out_b)],
                      [("the trace directory", trace_dir)], directory=True)
        result = split_traces(trace_dir, out_a, out_b, fraction=fraction, seed=seed, tags=tag)
        if json_out:
            print_json({"by": result.by, "out_a": str(out_a), "out_b": str(out_b),
                        "sequences": list(result.sequences), "tokens": list(result.tokens),
                        "files": list(result.files)})
            return
        for out, i in ((out_a, 0), (out_b, 1)):
            typer.echo(f"{out}: {result.sequences[i]} sequences, {result.tokens[i]} tokens, "
                       f"{result.files[i]} file{'s' if result.files[i] != 1 else ''}")

    @command(traces_app, "import")
    def import_command(
        sources: Annotated[list[Path], typer.Argument(
            help="Files (or directories of them) in one format: see --format.")],
        out: Annotated[Path, typer.Option(help="New trace directory to store it in.")],
        fmt: Annotated[str | None, typer.Option(
            "--format", help=f"One of {', '.join(FORMAT_NAMES)}; detected where the file is "
                             "unambiguous (a GGUF file, whatever its name, or a .dat imatrix; "
                             ".pt sglang, .jsonl sglang-http, .npz with expert_ids tokens, 2-D "
                             ".npy/.csv counts, a directory with meta_info.json + "
                             "rank*.safetensors trtllm).")] = None,
        model: Annotated[Path | None, typer.Option(
            help="Checkpoint (directory or GGUF file) the routing came from: its layers, "
                 "experts and top-k are checked against the file; per-token sources become "
                 "trace rows with its fingerprint.")] = None,
        config: Annotated[Path | None, typer.Option(
            help="The model's config.json instead of --model (before downloading it): the "
                 "trace is marked estimated and checked by shape.")] = None,
        top_k: Annotated[int | None, typer.Option(
            help="Experts each token selects (the model's k); needed for counts without "
                 "--model/--config where the file does not say.")] = None,
        tag: Annotated[str | None, typer.Option(
            help="Profile name (default: the file stem, or the engine's name).")] = None,
        tokens: Annotated[int | None, typer.Option(
            help="Tokens counted in a count matrix (default: largest row sum / top-k).")
                          ] = None,
        prompt_lens: Annotated[Path | None, typer.Option(
            help="vllm: JSON {request name: prompt tokens, or {\"prompt\": P, "
                 "\"completion\": C, \"start\": S}}; prompt rows are prefill, the rest "
                 "decode (without it every row is decode).")] = None,
        prompt_start: Annotated[int | None, typer.Option(
            help="vllm, sglang-http: the requests skipped this many prompt tokens "
                 "(routed_experts_prompt_start / routed_experts_start_len): rows start "
                 "at that position (default: derived from prompt + completion - 1 - "
                 "rows where both are known, else 0).")] = None,
        load_balancer: Annotated[Path | None, typer.Option(
            help="trtllm: the static moe_config.load_balancer YAML the engine ran with; maps "
                 "the recorded slot ids to experts.")] = None,
        json_out: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")
                            ] = False,
    ) -> None:
        """Import another engine's routing: per-token rows where it records tokens, counts
        where it only counts (docs/ecosystem.md shows how each engine writes its file).

        Per-token formats (tokens, vllm, sglang-http, SGLang per_token dumps, TensorRT-LLM
        rank<r>_raw files) need --model or --config and keep sequences, positions and phases,
        so the solver samples real co-selection. Count formats (counts, imatrix, trtllm, SGLang
        stat/per_pass dumps) are stored as DIR/counts.parquet (frequencies only), guarded by
        shape when used."""
        from traces.storing.profile import load_profile
        from traces.storing.schema import PHASES, read_meta

        with removed_on_failure(out):
            path = import_statistics(sources, out, fmt=fmt, model=model, config=config,
                                     top_k=top_k, tag=tag, tokens=tokens,
                                     prompt_lens=prompt_lens, prompt_start=prompt_start,
                                     load_balancer=load_balancer)
            profile = load_profile(out, phase=None)
            meta = read_meta(path)
        note = meta.get("note")
        if json_out:
            print_json({"path": str(path), "name": profile.name, "per_token": profile.per_token,
                        "moe_layers": list(profile.moe_layers),
                        "num_experts": profile.num_experts, "top_k": profile.top_k,
                        "tokens": profile.tokens, "sequences": profile.sequences,
                        "phases": meta.get("phases"), "note": note})
            return
        phase = meta.get("phases") if meta.get("phases") in PHASES else None
        typer.echo(f"{profile.name}: {len(profile.moe_layers)} MoE layers x "
                   f"{profile.num_experts} experts, {profile.tokens} tokens"
                   f"{f', {profile.sequences} sequences, per token' if profile.per_token else ''}"
                   f"{f', {phase} only' if phase else ''} -> {path}")
        if note:
            typer.echo(f"note: {note}")


def import_statistics(sources: list[Path], out: Path, *, fmt: str | None = None,
                      model: Path | None = None, config: Path | None = None,
                      top_k: int | None = None, tag: str | None = None,
                      tokens: int | None = None, prompt_lens: Path | None = None,
                      prompt_start: int | None = None, load_balancer: Path | None = None
                      ) -> Path:
    """`placer traces import`: the model's identity (if given) and the files, to the importer
    of their format."""
    from placer.checkpoint.estimate import estimate_inventory
    from placer.checkpoint.inventory import read_inventory
    from traces.importers import import_routing, resolve_format
    from traces.importers.common import ImportRequest

    if model is not None and config is not None:
        raise PlacerError("give --model or --config, not both")
    fmt = resolve_format(sources, fmt)  # first: a source of no known format says so
    check_outputs([("--out", out)], [
        ("the checkpoint", model), ("the config", config),
        *(("the imported", source) for source in sources), ("--prompt-lens", prompt_lens),
        ("--load-balancer", load_balancer)], directory=True)
    inventory = (read_inventory(model) if model is not None
                 else estimate_inventory(config) if config is not None else None)
    request = ImportRequest(identity=None if inventory is None else inventory.identity(),
                            estimated=inventory is not None and inventory.estimated,
                            top_k=top_k, tag=tag, tokens=tokens, prompt_lens=prompt_lens,
                            prompt_start=prompt_start, load_balancer=load_balancer,
                            shared_experts=None if inventory is None
                            else inventory.shared_experts)
    return import_routing(sources, out, request, fmt)
