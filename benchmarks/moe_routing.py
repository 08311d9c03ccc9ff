"""The routing of a MoE trained by benchmarks/train_moe.py beside gpt-oss-20b's (issue #54
item 5): skew, locality and speculative recall per MoE layer.

    .venv/bin/python benchmarks/moe_routing.py CHECKPOINT [--traces DIR] [--max-tokens N]
        [--gptoss ../shared/data/routing/gptoss20b-decode] [--json]

Runs `placer collect --model CHECKPOINT` (score mode: one forward pass per document, every
row a decode row, teacher-forced) over the checkpoint's held-out corpora
(CHECKPOINT/heldout/{prose,code,chat}.jsonl, which train_moe.py wrote), one trace directory
per domain under --traces (default CHECKPOINT-traces beside it: collect never writes
into what it reads; kept: the trace set tests and benchmarks read), and imports
gpt-oss-20b's recorded decode routing (its `mmlu_dev` and `mixed_small` sets,
`placer traces import --format tokens`). For each, per MoE layer:

- skew: the share of selections taken by the hottest 10% of experts and the entropy of
  expert use in bits (traces.storing.stats, what `placer traces stats` prints), the entropy
  also as a share of log2(E) so 16 and 32 experts compare;
- locality: the share of a token's k experts that the previous token of the same sequence
  also selected, beside what that share would be if tokens chose independently with the same
  per-expert frequencies (sum_e f_e^2 / k, f_e = selections of e / tokens): reuse above it is
  temporal locality, not skew;
- the trained model only: the recall of its speculative selection one layer ahead (layer
  l+1's router on layer l's hidden state: `spec_experts`), with a 95% Wilson interval that
  takes selections as independent (optimistic: tokens of one sequence are not).

Every figure is a point estimate over the tokens named beside it. gpt-oss's rows are
generated tokens (true decode); the trained model's are teacher-forced held-out text: its
locality is that of the text, not of its own generations.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.moe_corpus import DOMAINS  # noqa: E402
from solvers.cache.prefetch import quality  # noqa: E402
from traces.storing.dataset import open_traces, stream_rows  # noqa: E402
from traces.storing.speculative import has_speculative_dir, speculative_steps  # noqa: E402
from traces.storing.stats import trace_stats  # noqa: E402

GPTOSS = REPO.parent / "shared" / "data" / "routing" / "gptoss20b-decode"
GPTOSS_SETS = ("mmlu_dev", "mixed_small")


def placer(*args: str) -> None:
    """Run `python -m placer ARGS` with this checkout first on the path; exit on failure."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])}
    done = subprocess.run([sys.executable, "-m", "placer", *args], env=env,
                          capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"placer {args[0]} failed: {(done.stderr or done.stdout).strip()[-400:]}")


def collect_heldout(checkpoint: Path, traces: Path, max_tokens: int) -> dict[str, Path]:
    """One trace directory per domain of CHECKPOINT/heldout (collected once, then reused)."""
    out = {}
    for domain in DOMAINS:
        out[domain] = traces / domain
        if not out[domain].exists():
            placer("collect", "--model", str(checkpoint), "--out", str(out[domain]),
                   "--corpus", str(checkpoint / "heldout" / f"{domain}.jsonl"),
                   "--tag", domain, "--max-length", "256", "--max-tokens", str(max_tokens),
                   "--device", "cpu", "--no-progress")
    return out


def import_gptoss(gptoss: Path, traces: Path) -> dict[str, Path]:
    """gpt-oss-20b's decode sets as trace directories (imported once, then reused)."""
    out = {}
    for name in GPTOSS_SETS:
        out[name] = traces / f"gptoss-{name}"
        if not out[name].exists():
            placer("traces", "import", str(gptoss / f"{name}.npz"), "--format", "tokens",
                   "--config", str(gptoss / "config.json"), "--out", str(out[name]))
    return out


def ordered_selections(trace_dir: Path) -> tuple[np.ndarray, np.ndarray]:
    """(experts [T, L, k] int64, sequence id [T]) of every token in (sequence, position)
    order."""
    td = open_traces(trace_dir)
    parts = list(stream_rows(td, ["seq_id", "pos", "layer", "experts"], None, None, None))
    rows = {c: np.concatenate([p[c] for p in parts]) for c in parts[0]}
    order = np.lexsort((rows["layer"], rows["pos"], rows["seq_id"]))
    layers = len(td.model["moe_layers"])
    experts = rows["experts"][order].reshape(-1, layers, td.model["top_k"]).astype(np.int64)
    return experts, rows["seq_id"][order][::layers]


def locality(experts: np.ndarray, seq: np.ndarray, num_experts: int
             ) -> tuple[list[float], list[float]]:
    """Per layer: the mean share of a token's experts the previous token of its sequence
    also selected, and that share if tokens chose independently (sum_e f_e^2 / k)."""
    same = seq[1:] == seq[:-1]
    now, before = experts[1:][same], experts[:-1][same]
    k = experts.shape[2]
    shared = (now[..., :, None] == before[..., None, :]).any(axis=3).sum(axis=2)
    reuse = (shared.mean(axis=0) / k).tolist()
    independent = []
    for layer in range(experts.shape[1]):
        f = np.bincount(experts[:, layer].ravel(), minlength=num_experts) / len(experts)
        independent.append(float((f * f).sum() / k))
    return reuse, independent


