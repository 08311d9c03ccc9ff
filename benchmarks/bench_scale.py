"""`placer solve` at production trace sizes: peak memory and seconds as the tokens grow.

    .venv/bin/python benchmarks/bench_scale.py [--sizes 200000,800000,3200000] [--quick]
                                                [--keep DIR]

Model: DeepSeek-V3's shape (examples/deepseek-v3/config.json: 58 MoE layers x 256 experts,
top-8, MXFP4 experts); box: the `8x-rtx5090d-pcie5` preset; `--offload 0.5 --concurrency 1,8`
and solve's defaults otherwise (`--cache auto`; `--solver ilp` for the static candidate,
`--solver greedy` for benchmarks/bench_split.py's setting). Traffic:
`synthetic.deepseek_like` tokens (model seed 0), 100 tokens a sequence, made and imported in
pieces of 200k tokens (sample seed = the piece's index: independent samples of one traffic;
pieces past the second are copies of the first two under other sequence ids), so making the
traffic never holds more than one piece; a size of N tokens is a trace directory of hard
links to the first N / 200k pieces' files (`--quick`: pieces of 2k, sizes 2k and 8k).

Prints per size the wall seconds of `placer solve` (a child process; making and importing
the traffic is not counted), its peak resident memory (the child's maximum RSS), the
replay sample solve reports, and the seconds over what linear growth from the first size
would give. Targets (issue #53): peak under 4 GB at every size, seconds at most linear in the
tokens (ratio <= 1). The load average is printed beside the figures: seconds taken on a
loaded machine are not the target's.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_split import CONFIG, TOKENS_PER_SEQUENCE, placer, solve  # noqa: E402

PEAK_BAR_GB = 4.0
FRESH = 2  # pieces drawn afresh; later ones are copies under other sequence ids


def piece(root: Path, index: int, tokens: int) -> Path:
    """The trace file of piece `index` (`tokens` tokens), made and imported once; past the
    first FRESH pieces, a copy of piece index % FRESH under other sequence ids (drawing
    DeepSeek-like routing takes minutes a piece on two cores; a copy takes seconds)."""
    out = root / f"piece-{index}"
    if not out.exists() and index >= FRESH:
        return renumbered(piece(root, index % FRESH, tokens), out, index)
    if not out.exists():
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
        from synthetic import deepseek_like  # tests/synthetic.py

        seqs = tokens // TOKENS_PER_SEQUENCE
        selected, seq_ids = deepseek_like(58, 256, 8, num_tokens=tokens, num_seqs=seqs,
                                          seed=0, sample_seed=index)
        npz = root / f"piece-{index}.npz"
        np.savez(npz, expert_ids=selected.astype(np.int16),
                 seq_lens=np.bincount(seq_ids, minlength=seqs))
        del selected, seq_ids
        placer("traces", "import", npz, "--format", "tokens", "--config", CONFIG, "--out",
               out, "--tag", "synthetic")
        npz.unlink()
    (path,) = out.glob("*.parquet")
    return path


def renumbered(source: Path, out: Path, index: int) -> Path:
    """A copy of the trace file `source` in `out` whose sequences have other ids: the run
    part of each id (traces.storing.schema SEQ_ID_SHIFT) moved on by `index`."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from traces.storing.schema import SEQ_ID_SHIFT

    out.mkdir()
    target = out / f"copy{index}-{source.name}"
    reader = pq.ParquetFile(source)
    low = (1 << SEQ_ID_SHIFT) - 1
    with pq.ParquetWriter(target, reader.schema_arrow, compression="zstd") as writer:
        for batch in reader.iter_batches(batch_size=1 << 18):
            seq = batch.column("seq_id").to_numpy()
            run = ((seq >> SEQ_ID_SHIFT) + index) & 0x7FFFFFFF
            moved = (run << SEQ_ID_SHIFT) | (seq & low)
            columns = [pa.array(moved) if name == "seq_id" else batch.column(name)
                       for name in batch.schema.names]
            writer.write_batch(pa.RecordBatch.from_arrays(columns, schema=batch.schema))
    return target


def traffic(root: Path, tokens: int, per_piece: int) -> Path:
    """A trace directory of the first tokens / per_piece pieces (hard links)."""
    out = root / f"ds3-{tokens}"
    out.mkdir(exist_ok=True)
    for index in range(max(1, tokens // per_piece)):
        source = piece(root, index, per_piece)
        target = out / f"{index:03d}-{source.name}"
        if not target.exists():
            os.link(source, target)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="200000,800000,3200000",
                        help="tokens per run, comma-separated (multiples of the piece)")
    parser.add_argument("--quick", action="store_true", help="pieces of 2k, sizes 2k and 8k")
    parser.add_argument("--keep", type=Path, default=None,
                        help="make (or reuse) the traffic in this directory and keep it")
    parser.add_argument("--solver", default="ilp", help="the static candidate's solver "
                        "(default ilp, solve's own default, 60 s limit; greedy: bench_split's)")
    args = parser.parse_args()
    per_piece = 2_000 if args.quick else 200_000
    sizes = (2_000, 8_000) if args.quick else tuple(int(s) for s in args.sizes.split(","))
    print(f"solve --solver {args.solver}, DeepSeek-V3 shape, 8x-rtx5090d-pcie5, --offload "
          f"0.5, B = 1, 8 (load "
          f"average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores at the start)")
    with tempfile.TemporaryDirectory(prefix="bench-scale-") as tmp:
        root = args.keep or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        first = None
        for tokens in sizes:
            seconds, peak, plan = solve(root, traffic(root, tokens, per_piece),
                                        solver=args.solver)
            first = first or (tokens, seconds)
            linear = first[1] * tokens / first[0]
            sample = [c.get("replay_sample") for c in plan["calibration"]]
            said = ("every token replayed" if not any(sample) else
                    "; ".join(f"replayed {s['tokens']:,} tokens of {s['sequences']:,} whole "
                              f"sequences (of {s['of_tokens']:,} tokens, seed {s['seed']})"
                              for s in sample if s))
            print(f"  {tokens:9,d} tokens: {seconds:7.1f} s ({seconds / linear:.2f}x linear "
                  f"from {first[0]:,}), peak {peak:.2f} GB "
                  f"({'PASS' if peak < PEAK_BAR_GB else 'MISS'}, bar < {PEAK_BAR_GB:g} GB); "
                  f"{said}; load average {os.getloadavg()[0]:.1f}", flush=True)


if __name__ == "__main__":
    main()
