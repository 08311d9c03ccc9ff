"""Reading a GGUF model's inventory against the `gguf` package's own reader, same file.

    .venv/bin/python benchmarks/bench_gguf.py [--quick] [--repeats 3]

Writes the header of a Qwen3-30B-A3B Q4_K_M-shaped GGUF (48 MoE layers of 128 experts,
hidden 2048, expert FFN 768: gate and up Q4_K, down Q6_K, attention and norms; a vocabulary
of 151,936 tokens, their types and 151,387 merges, as llama.cpp's converter writes them) with
gguf's GGUFWriter, then extends the file to its full 17 GB as a sparse file (no disk used: the
data section is never read by either reader). Times, interleaved `--repeats` times, medians:

- `placer inspect`'s work, `read_inventory(model.gguf)` (placer/checkpoint/gguf.py through the
  bounded header reader traces/formats/gguf_header.py: every expert's byte ranges);
- `gguf.GGUFReader(model.gguf)` (header, tensor infos and a memory map; no inventory).

Ratio: GGUFReader's time over placer's (target >= 5: placer walks the tokenizer arrays
without decoding them). `--quick`: a vocabulary of 20,000.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader, GGUFWriter

from placer.checkpoint.inventory import read_inventory

T = GGMLQuantizationType
LAYERS, EXPERTS, TOP_K, HIDDEN, FF, HEADS, KV_HEADS, HEAD_DIM = 48, 128, 8, 2048, 768, 32, 4, 128
TARGET = 5.0


def nbytes(kind: GGMLQuantizationType, shape: tuple[int, ...]) -> int:
    block, size = GGML_QUANT_SIZES[kind]
    return int(np.prod(shape)) // block * size


def write_model(path: Path, vocab: int) -> None:
    """The header of the model (module docstring) at `path`, its data section sparse."""
    writer = GGUFWriter(path, "qwen3moe")
    writer.add_block_count(LAYERS)
    writer.add_embedding_length(HIDDEN)
    writer.add_expert_count(EXPERTS)
    writer.add_expert_used_count(TOP_K)
    writer.add_expert_feed_forward_length(FF)
    writer.add_token_list([f"token{i}" for i in range(vocab)])
    writer.add_token_types([1] * vocab)
    writer.add_token_merges([f"a{i} b{i}" for i in range(vocab - 549)])
    tensors = [("token_embd.weight", (vocab, HIDDEN), T.Q4_K),
               ("output.weight", (vocab, HIDDEN), T.Q6_K), ("output_norm.weight", (HIDDEN,), T.F32)]
    for layer in range(LAYERS):
        b = f"blk.{layer}"
        tensors += [(f"{b}.attn_norm.weight", (HIDDEN,), T.F32),
                    (f"{b}.attn_q.weight", (HEADS * HEAD_DIM, HIDDEN), T.Q4_K),
                    (f"{b}.attn_k.weight", (KV_HEADS * HEAD_DIM, HIDDEN), T.Q4_K),
                    (f"{b}.attn_v.weight", (KV_HEADS * HEAD_DIM, HIDDEN), T.Q6_K),
                    (f"{b}.attn_output.weight", (HIDDEN, HEADS * HEAD_DIM), T.Q4_K),
                    (f"{b}.attn_q_norm.weight", (HEAD_DIM,), T.F32),
                    (f"{b}.attn_k_norm.weight", (HEAD_DIM,), T.F32),
                    (f"{b}.ffn_norm.weight", (HIDDEN,), T.F32),
                    (f"{b}.ffn_gate_inp.weight", (EXPERTS, HIDDEN), T.F32),
                    (f"{b}.ffn_gate_exps.weight", (EXPERTS, FF, HIDDEN), T.Q4_K),
                    (f"{b}.ffn_up_exps.weight", (EXPERTS, FF, HIDDEN), T.Q4_K),
                    (f"{b}.ffn_down_exps.weight", (EXPERTS, HIDDEN, FF), T.Q6_K)]
    end = 0
    for name, shape, kind in tensors:
        size = nbytes(kind, shape)
        writer.add_tensor_info(name, shape, np.dtype(np.float32), size, raw_dtype=kind)
        end += GGUFWriter.ggml_pad(size, writer.data_alignment)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    writer.close()
    with path.open("r+b") as f:
        start = GGUFWriter.ggml_pad(f.seek(0, 2), writer.data_alignment)
        f.truncate(start + end)


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a vocabulary of 20,000")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    vocab = 20_000 if args.quick else 151_936
    with tempfile.TemporaryDirectory(dir=".") as tmp:
        path = Path(tmp) / "model.gguf"
        write_model(path, vocab)
        inv = read_inventory(path)
        print(f"{path.name}: {path.stat().st_size / 1e9:.1f} GB (sparse), "
              f"{len(inv.moe_layers)} MoE layers x {inv.experts_per_layer} experts of "
              f"{int(inv.expert_bytes()[0, 0])} B, vocabulary {vocab}")
        ours, theirs = [], []
        for _ in range(args.repeats):
            ours.append(timed(lambda: read_inventory(path)))
            theirs.append(timed(lambda: GGUFReader(path)))
    a, b = statistics.median(ours), statistics.median(theirs)
    ratio = b / a
    print(f"placer read_inventory: {a:.3f} s   gguf GGUFReader: {b:.3f} s   "
          f"ratio {ratio:.1f} (target >= {TARGET})")
    if ratio < TARGET:
        raise SystemExit(f"below target: {ratio:.1f} < {TARGET}")


if __name__ == "__main__":
    main()
