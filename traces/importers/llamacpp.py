"""llama.cpp `llama-imatrix` output (GGUF) as expert counts.

Read from llama.cpp 0c1e57098bba43ac29e6e3b677cdceebdd22334f (vendored in llama-cpp-python
0.3.36), `tools/imatrix/imatrix.cpp`:

- `save_imatrix` writes a GGUF with `general.type = "imatrix"` (string), `imatrix.datasets`
  (array of strings), `imatrix.chunk_count` and `imatrix.chunk_size` (uint32: the chunks
  evaluated so far and `-c`, default 512), and per weight NAME two F32 tensors,
  `NAME.in_sum2` (ne [n_embd_in, n_mat]) and `NAME.counts` (ne [1, n_mat]; gguf-py's numpy
  shape is the reverse, (n_mat, 1)). There is no `NAME.in_sum`.
- The file is GGUF whatever its name: `-o x.dat` writes GGUF too (with a warning), and
  `--save-frequency N` writes snapshots `x.gguf.at_N`. So placer tells GGUF by its first four
  bytes, `GGUF` (`ggml/include/gguf.h` GGUF_MAGIC), as llama.cpp's own loader does. Only
  `--output-format dat` writes the legacy format: per tensor one call count and values already
  divided by each expert's count, no per-expert counts, so it is refused with how to re-run.
- `collect_imatrix` adds 1 to `counts[e]` for every (token, slot) whose router picked expert
  e, per GGML_OP_MUL_MAT_ID: for an expert tensor `blk.L.ffn_{gate,up,down,gate_up}_exps.weight`
  (n_mat = n_expert) the counts are the selections of each expert at block L, which is
  decoder layer L. The tensors of a layer see the same ids; the first present of gate,
  gate_up, up, down is read.

Totals: every chunk is chunk_size tokens that every MoE block routes, so a finished file has
`sum_e counts[L][e] == chunk_count * chunk_size * k` at every MoE block. placer checks the
blocks agree and are whole multiples of k, and refuses a file that counts more tokens than
chunk_count + 1 chunks hold (counts merged from a converted legacy file, whose single count
is broadcast to every expert, or a wrong top-k). Fewer tokens are accepted and noted, not
refused: a snapshot (`.at_N`, or the main file rewritten every `--output-frequency` chunks
by a run that did not finish) is written from inside the chunk's last ubatch, before later
blocks saw it, and `chunk_count` itself lags by a chunk when a chunk's last ubatch has fewer
than 16 tokens (dense tensors skip those); neither biases the per-expert frequencies.

Limits: llama-imatrix only runs prompt processing (perplexity-style chunks), so these counts
are prefill routing, never decode; counts are stored as F32 (exact up to 2**24 selections
per expert).
"""

from __future__ import annotations

import re
import struct
from pathlib import Path

import numpy as np

from traces.errors import TraceError
from traces.importers.common import ImportRequest
from traces.importers.counts import resolve_top_k, write_counts

FORMAT = "imatrix"
GGUF_MAGIC = b"GGUF"
EXPERT_TENSORS = ("ffn_gate_exps", "ffn_gate_up_exps", "ffn_up_exps", "ffn_down_exps")
# ASCII digits and the exact name (\Z: $ also matches before a final newline), as llama.cpp
# names these tensors (blk.%d.NAME.weight, with llama-imatrix's ".counts").
_COUNTS = re.compile(r"blk\.([0-9]+)\.(" + "|".join(EXPERT_TENSORS) + r")\.weight\.counts\Z")
_SNAPSHOT = re.compile(r"\.at_\d+$")
MAX_COUNTS = 4 << 15  # bytes of one counts tensor: 2**15 experts (traces' int16 ids), F32
NOTE = "llama-imatrix counts come from prompt processing only (prefill), never decode"
LEGACY = ("is a legacy llama-imatrix .dat file: it keeps one call count per tensor and no "
          "per-expert counts; re-run llama-imatrix with -o FILE.gguf (or --output-format "
          "gguf) and import that")


def is_gguf(path: Path) -> bool:
    """Whether the file at `path` starts with the GGUF magic (any name or suffix)."""
    try:
        with Path(path).open("rb") as f:
            return f.read(4) == GGUF_MAGIC
    except OSError:
        return False


def is_legacy_imatrix(path: Path) -> bool:
    """Whether `path` starts as `save_imatrix_legacy` writes: int32 entries > 0, then the first
    entry's int32 name length and an ASCII tensor name."""
    try:
        with Path(path).open("rb") as f:
            head = f.read(8 + 256)
    except OSError:
        return False
    if len(head) < 8:
        return False
    entries, length = struct.unpack("<ii", head[:8])
    name = head[8:8 + length]
    return (0 < entries < 1 << 20 and 0 < length <= 256 and len(name) == length
            and name.isascii() and name.decode().isprintable())


