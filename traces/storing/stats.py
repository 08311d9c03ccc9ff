"""Summaries of a trace directory: token and sequence counts, per-layer skew, a heatmap."""

from __future__ import annotations

import io
import math
from pathlib import Path

import numpy as np

from traces.errors import TraceError
from traces.storing.dataset import open_traces, stream_rows
from traces.storing.profile import Profile, load_profile
from traces.storing.schema import KIND_COUNTS, PHASES

HOT_SHARES = (0.10, 0.25, 0.50)


def layer_stats(counts: np.ndarray) -> list[dict]:
    """Per row of `counts` [L, E]: entropy of expert use in bits (max log2 E) and the share of
    selections covered by the hottest 10% / 25% / 50% of experts (at least one expert)."""
    out = []
    num_experts = counts.shape[1]
    for row in counts:
        total = int(row.sum())
        p = row[row > 0] / max(total, 1)
        hottest = np.cumsum(np.sort(row)[::-1])
        out.append({
            "selections": total,
            "entropy_bits": float(-(p * np.log2(p)).sum()) if total else 0.0,
            "hot_share": {f"{round(f * 100)}%": float(hottest[max(1, math.ceil(f * num_experts))
                                                             - 1] / max(total, 1))
                          for f in HOT_SHARES},
        })
    return out


def trace_stats(trace_dir: Path, *, phase: str | None = None, tags: list[str] | None = None,
                profile: Profile | None = None) -> dict:
    """Tokens, sequences, per tag and per phase; per MoE layer (decoder layer index, as the
    trace or the imported source names it) entropy, hot shares and the counts of each expert.

    `phase`: restrict the per-layer figures to one phase (default: every row); `profile`:
    `load_profile(trace_dir, phase=phase, tags=tags)` when the caller has it already."""
    if phase is not None and phase not in PHASES:
        raise TraceError(f"--phase {phase!r}: choose {' or '.join(PHASES)}")
    td = open_traces(trace_dir)
    profile = profile or load_profile(trace_dir, phase=phase, tags=tags)
    per_tag: dict[str, dict] = {}
    per_phase = dict.fromkeys(PHASES, 0)
    if td.kind != KIND_COUNTS:
        seqs: dict[str, set[int]] = {}
        for b in stream_rows(td, ["seq_id", "phase", "tag"], None, tags, None,
                         first_layer_only=True):
            for tag in np.unique(b["tag"]):
                mine = b["tag"] == tag
                entry = per_tag.setdefault(str(tag), {"tokens": 0, "sequences": 0})
                entry["tokens"] += int(mine.sum())
                seqs.setdefault(str(tag), set()).update(np.unique(b["seq_id"][mine]).tolist())
            for name in PHASES:
                per_phase[name] += int((b["phase"] == name).sum())
        for tag, ids in seqs.items():
            per_tag[tag]["sequences"] = len(ids)
    else:
        per_tag[profile.name] = {"tokens": profile.tokens, "sequences": 0}
        per_phase = count_phases(td.metas[0], profile.tokens)
    return {
        "trace_dir": str(td.root),
        "kind": td.kind,
        "name": profile.name,
        "fingerprint": profile.fingerprint,
        "moe_layers": list(profile.moe_layers),
        "num_experts": profile.num_experts,
        "top_k": profile.top_k,
        "tokens": sum(v["tokens"] for v in per_tag.values()),
        "sequences": sum(v["sequences"] for v in per_tag.values()),
        "phases": per_phase,
        "tags": per_tag,
        "layer_stats_phase": phase,
        "layer_stats_tokens": profile.tokens,
        "layers": [{"layer": layer, **s, "counts": row.tolist()} for layer, s, row in
                   zip(profile.moe_layers, layer_stats(profile.counts), profile.counts,
                       strict=True)],
    }


def count_phases(meta: dict, tokens: int) -> dict[str, int] | None:
    """Tokens per phase of imported counts: all in the phase the source records (llama-imatrix:
    prefill), None where it does not say."""
    phase = meta.get("phases")
    return {name: tokens if name == phase else 0 for name in PHASES} if phase in PHASES else None


def check_plot_path(path: Path) -> Path:
    """`path` where a PNG heatmap may be written: a *.png name (matplotlib would append .png
    to a name without one, and write another format for another suffix) in a directory."""
    path = Path(path)
    if path.suffix.lower() != ".png":
        raise TraceError(f"--plot {path}: a heatmap is a PNG; name it *.png")
    if path.is_dir():
        raise TraceError(f"--plot {path} is a directory; name a .png file")
    if not path.parent.is_dir():
        raise TraceError(f"--plot {path}: no directory {path.parent}")
    return path


def heatmap_figure(profile: Profile):
    """A matplotlib figure of the layers x experts selection frequency; integer ticks on both
    axes (decoder layer indices, expert ids). The caller closes it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    freq = profile.frequency()
    width = min(16.0, 3.0 + 0.05 * profile.num_experts)
    height = min(12.0, 2.0 + 0.25 * len(profile.moe_layers))
    fig, ax = plt.subplots(figsize=(width, height))
    image = ax.imshow(freq, aspect="auto", interpolation="nearest", cmap="viridis")
    ax.set_xlabel("expert")
    ax.set_ylabel("decoder layer")
    ax.xaxis.set_major_locator(MaxNLocator(nbins=min(profile.num_experts, 16), integer=True))
    ax.set_xlim(-0.5, profile.num_experts - 0.5)
    ticks = np.unique(np.linspace(0, len(profile.moe_layers) - 1,
                                  min(len(profile.moe_layers), 16)).round().astype(int))
    ax.set_yticks(ticks, [str(profile.moe_layers[i]) for i in ticks])
    ax.set_title(f"{profile.name}: P(expert selected by a token), {profile.tokens} tokens")
    fig.colorbar(image, ax=ax)
    fig.tight_layout()
    return fig


def heatmap_png(profile: Profile) -> bytes:
    """The layers x experts heatmap of selection frequency as PNG bytes (the caller writes
    them where `check_plot_path` allows, through its atomic writer)."""
    import matplotlib.pyplot as plt

    fig = heatmap_figure(profile)
    try:
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png", dpi=100)
    finally:
        plt.close(fig)
    return buffer.getvalue()


def dropped_prefill(trace_dir: Path) -> str | None:
    """A note when the per-token trace in `trace_dir` has both phases: the solver and the
    evaluator replay its decode tokens only, and leave its prefill tokens out (a prefill is one
    step over a whole prompt, not a decode step per token: its routing is not the traffic a
    decode step sees). None where nothing is left out (one phase only, or imported counts)."""
    td = open_traces(trace_dir)
    if td.kind == KIND_COUNTS:
        return None
    per_phase = dict.fromkeys(PHASES, 0)
    for b in stream_rows(td, ["phase"], None, None, None, first_layer_only=True):
        for name in PHASES:
            per_phase[name] += int((b["phase"] == name).sum())
    prefill, decode = per_phase["prefill"], per_phase["decode"]
    if not (prefill and decode):
        return None
    return (f"{td.root}: {prefill:,} prefill tokens of {prefill + decode:,} left out (decode "
            f"steps only: a prefill step computes a whole prompt at once, so its routing is not "
            f"what a decode step stages); {decode:,} decode tokens used")
