"""`placer evaluate`'s prefetch section as text: per trace directory, the plan's slots
replayed with LRU and Belady's MIN, each without and with prefetching from the traffic's
speculative routing (placer/predict/prefetch.py), and the predictor's recall and precision
per MoE layer; and a plan's prefetch decision (placer/plan/prefetch.py) in a few lines, for
`placer solve`'s summary and tables."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from placer.report.figures import label, print_table, wrapped

COLUMNS = ("line", "hits", "misses", "prefetched", "useful", "late", "wasted",
           "stall ms/token")


def print_prefetch(sections: list[dict], console: Console) -> None:
    """One table per section, then its recall and precision by layer."""
    for s in sections:
        table = Table(title=f"{s['traces']}: prefetch at B=1, {s['tokens']} tokens; a copy "
                            f"{s['copy_ms']:.3g} ms, a layer's window {s['window_ms']:.3g} ms "
                            "(modelled from the spec); exact replays, LRU and Belady")
        for col in COLUMNS:
            table.add_column(col, justify="right")
        for name, f in s["lines"].items():
            table.add_row(name, *(str(f[k]) for k in COLUMNS[1:-1]),
                          f"{f['stall_ms_per_token']:.4f}")
        print_table(table, console)
        params, decided = s["params"], s.get("plan_prefetch")
        whose = ("the replay's defaults (the plan records no prefetch)" if decided is None
                 else f"the plan's (its prefetch is {'on' if decided['on'] else 'off'})")
        console.print(f"+prefetch lines: slot share {params['slot_share']:g}, "
                      f"{params['max_per_layer'] or 'every'} predicted per layer, depth "
                      f"{params['depth']}: {whose}", highlight=False)
        for what in ("recall", "precision"):
            shares = ", ".join("-" if r["share"] is None else f"{r['layer']}: {r['share']:.2f}"
                               for r in s[what])
            console.print(f"{what} of the speculative selection by layer: {shares}",
                          highlight=False)
        console.print(f"({s['interval']})", highlight=False)


def prefetch_summary(section: dict) -> list[str]:
    """One evaluate prefetch section in a summary: its LRU stall without and with prefetch
    (the full tables hold the rest)."""
    lines = section["lines"]
    return wrapped(f"prefetch on {label(section['traces'])} (B=1, exact replay, no interval): "
                   f"stall {lines['lru']['stall_ms_per_token']:.4f} ms/token with LRU, "
                   f"{lines['lru+prefetch']['stall_ms_per_token']:.4f} with prefetch (the "
                   "section: the full tables)")


def prefetch_lines(prefetch: dict | None, replayed_only: bool = False) -> list[str]:
    """The plan's prefetch: on or off and why; what the decision replayed (ms per token).
    With `replayed_only`, nothing where it was not replayed (a summary: the reason, e.g. no
    speculative routing in the traces, is in the full tables and the plan)."""
    if not prefetch or (replayed_only and not prefetch.get("predicted")):
        return []
    lines = wrapped(f"prefetch: {'on' if prefetch['on'] else 'off'} ({prefetch['reason']})")
    p = prefetch.get("predicted")
    if p:
        share = "" if p["with_ms_per_token"] is None else (
            f"; with prefetch {p['with_ms_per_token']:.4f} (slot share "
            f"{prefetch['slot_share']:g})")
        lines += wrapped(f"prefetch replayed on {p['tokens']} of {p['of_tokens']} calibration "
                         f"tokens (in sample, batch 1, exact replays: no interval): stall "
                         f"{p['without_ms_per_token']:.4f} ms/token as the split serves without "
                         f"prefetch, {p['best_without_ms_per_token']:.4f} at best without "
                         f"(any candidate under LRU){share}")
    return lines
