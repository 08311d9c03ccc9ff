"""Routing from other engines: one module per format, the registry and auto-detection.

| format        | module      | what it reads                                   | stored as       |
|---------------|-------------|-------------------------------------------------|-----------------|
| `counts`      | counts      | a MoE layers x experts matrix (.npy, .csv)      | counts          |
| `sglang`      | sglang      | SGLang expert-distribution recorder dumps (.pt) | rows or counts  |
| `sglang-http` | sglang_http | SGLang /generate responses with routed experts  | per-token rows  |
| `vllm`        | vllm        | vLLM `CompletionOutput.routed_experts` arrays   | per-token rows  |
| `imatrix`     | llamacpp    | llama.cpp `llama-imatrix` GGUF output           | counts          |
| `trtllm`      | trtllm      | TensorRT-LLM expert statistics directory        | rows or counts  |
| `tokens`      | tokens      | the plain form: expert_ids [tokens, layers, k]  | per-token rows  |

Per-token sources keep their sequences, positions and phases and carry the model's identity
(so they need `--model` or `--config`); count sources keep only counts (`counts.parquet`).
`import_routing` dispatches; `detect_format` picks the format of unambiguous sources: a
file that starts with the GGUF magic is an imatrix whatever its name (`llama-imatrix -o x.dat`
writes GGUF, `--save-frequency` writes `x.gguf.at_N`), and a `.dat` is taken for a legacy
imatrix, which its importer refuses saying how to re-run llama-imatrix.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from traces.errors import TraceError
from traces.importers import counts, llamacpp, sglang, sglang_http, tokens, trtllm, vllm
from traces.importers.common import ImportRequest
from traces.importers.npfiles import npy_ndim, npz_keys

Importer = Callable[[list[Path], Path, ImportRequest], Path]

FORMATS: dict[str, Importer] = {
    "counts": counts.import_matrix,
    "sglang": sglang.import_dumps,
    "sglang-http": sglang_http.import_http,
    "vllm": vllm.import_vllm,
    "imatrix": llamacpp.import_imatrix,
    "trtllm": trtllm.import_trtllm,
    "tokens": tokens.import_tokens,
}

# The files a directory source stands for, per format (trtllm reads the directory itself).
_DIR_GLOBS = {"sglang": ("*.pt",), "sglang-http": ("*.jsonl",), "vllm": ("*.npy", "*.npz"),
              "tokens": ("*.npz",), "imatrix": ("*.gguf", "*.dat", "*.at_*"),
              "counts": ("*.npy", "*.csv")}


def detect_format(source: Path) -> str:
    """The format of one source (file or directory), or a TraceError asking for --format."""
    source = Path(source)
    if not source.exists():
        raise TraceError(f"file not found: {source}")
    if source.is_dir():
        if (source / "meta_info.json").is_file() and any(source.glob("rank*.safetensors")):
            return "trtllm"
        if any(source.glob("*.pt")):
            return "sglang"
        raise TraceError(f"{source}: cannot tell the format of this directory (it is not a "
                         "TensorRT-LLM statistics directory, meta_info.json + "
                         "rank*.safetensors, nor holds SGLang .pt dumps); give --format")
    if llamacpp.is_gguf(source):
        return "imatrix"
    suffix = source.suffix.lower()
    if suffix == ".dat" or (suffix.startswith(".at_") and ".dat" in source.suffixes):
        return "imatrix"
    by_suffix = {".gguf": "imatrix", ".pt": "sglang", ".jsonl": "sglang-http", ".csv": "counts"}
    if suffix in by_suffix:
        return by_suffix[suffix]
    if suffix == ".npz":
        return "tokens" if "expert_ids" in npz_keys(source) else _ask(
            source, "an .npz without expert_ids (vLLM routed experts by request?)")
    if suffix == ".npy":
        if npy_ndim(source) != 3:  # the count reader names what else is wrong with it
            return "counts"
        return _ask(source, "a 3-D .npy (tokens and vllm both write them)")
    raise TraceError(f"{source}: unknown count or routing format {suffix!r}; give --format "
                     f"({', '.join(FORMATS)})")


def _ask(source: Path, why: str) -> str:
    raise TraceError(f"{source}: cannot tell the format from {why}; give --format "
                     f"({', '.join(FORMATS)})")


def expand(sources: list[Path], fmt: str) -> list[Path]:
    """The files (or, for trtllm, directories) that `sources` stand for in format `fmt`."""
    out: list[Path] = []
    for source in map(Path, sources):
        if not source.exists():
            raise TraceError(f"no such file or directory: {source}")
        if source.is_dir() and fmt != "trtllm":
            found = sorted({f for g in _DIR_GLOBS[fmt] for f in source.glob(g) if f.is_file()})
            if not found:
                raise TraceError(f"{source}: no {' or '.join(_DIR_GLOBS[fmt])} files for "
                                 f"format {fmt}")
            out.extend(found)
        else:
            out.append(source)
    return out


def resolve_format(sources: list[Path], fmt: str | None = None) -> str:
    """The format of `sources`: `fmt` checked, or (None) detected, every source agreeing."""
    if not sources:
        raise TraceError("no source given")
    if fmt is None:
        found = {detect_format(s) for s in sources}
        if len(found) > 1:
            raise TraceError(f"the sources look like different formats ({', '.join(sorted(found))})"
                             "; import them separately or give --format")
        fmt = found.pop()
    if fmt not in FORMATS:
        raise TraceError(f"--format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    return fmt


def import_routing(sources: list[Path], out_dir: Path, request: ImportRequest,
                   fmt: str | None = None) -> Path:
    """Import `sources` in format `fmt` (None: detected; resolve_format) into the empty
    `out_dir`; returns the written file."""
    fmt = resolve_format(sources, fmt)
    if request.prompt_lens is not None and fmt != "vllm":
        raise TraceError(f"--prompt-lens is for the vllm format, not {fmt} (which records "
                         "its own phases)")
    if request.prompt_start is not None and fmt not in ("vllm", "sglang-http"):
        raise TraceError(f"--prompt-start is for the vllm and sglang-http formats, not {fmt}")
    if request.load_balancer is not None and fmt != "trtllm":
        raise TraceError(f"--load-balancer is for the trtllm format, not {fmt}")
    return FORMATS[fmt](expand(sources, fmt), Path(out_dir), request)
