"""`placer bench --plot`: each arm's measured and predicted decode tokens/s, with intervals."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from placer.predict.plots import write_figure


def plot_bench(report: dict, out: Path) -> Path:
    """One column per concurrency: above, each arm's measured and predicted tokens/s; below,
    each arm's ratio to the first arm, measured and predicted; every bar with its 95%
    interval (none where too few trials gave none). A PNG, written by the atomic writer
    (placer.files)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = report["arms"]
    levels = sorted({r["concurrency"] for r in rows})
    names = labels([r["placed"] for r in rows])
    fig, axes = plt.subplots(2, len(levels), figsize=(5.5 * len(levels), 7), squeeze=False)
    for col, level in enumerate(levels):
        arms = [i for i, r in enumerate(rows) if r["concurrency"] == level]
        for ax, (key, ylabel) in zip(axes[:, col], (("tokens_per_s", "decode tokens / s"),
                                                   ("ratio_to_first", "ratio to the first arm")),
                                     strict=True):
            x = np.arange(len(arms))
            for offset, kind in ((-0.2, "measured"), (0.2, "predicted")):
                values = np.array([rows[i][f"{kind}_{key}"] for i in arms])
                ax.bar(x + offset, values, 0.4, yerr=error_bars(
                    values, [rows[i][f"{kind}_{key}_ci95"] for i in arms]), capsize=4,
                    label=kind)
            ax.set_xticks(x, [names[i] for i in arms], rotation=15)
            ax.set_title(f"concurrency {level}")
            ax.set_ylabel(ylabel)
            ax.legend()
    return write_figure(fig, out)


def error_bars(values: np.ndarray, cis: list[list[float] | None]) -> np.ndarray:
    """[2, n] distances below and above each value to its interval's ends (0 where a figure
    has no interval: too few trials); never negative, as the intervals hold their points."""
    ends = np.array([ci if ci is not None else [v, v] for v, ci in zip(values, cis,
                                                                        strict=True)])
    return np.clip(np.stack([values - ends[:, 0], ends[:, 1] - values]), 0.0, None)


def labels(paths: list[str]) -> list[str]:
    """Each placed directory's name, with its parent's where names repeat."""
    names = [Path(p).name for p in paths]
    return [f"{Path(p).parent.name}/{n}" if names.count(n) > 1 and
            len({q for q, m in zip(paths, names, strict=True) if m == n}) > 1 else n
            for p, n in zip(paths, names, strict=True)]
