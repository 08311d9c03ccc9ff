"""Pictures of a placement: per-layer staged bytes against baselines, and drift heatmaps."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np

from placer.files import write_bytes_atomic
from placer.plan.placement import Plan
from placer.predict.drift import calibration_counts
from traces.storing.profile import load_profile


def plot_evaluation(plan: Plan, report: dict, trace_dirs: list[Path], out: Path) -> Path:
    """For each trace set: per-layer staged bytes per token of every line (placement vs
    layer offload, uniform, oracle, and the cache lines) at the first concurrency, under each
    execution model replayed (`--execution both`: both, labelled), and
    traffic minus calibration frequency; a PNG written to `out` by the atomic writer."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    calib = calibration_counts(plan)
    fig, axes = plt.subplots(len(trace_dirs), 2, figsize=(13, 3.6 * len(trace_dirs)),
                             squeeze=False)
    first_b = report["results"][0]["concurrency"]
    modes = {p["execution"] for p in report["per_layer"]}
    for row, trace_dir in enumerate(trace_dirs):
        ax = axes[row][0]
        for staged in report["per_layer"]:
            if staged["traces"] != str(trace_dir) or staged["concurrency"] != first_b:
                continue
            prefix = f"{staged['execution']}: " if len(modes) > 1 else ""
            for line, values in staged["staged_bytes_per_token"].items():
                ax.plot(plan.moe_layers, np.array(values) / 2**20, marker="o",
                        label=prefix + line)
        ax.set_title(f"{trace_dir}: staged MiB per token by layer (B={first_b})")
        ax.set_xlabel("MoE layer")
        ax.set_ylabel("MiB / token")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.legend(fontsize="small")
        ax = axes[row][1]
        traffic = load_profile(trace_dir).counts.astype(np.float64)
        diff = _share(traffic) - (_share(calib) if calib is not None else 0.0)
        lim = float(np.abs(diff).max()) or 1.0
        im = ax.imshow(diff, aspect="auto", cmap="coolwarm", vmin=-lim, vmax=lim)
        ax.set_title("traffic minus calibration: share of each layer's selections")
        ax.set_xlabel("expert")
        ax.set_ylabel("MoE layer ordinal")
        for axis in (ax.xaxis, ax.yaxis):
            axis.set_major_locator(MaxNLocator(integer=True))
        fig.colorbar(im, ax=ax)
    return write_figure(fig, out)


def _share(counts: np.ndarray) -> np.ndarray:
    s = counts.sum(axis=1, keepdims=True)
    return counts / np.where(s > 0, s, 1)


def write_figure(fig, out: Path) -> Path:
    """`fig` laid out, as a PNG at `out` by the atomic writer (`--plot`); the figure closed."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    buffer = io.BytesIO()
    try:
        fig.savefig(buffer, dpi=90, format="png")
    finally:
        plt.close(fig)
    write_bytes_atomic(buffer.getvalue(), Path(out), what="--plot")
    return Path(out)
