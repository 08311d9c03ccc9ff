"""Train a small Qwen3-MoE here, on real text, for routing that a trained router produces
(issue #54 item 5): random-init models route nothing like a trained one.

    .venv/bin/python benchmarks/train_moe.py --out DIR [--minutes M] [--steps N]
        [--layers 6 --experts 16 --top-k 2 --hidden 128 ...] [--data ../shared/data]

Builds a transformers `qwen3_moe` (placer.checkpoint.tiny's config, sized by the options),
trains a byte-level BPE tokenizer on the training split (placer.checkpoint.tiny's, seeded by
its input order), and trains the model with AdamW on the mixed corpus of
benchmarks/moe_corpus.py (prose, code, chat; held-out documents apart by whole document),
with the router's load-balancing loss on (`output_router_logits`, `router_aux_loss_coef`).
Each step takes `--batch` windows of `--seq-len` tokens, each from one domain drawn with the
`--mix` weights at a random offset of that domain's token stream (torch generator seeded by
`--seed`, 2 threads: two runs with the same options and `--steps` give byte-identical
weights). It stops after `--steps` or `--minutes`, whichever comes first (`training.json`
says which).

DIR gets what `placer collect --model DIR` reads (config.json, model.safetensors stored as
`--save-dtype`, tokenizer files), `heldout/{prose,code,chat}.jsonl` (the held-out documents
as collect corpora) and `training.json`: the corpus's sources, licenses, sizes and digests,
the options, steps, wall time, library versions, the loss curve and each domain's
held-out cross-entropy (nats per token, over at most `--eval-windows` windows: a point
estimate on one split, no interval) before and after training. DIR is written whole or not
at all. benchmarks/moe_routing.py reports the trained model's routing against gpt-oss's.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import platform
import shutil
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.moe_corpus import (  # noqa: E402
    DOMAINS,
    Document,
    load_documents,
    provenance,
    split_documents,
    write_heldout,
)

DATA = REPO.parent / "shared" / "data"
THREADS = 2


@dataclass(frozen=True)
class TrainOptions:
    """Everything that decides the trained weights (and the budget that may cut it short)."""

    layers: int = 6
    experts: int = 16
    top_k: int = 2
    hidden: int = 128
    moe_intermediate: int = 128
    vocab: int = 4096
    seq_len: int = 256
    batch: int = 16
    steps: int = 2000
    minutes: float = 60.0
    lr: float = 2e-3
    warmup: int = 50
    weight_decay: float = 0.1
    aux_coef: float = 0.01
    seed: int = 0
    code_chars: int = 2_000_000
    every: int = 10
    eval_windows: int = 32
    log_every: int = 10
    save_dtype: str = "bfloat16"
    mix: dict[str, float] = field(default_factory=lambda: {"prose": 0.45, "code": 0.45,
                                                           "chat": 0.10})


def build_model(opts: TrainOptions):
    """A fresh qwen3_moe of `opts`' size, initialised from `opts.seed`."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from placer.checkpoint.tiny import _config_kwargs

    kwargs = _config_kwargs("qwen3_moe", opts.layers, opts.experts, opts.top_k, opts.hidden,
                            opts.vocab)
    kwargs.update(moe_intermediate_size=opts.moe_intermediate,
                  max_position_embeddings=max(512, opts.seq_len),
                  output_router_logits=True, router_aux_loss_coef=opts.aux_coef)
    torch.manual_seed(opts.seed)
    return AutoModelForCausalLM.from_config(AutoConfig.for_model("qwen3_moe", **kwargs))


def token_streams(docs: list[Document], tokenizer) -> dict[str, list[int]]:
    """Per domain, its documents' token ids in order, each followed by </s>; chat documents
    through the chat template as `placer collect` renders a `turns` line."""
    streams: dict[str, list[int]] = {d: [] for d in DOMAINS}
    for doc in docs:
        if doc.turns:
            text = tokenizer.apply_chat_template(
                [{"role": "user", "content": t} for t in doc.turns], tokenize=False)
        else:
            text = doc.text
        streams[doc.domain] += tokenizer(text, add_special_tokens=False)["input_ids"]
        streams[doc.domain].append(tokenizer.eos_token_id)
    return streams