def read_imatrix(path: Path) -> tuple[dict[int, np.ndarray], dict]:
    """({decoder layer: [n_expert] int64 selections}, {chunk_count, chunk_size, datasets})."""
    path = Path(path)
    if not is_gguf(path):
        if is_legacy_imatrix(path):
            raise TraceError(f"{path} {LEGACY}")
        raise TraceError(f"{path}: not a GGUF file (no GGUF magic) nor a legacy imatrix; "
                         "expected llama-imatrix output")
    from traces.formats.gguf_header import Skipped, read_gguf_header  # only an imatrix loads gguf

    header = read_gguf_header(path, TraceError)
    fields = header.fields
    if fields.get("general.type") != "imatrix":
        raise TraceError(f"{path}: general.type is {fields.get('general.type')!r}, expected "
                         "'imatrix' (a llama-imatrix GGUF output)")
    found: dict[int, dict[str, np.ndarray]] = {}
    with path.open("rb") as f:
        for tensor in header.tensors:
            match = _COUNTS.match(tensor.name)
            if match:
                if tensor.ne[:1] != (1,) or len(tensor.ne) > 2 or tensor.nbytes > MAX_COUNTS:
                    raise TraceError(f"{path}: {tensor.name} has ggml ne {list(tensor.ne)}, "
                                     f"expected [1, n_expert] (at most {MAX_COUNTS // 4})")
                if tensor.type_name != "F32":
                    raise TraceError(f"{path}: {tensor.name} is {tensor.type_name}, expected "
                                     "F32 counts")
                f.seek(tensor.offset)  # inside the file: read_gguf_header checked it
                counts = np.frombuffer(f.read(tensor.nbytes), dtype="<f4")
                found.setdefault(int(match[1]), {})[match[2]] = counts
    if not found:
        raise TraceError(f"{path}: no blk.L.ffn_*_exps.weight.counts tensor (expected the "
                         "expert tensors of a MoE model)")
    layers = {}
    for layer, tensors in sorted(found.items()):
        name = next(t for t in EXPERT_TENSORS if t in tensors)
        counts = tensors[name].ravel()
        if counts.size < 2 or not np.all(np.isfinite(counts)) or np.any(counts < 0) \
                or np.any(counts != np.round(counts)):
            raise TraceError(f"{path}: blk.{layer}.{name}.weight.counts holds "
                             f"{counts.size} values, expected non-negative whole counts, one "
                             "per expert (a single count comes from a legacy .dat converted "
                             "or merged with --in-file)")
        layers[layer] = counts.astype(np.int64)
    info = {key.split(".")[1]: str(v) if isinstance(v := fields.get(key), Skipped) else v
            for key in ("imatrix.chunk_count", "imatrix.chunk_size", "imatrix.datasets")}
    return layers, info


def counted_tokens(path: Path, layers: dict[int, np.ndarray], info: dict, k: int
                   ) -> tuple[int, str | None]:
    """(Tokens every MoE block routed, a note where they are not chunk_count x chunk_size),
    or a TraceError where the totals cannot be one run's (module docstring)."""
    totals = {layer: int(c.sum()) for layer, c in layers.items()}
    if len(set(totals.values())) > 1:
        raise TraceError(f"{path}: MoE blocks counted different totals {totals}; every block "
                         "routes every token, so the file is not one llama-imatrix run")
    total = next(iter(totals.values()))
    if total % k:
        raise TraceError(f"{path}: {total} selections per MoE block is not a multiple of "
                         f"top-k {k}: is k right?")
    tokens = total // k
    chunks, size = info.get("chunk_count"), info.get("chunk_size")
    if not isinstance(chunks, int) or not isinstance(size, int) or size < 1:
        return tokens, None
    if tokens > (chunks + 1) * size:
        raise TraceError(f"{path}: counts of {tokens} tokens (top-k {k}) but imatrix.chunk_count "
                         f"{chunks} x chunk_size {size} = {chunks * size}: counts merged from a "
                         "legacy .dat, or another top-k")
    if tokens == chunks * size:
        return tokens, None
    kind = "a snapshot" if _SNAPSHOT.search(path.name) else "a snapshot or an unfinished run"
    return tokens, (f"counts cover {tokens} tokens, chunk_count x chunk_size = "
                    f"{chunks * size} ({kind}: written before the last chunk's tokens reached "
                    "every block)")


def import_imatrix(paths: list[Path], out_dir: Path, request: ImportRequest) -> Path:
    """`placer traces import --format imatrix`: one imatrix GGUF as a count profile."""
    if len(paths) != 1:
        raise TraceError(f"give one imatrix GGUF ({len(paths)} files given)")
    path = Path(paths[0])
    layers, info = read_imatrix(path)
    widths = {len(c) for c in layers.values()}
    if len(widths) > 1:
        raise TraceError(f"{path}: expert counts of different lengths {sorted(widths)}")
    identity = request.identity
    if identity is not None:
        if tuple(layers) != tuple(identity.moe_layers):
            raise TraceError(f"{path}: expert counts at blocks {list(layers)}, expected the "
                             f"model's MoE layers {list(identity.moe_layers)}")
        if widths != {identity.experts_per_layer}:
            raise TraceError(f"{path}: {widths.pop()} experts per layer, expected the "
                             f"model's {identity.experts_per_layer}")
    k = resolve_top_k(request, path)
    tokens, lag = counted_tokens(path, layers, info, k)
    if request.tokens is not None and request.tokens != tokens:
        raise TraceError(f"--tokens {request.tokens}: the file counts {tokens} tokens")
    note = NOTE if lag is None else f"{NOTE}; {lag}"
    return write_counts(np.stack(list(layers.values())), out_dir, top_k=k,
                        tag=request.tag or Path(_SNAPSHOT.sub("", path.name)).stem, tokens=tokens,
                        sources=[path], decoder_layers=list(layers),
                        extra={"format": FORMAT, "phases": "prefill", "note": note, **info})