def routing_figures(trace_dir: Path) -> dict:
    """Tokens, sequences and per MoE layer the skew, locality and (where recorded)
    speculative recall of one trace directory."""
    stats = trace_stats(trace_dir)
    experts, seq = ordered_selections(trace_dir)
    reuse, independent = locality(experts, seq, stats["num_experts"])
    recall = [None] * len(reuse)
    if has_speculative_dir(trace_dir):
        recall = quality(*speculative_steps(trace_dir)).recall()
    layers = [{"layer": s["layer"], "hot10": s["hot_share"]["10%"],
               "entropy_bits": s["entropy_bits"],
               "entropy_share": s["entropy_bits"] / math.log2(stats["num_experts"]),
               "reuse": r, "reuse_independent": i, "spec_recall": rec}
              for s, r, i, rec in zip(stats["layers"], reuse, independent, recall, strict=True)]
    return {"trace_dir": str(trace_dir), "tokens": stats["tokens"],
            "sequences": stats["sequences"], "experts": stats["num_experts"],
            "top_k": stats["top_k"], "layers": layers, "mean": _means(layers)}


def _means(layers: list[dict]) -> dict:
    keys = ("hot10", "entropy_share", "reuse", "reuse_independent")
    out = {k: float(np.mean([row[k] for row in layers])) for k in keys}
    recalls = [row["spec_recall"][0] for row in layers if row["spec_recall"]]
    out["spec_recall"] = float(np.mean(recalls)) if recalls else None
    return out


def report(checkpoint: Path, traces: Path, gptoss: Path, max_tokens: int) -> dict:
    """Figures of the trained model's held-out domains and of gpt-oss's decode sets."""
    runs = {f"trained {d}": p for d, p in collect_heldout(checkpoint, traces, max_tokens).items()}
    runs.update({f"gpt-oss {n}": p for n, p in import_gptoss(gptoss, traces).items()})
    training = json.loads((checkpoint / "training.json").read_text())
    return {"checkpoint": str(checkpoint), "steps": training["steps"],
            "train_seconds": training["train_seconds"],
            "validation": training["validation"],
            "runs": {name: routing_figures(path) for name, path in runs.items()}}


def _pct(x: float | None) -> str:
    return "    -" if x is None else f"{100 * x:5.1f}"


def print_report(rep: dict) -> None:
    """The side-by-side summary, then each run's per-layer table."""
    print(f"{rep['checkpoint']}: {rep['steps']} steps, {rep['train_seconds']} s of training; "
          "held-out cross-entropy (nats/token): " + ", ".join(
              f"{d} {v['loss']:.3f}" for d, v in rep["validation"].items()))
    print("\nmeans over MoE layers (%; hot10: selections to the hottest 10% of experts, "
          "uniform 12.5 at E=16 and 32; entropy as % of log2 E; reuse: share of a token's "
          "experts the previous token selected; indep: that share without locality; "
          "recall: speculative selection one layer ahead)")
    print(f"{'run':26} {'tokens':>7} {'E/k':>6} {'hot10':>6} {'entropy':>8} {'reuse':>6} "
          f"{'indep':>6} {'recall':>7}")
    for name, run in rep["runs"].items():
        m = run["mean"]
        print(f"{name:26} {run['tokens']:7d} {run['experts']:3d}/{run['top_k']:<2d} "
              f"{_pct(m['hot10']):>6} {_pct(m['entropy_share']):>8} {_pct(m['reuse']):>6} "
              f"{_pct(m['reuse_independent']):>6} {_pct(m['spec_recall']):>7}")
    for name, run in rep["runs"].items():
        print(f"\n{name}: per MoE layer (recall with its 95% Wilson interval)")
        for row in run["layers"]:
            rec = row["spec_recall"]
            spec = "" if rec is None else f"  recall {_pct(rec[0])} [{_pct(rec[1])},{_pct(rec[2])}]"
            print(f"  layer {row['layer']:2d}  hot10 {_pct(row['hot10'])}  entropy "
                  f"{row['entropy_bits']:.2f} bits  reuse {_pct(row['reuse'])} "
                  f"(indep {_pct(row['reuse_independent'])}){spec}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("checkpoint", type=Path, help="directory train_moe.py wrote")
    p.add_argument("--traces", type=Path, help="trace set folder (default CHECKPOINT-traces)")
    p.add_argument("--gptoss", type=Path, default=GPTOSS, help="gpt-oss-20b decode routing")
    p.add_argument("--max-tokens", type=int, default=20000, help="tokens per held-out domain")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = p.parse_args(argv)
    if not (args.checkpoint / "training.json").is_file():
        p.error(f"checkpoint {args.checkpoint}: no training.json (train_moe.py writes it)")
    if not (args.gptoss / "config.json").is_file():
        p.error(f"--gptoss {args.gptoss}: no config.json (../shared/data/routing holds it)")
    traces = args.traces or args.checkpoint.with_name(args.checkpoint.name + "-traces")
    rep = report(args.checkpoint, traces, args.gptoss, args.max_tokens)
    if args.json:
        print(json.dumps(rep, indent=1))
    else:
        print_report(rep)
    return 0


if __name__ == "__main__":
    sys.exit(main())