def sample_batch(streams: dict, opts: TrainOptions, gen):
    """[batch, seq_len] windows, each from a domain drawn by `opts.mix`."""
    import torch

    names = [d for d in DOMAINS if opts.mix.get(d, 0) > 0]
    weights = torch.tensor([opts.mix[d] for d in names], dtype=torch.float64)
    picks = torch.multinomial(weights, opts.batch, replacement=True, generator=gen)
    rows = []
    for pick in picks.tolist():
        stream = streams[names[pick]]
        start = int(torch.randint(0, len(stream) - opts.seq_len, (1,), generator=gen))
        rows.append(stream[start:start + opts.seq_len])
    return rows


def evaluate(model, streams: dict, opts: TrainOptions) -> dict[str, dict]:
    """Per domain: mean cross-entropy (nats/token, router loss off) over the first
    `opts.eval_windows` non-overlapping windows of its held-out stream."""
    import torch

    model.eval()
    out = {}
    with torch.no_grad():
        for domain, stream in streams.items():
            span = min(opts.seq_len, len(stream) - 1)
            windows = [stream[i:i + span] for i in range(0, len(stream) - span + 1, span)]
            windows = windows[:opts.eval_windows]
            total = 0.0
            for i in range(0, len(windows), opts.batch):
                ids = torch.tensor(windows[i:i + opts.batch])
                loss = model(input_ids=ids, labels=ids, output_router_logits=False).loss
                total += float(loss) * len(ids)
            out[domain] = {"loss": round(total / len(windows), 4),
                           "tokens": len(windows) * span, "windows": len(windows)}
    model.train()
    return out


def check_streams(train: dict, held: dict, opts: TrainOptions) -> None:
    """ValueError naming the first domain too small to train (longer than a window) or to
    score (two tokens held out)."""
    for domain in DOMAINS:
        if opts.mix.get(domain, 0) > 0 and len(train[domain]) <= opts.seq_len:
            raise ValueError(f"--mix {domain}: its training split has {len(train[domain])} "
                             f"tokens, not more than --seq-len {opts.seq_len}")
        if len(held[domain]) < 2:
            raise ValueError(f"{domain}: no held-out tokens (every --every-th document is "
                             "held out; give more text)")


def learning_rate(step: int, opts: TrainOptions) -> float:
    """Linear warm-up, then cosine down to a tenth over `opts.steps`."""
    if step < opts.warmup:
        return opts.lr * (step + 1) / opts.warmup
    progress = min(1.0, (step - opts.warmup) / max(1, opts.steps - opts.warmup))
    return opts.lr * (0.1 + 0.45 * (1 + math.cos(math.pi * progress)))


def train(model, streams: dict, opts: TrainOptions) -> dict:
    """AdamW steps until `opts.steps` or `opts.minutes`; the curve, steps and how it ended."""
    import torch

    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    rest = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": opts.weight_decay},
                             {"params": rest, "weight_decay": 0.0}], lr=opts.lr,
                            betas=(0.9, 0.95))
    gen = torch.Generator().manual_seed(opts.seed)
    curve, start, step = [], time.monotonic(), 0
    stopped_by = "steps"
    model.train()
    for step in range(opts.steps):
        if time.monotonic() - start > opts.minutes * 60:
            stopped_by = "minutes"
            break
        for group in opt.param_groups:
            group["lr"] = learning_rate(step, opts)
        ids = torch.tensor(sample_batch(streams, opts, gen))
        out = model(input_ids=ids, labels=ids, output_router_logits=True)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step % opts.log_every == 0 or step == opts.steps - 1:
            aux = float(out.aux_loss.detach())
            cross_entropy = float(out.loss.detach()) - opts.aux_coef * aux
            curve.append({"step": step, "loss": round(cross_entropy, 4),
                          "aux_loss": round(aux, 4),
                          "seconds": round(time.monotonic() - start, 1)})
            if step % (10 * opts.log_every) == 0:
                print(f"step {step}: training loss {curve[-1]['loss']:.3f} nats/token, "
                      f"aux {aux:.3f}, {time.monotonic() - start:.0f} s", file=sys.stderr,
                      flush=True)
    else:
        step = opts.steps
    return {"steps": step, "stopped_by": stopped_by, "curve": curve,
            "train_seconds": round(time.monotonic() - start, 1)}


def _versions() -> dict:
    import tokenizers
    import torch
    import transformers

    return {"python": platform.python_version(), "torch": torch.__version__,
            "transformers": transformers.__version__, "tokenizers": tokenizers.__version__,
            "threads": THREADS}


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def train_moe(out: Path, opts: TrainOptions, data_dir: Path = DATA,
              stdlib: Path | None = None) -> dict:
    """Train and write the checkpoint directory `out` (whole or not at all); training.json."""
    import torch
    from transformers import PreTrainedTokenizerFast

    from placer.checkpoint.tiny import train_tokenizer

    torch.set_num_threads(THREADS)
    docs = load_documents(data_dir, opts.code_chars, stdlib)
    train_docs, held = split_documents(docs, opts.every)
    tmp = out.with_name(f".{out.name}.partial-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        train_tokenizer((d.text for d in train_docs), tmp, opts.vocab)
        tokenizer = PreTrainedTokenizerFast.from_pretrained(tmp)
        train_streams = token_streams(train_docs, tokenizer)
        held_streams = token_streams(held, tokenizer)
        check_streams(train_streams, held_streams, opts)
        model = build_model(opts)
        before = evaluate(model, held_streams, opts)
        run = train(model, train_streams, opts)
        after = evaluate(model, held_streams, opts)
        model.to(getattr(torch, opts.save_dtype)).save_pretrained(tmp)
        write_heldout(held, tmp / "heldout")
        weights = tmp / "model.safetensors"
        record = {
            "what": "a qwen3_moe trained here by benchmarks/train_moe.py (issue #54 item 5)",
            "options": asdict(opts), "corpus": provenance(docs, held),
            "tokens": {"train": {d: len(s) for d, s in train_streams.items()},
                       "heldout": {d: len(s) for d, s in held_streams.items()}},
            "parameters": sum(p.numel() for p in model.parameters()),
            "weights": {"file": weights.name, "bytes": weights.stat().st_size,
                        "sha256": _sha256(weights)},
            **{k: v for k, v in run.items() if k != "curve"},
            "validation_before": before, "validation": after,
            "versions": _versions(), "curve": run["curve"],
        }
        (tmp / "training.json").write_text(json.dumps(record, indent=1) + "\n")
        os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return record


def parse_args(argv: list[str] | None = None) -> tuple[Path, TrainOptions, Path]:
    """(out, options, data dir) from the command line."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="checkpoint directory to write")
    p.add_argument("--data", type=Path, default=DATA,
                   help="folder with shakespeare.txt and the bench questions")
    defaults = TrainOptions()
    for name, value in asdict(defaults).items():
        if name != "mix":
            p.add_argument("--" + name.replace("_", "-"), type=type(value), default=value)
    p.add_argument("--mix", default="prose=0.45,code=0.45,chat=0.10",
                   help="domain weights, e.g. prose=0.45,code=0.45,chat=0.10")
    args = vars(p.parse_args(argv))
    out, data = args.pop("out"), args.pop("data")
    try:
        mix = {k: float(v) for k, v in (kv.split("=") for kv in args.pop("mix").split(","))}
    except ValueError:
        p.error("--mix: expected DOMAIN=WEIGHT[,DOMAIN=WEIGHT...]")
    if set(mix) - set(DOMAINS) or sum(mix.values()) <= 0:
        p.error(f"--mix: domains are {', '.join(DOMAINS)}, weights not all zero")
    if out.exists():
        p.error(f"--out {out}: exists; give a new directory")
    if not (data / "shakespeare.txt").is_file():
        p.error(f"--data {data}: no shakespeare.txt there (../shared/data holds it)")
    return out, TrainOptions(**args, mix=mix), data


def main(argv: list[str] | None = None) -> int:
    out, opts, data = parse_args(argv)
    try:
        record = train_moe(out, opts, data)
    except ValueError as exc:
        print(f"train_moe.py: {exc}", file=sys.stderr)
        return 2
    print(f"{out}: {record['steps']} steps in {record['train_seconds']} s "
          f"(stopped by {record['stopped_by']}), {record['parameters']:,} parameters, "
          f"{record['weights']['bytes']:,} bytes of weights ({opts.save_dtype})")
    print("held-out cross-entropy, nats/token (one split, no interval): "
          + ", ".join(f"{d} {record['validation_before'][d]['loss']:.3f} -> "
                      f"{v['loss']:.3f} over {v['tokens']} tokens"
                      for d, v in record["validation"].items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
