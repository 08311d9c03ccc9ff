"""The inventory of a GGUF model (llama.cpp): read from its tensor infos, never the data.

Tensor and key names are llama.cpp's, as the `gguf` package (gguf-py 0.19.0, `constants.py`:
MODEL_TENSOR / TENSOR_NAMES, Keys.LLM, Keys.Split) spells them:

- routed experts are fused, one tensor per projection and layer: `blk.N.ffn_gate_exps`,
  `ffn_up_exps`, `ffn_down_exps` or `ffn_gate_up_exps`, with suffix `.weight` (and `.bias`,
  `.scale`, `.input_scale` where an architecture has them, e.g. gpt-oss's biases), exactly
  (EXPERT_SUFFIXES: any other name that starts like one is refused, as llama.cpp refuses
  it; a name holding a NUL byte is refused by the header reader). ggml's
  ne[] lists dimensions innermost first and every model file of llama.cpp creates these with
  the expert outermost (`{n_embd, n_ff_exp, n_expert}`, `src/models/*.cpp` at
  ggml-org/llama.cpp 0c1e57098bba43ac29e6e3b677cdceebdd22334f), so the row-major shape is ne
  reversed, (n_expert, ...), and expert E is the contiguous byte range
  [E * n, (E + 1) * n) of the tensor's n * n_expert bytes, whatever its ggml type: a quant
  block never crosses a row, since a row is a whole number of blocks;
- shared experts (`ffn_*_shexp`), chunk experts (`ffn_*_chexps`), routers and the rest are
  dense;
- `general.architecture` names the architecture; `<arch>.block_count`, `<arch>.expert_count`,
  `<arch>.expert_used_count` (top-k), `<arch>.expert_shared_count` give the shape; the last
  `<arch>.nextn_predict_layers` blocks are multi-token-prediction blocks that llama.cpp does
  not load unless asked (TENSOR_SKIP, `src/models/glm4-moe.cpp`, `deepseek2.cpp`): they are
  left out, so the model's layers are the trunk's, as a trace recorded through llama.cpp
  sees them;
- split files (`llama-gguf-split`): `split.no`, `split.count`, `split.tensors.count` in every
  part, named `PREFIX-%05d-of-%05d.gguf` (`llama_split_path`, `src/llama.cpp`); the first part
  holds the metadata; tensor offsets are per part.

The fingerprint hashes `general.architecture`, every `<arch>.*` key and every tensor's name,
ggml type and shape, so a model split into parts keeps the fingerprint of the whole file, and
a trace recorded from the GGUF (`placer collect --gguf`) carries the GGUF's fingerprint.
"""

from __future__ import annotations

import re
from pathlib import Path

from gguf.constants import MODEL_TENSOR, TENSOR_NAMES, Keys

from placer.checkpoint.config import MAX_COUNT
from placer.checkpoint.experts import (
    DenseTensor,
    ExpertRanges,
    Inventory,
    SourceFile,
    TensorRange,
    assemble,
    sort_tensors,
)
from placer.errors import PlacerError
from traces.formats.gguf_header import GGUFHeader, Skipped, TensorInfo, read_gguf_header

_PREFIX = "blk.{bid}."
# Routed expert tensors (fused, the expert outermost), named as gguf-py names them.
_EXPERT_NAMES = [TENSOR_NAMES[t].removeprefix(_PREFIX) for t in (
    MODEL_TENSOR.FFN_GATE_EXP, MODEL_TENSOR.FFN_UP_EXP, MODEL_TENSOR.FFN_DOWN_EXP,
    MODEL_TENSOR.FFN_GATE_UP_EXP)]
_SHARED_NAMES = [TENSOR_NAMES[t].removeprefix(_PREFIX) for t in (
    MODEL_TENSOR.FFN_GATE_SHEXP, MODEL_TENSOR.FFN_UP_SHEXP, MODEL_TENSOR.FFN_DOWN_SHEXP)]
# The suffixes llama.cpp loads a routed expert tensor under, `tn(LLM_TENSOR_FFN_*_EXPS,
# SUFFIX, i)` (LLM_TN_IMPL::str appends "." SUFFIX, src/llama-arch.cpp), read in ggml-org/
# llama.cpp 0c1e57098bba43ac29e6e3b677cdceebdd22334f (the tree llama-cpp-python 0.3.36
# vendors): "weight" everywhere, "bias" (src/models/openai-moe.cpp), "scale" and
# "input_scale" (src/llama-model.cpp, per-expert scales). llama.cpp finds a tensor by that exact
# name and refuses a file with a tensor it did not load (`done_getting_tensors`: wrong
# number of tensors), so `blk.1.ffn_up_exps.weightx` is no tensor of a model it runs.
EXPERT_SUFFIXES = ("weight", "bias", "scale", "input_scale")
# Layer indices are ASCII decimals (read_gguf_header refuses any other: block_index); \Z,
# not $, which also matches before a final newline.
EXPERT_TENSOR = re.compile(r"blk\.(?P<layer>[0-9]+)\.(?P<base>" + "|".join(_EXPERT_NAMES)
                           + r")\.(?P<suffix>" + "|".join(EXPERT_SUFFIXES) + r")\Z")
EXPERT_LIKE = re.compile(r"blk\.[0-9]+\.(?:" + "|".join(_EXPERT_NAMES) + r")(?:\.|\Z)")
SHARED_TENSOR = re.compile(r"^blk\.[0-9]+\.(?:" + "|".join(_SHARED_NAMES) + r")\.")
BLOCK = re.compile(r"^blk\.([0-9]+)\.")
SPLIT_NAME = re.compile(r"^(?P<prefix>.+)-(?P<no>[0-9]{5})-of-(?P<count>[0-9]{5})\.gguf$")
SPLIT_KEYS = (Keys.Split.LLM_KV_SPLIT_NO, Keys.Split.LLM_KV_SPLIT_COUNT,
              Keys.Split.LLM_KV_SPLIT_TENSORS_COUNT)


def read_gguf_inventory(path: Path) -> Inventory:
    """The inventory of the GGUF model at `path` (the first part of a split model reads all
    of its parts)."""
    path = Path(path)
    parts = read_parts(path)
    fields = parts[0].fields
    arch = _string(path, fields, Keys.General.ARCHITECTURE)
    blocks = _count(path, fields, Keys.LLM.BLOCK_COUNT.format(arch=arch))
    nextn_key = Keys.LLM.NEXTN_PREDICT_LAYERS.format(arch=arch)
    num_layers = blocks - (_count(path, fields, nextn_key, low=0) if nextn_key in fields else 0)
    if num_layers < 1:
        raise PlacerError(f"{path}: {nextn_key} leaves no layer of the {blocks} blocks")
    if fields.get(Keys.LLM.EXPERT_COUNT.format(arch=arch)) in (None, 0):
        raise PlacerError(f"not an MoE model: {path} has no {arch}.expert_count")
    num_experts = _count(path, fields, Keys.LLM.EXPERT_COUNT.format(arch=arch))
    top_k = _count(path, fields, Keys.LLM.EXPERT_USED_COUNT.format(arch=arch))
    if top_k > num_experts:
        raise PlacerError(f"{path}: {arch}.expert_used_count {top_k} is more than "
                          f"{arch}.expert_count {num_experts}")
    moe_layers, experts, dense = sort_tensors(
        ((DenseTensor(t.name, part.path.name, t.offset, t.nbytes, t.type_name, t.shape),
          _expert_ranges(part.path, t, num_experts))
         for part in parts for t in part.tensors
         if _trunk(part.path, t.name, num_layers, blocks)),
        f"{path} (blk.N.ffn_*_exps)")
    shared_key = Keys.LLM.EXPERT_SHARED_COUNT.format(arch=arch)
    shared = (_count(path, fields, shared_key, low=0) if shared_key in fields
              else int(any(SHARED_TENSOR.match(d.name) for d in dense)))
    config = _config(arch, fields, num_layers, num_experts, top_k)
    return assemble(config, num_layers, num_experts, top_k, shared, moe_layers, experts, dense,
                    tuple(SourceFile(p.path.name, p.size) for p in parts), estimated=False)


def read_parts(path: Path) -> list[GGUFHeader]:
    """The headers of every part of the GGUF model whose first (or only) part is `path`.

    The parts agree as llama.cpp's loader makes them (`llama_model_loader`,
    `src/llama-model-loader.cpp` at 0c1e57098bba43ac29e6e3b677cdceebdd22334f): the file given
    is split.no 0; part i is named PREFIX-%05d-of-%05d.gguf (`llama_split_path`) and holds
    split.no i; no tensor is in two parts; split.tensors.count is the number of tensors of all
    parts ("corrupted model: N tensors expected but M found"). Beyond the loader, which takes
    a file of split.count 1 alone and fails later on a missing tensor: a file whose own
    split.tensors.count or name says it is one part of several is refused (part 1 tampered to
    split.count 1 would be half the model); and a later part must not be another model's:
    `llama-gguf-split` (`tools/gguf-split/gguf-split.cpp`, `new_ctx_out`) writes the same
    split.count and split.tensors.count into every part and the model's metadata into the
    first only, so a later part's other keys must equal the first's, and its expert tensors
    must have the ggml shape of the first part's tensors of the same name (every MoE layer of
    llama.cpp has one expert shape)."""
    first = read_gguf_header(path, PlacerError)
    count = first.fields.get(Keys.Split.LLM_KV_SPLIT_COUNT)
    if count is None or count == 1:
        _check_alone(first)
        return [first]
    count = _count(path, first.fields, Keys.Split.LLM_KV_SPLIT_COUNT)
    number = _count(path, first.fields, Keys.Split.LLM_KV_SPLIT_NO, low=0)
    name = SPLIT_NAME.match(path.name)
    if name is None or int(name["no"]) != number + 1 or int(name["count"]) != count:
        raise PlacerError(f"{path}: split.no {number} of split.count {count}, but its name is "
                          f"not PREFIX-{number + 1:05d}-of-{count:05d}.gguf")
    if number != 0:
        raise PlacerError(f"{path} is part {number + 1} of {count}: give the first part, "
                          f"{name['prefix']}-00001-of-{count:05d}.gguf")
    parts = [first]
    for i in range(1, count):
        part = path.with_name(f"{name['prefix']}-{i + 1:05d}-of-{count:05d}.gguf")
        if not part.is_file():
            raise PlacerError(f"{path}: split part {i + 1} of {count} is missing: {part}")
        header = read_gguf_header(part, PlacerError)
        total = first.fields.get(Keys.Split.LLM_KV_SPLIT_TENSORS_COUNT)
        for key, want in ((Keys.Split.LLM_KV_SPLIT_NO, i), (Keys.Split.LLM_KV_SPLIT_COUNT, count),
                          (Keys.Split.LLM_KV_SPLIT_TENSORS_COUNT, total)):
            if header.fields.get(key) != want:
                raise PlacerError(f"{part}: {key} is {_short(header.fields.get(key))}, "
                                  f"expected {_short(want)} as in {path.name}")
        _check_same_model(parts, header)
        parts.append(header)
    held = sum(len(p.tensors) for p in parts)
    if total != held:
        raise PlacerError(f"{path}: split.tensors.count is {_short(total)} but the {count} parts "
                          f"hold {held} tensors")
    seen: dict[str, Path] = {}
    for p in parts:
        for t in p.tensors:
            if t.name in seen:
                raise PlacerError(f"tensor {t.name!r} is in both {seen[t.name].name} and "
                                  f"{p.path.name}")
            seen[t.name] = p.path
    return parts


def _check_alone(header: GGUFHeader) -> None:
    """A file read alone (split.count absent or 1) must not say it is one part of several."""
    path, fields = header.path, header.fields
    total = fields.get(Keys.Split.LLM_KV_SPLIT_TENSORS_COUNT)
    if total is not None and total != len(header.tensors):
        said = _short(fields.get(Keys.Split.LLM_KV_SPLIT_COUNT))
        raise PlacerError(f"{path}: split.count is {said} but split.tensors.count is "
                          f"{_short(total)} and it holds {len(header.tensors)} tensors: one "
                          "part of a split model, read alone it would be part of the model")
    name = SPLIT_NAME.match(path.name)
    if name is not None and int(name["count"]) > 1:
        raise PlacerError(f"{path}: named part {int(name['no'])} of {int(name['count'])} but "
                          f"split.count is {_short(fields.get(Keys.Split.LLM_KV_SPLIT_COUNT))}: "
                          "a part of a split model, read alone it would be part of the model")


def _check_same_model(parts: list[GGUFHeader], part: GGUFHeader) -> None:
    """PlacerError when `part` holds metadata other than the first part's, or an expert
    tensor whose ggml shape differs from the earlier parts' of the same projection."""
    first = parts[0]
    for key, value in part.fields.items():
        if key not in SPLIT_KEYS and key in first.fields and first.fields[key] != value:
            raise PlacerError(f"{part.path}: {key} is {_short(value)} but "
                              f"{_short(first.fields[key])} in {first.path.name}: a part of "
                              "another model")
    embd = first.fields.get(Keys.LLM.EMBEDDING_LENGTH.format(
        arch=first.fields.get(Keys.General.ARCHITECTURE)))
    for t in part.tensors:  # a weight's ne is {n_embd, n_ff_exp, n_expert} or {n_ff_exp, ...}
        m = EXPERT_TENSOR.match(t.name)
        if m is not None and m["suffix"] == "weight" and isinstance(embd, int) \
                and embd not in t.ne[:2]:
            raise PlacerError(f"{part.path}: expert tensor {t.name!r} has ggml ne {list(t.ne)}"
                              f" but {first.path.name}'s embedding_length is {embd}: a part of "
                              "another model")
    shapes: dict[tuple[str, str], tuple[Path, tuple]] = {}
    for p in parts:
        for t in p.tensors:
            m = EXPERT_TENSOR.match(t.name)
            if m is not None:
                shapes.setdefault((m["base"], m["suffix"]), (p.path, t.ne))
    for t in part.tensors:
        m = EXPERT_TENSOR.match(t.name)
        seen = shapes.get((m["base"], m["suffix"])) if m is not None else None
        if seen is not None and t.ne != seen[1]:
            raise PlacerError(f"{part.path}: expert tensor {t.name!r} has ggml ne {list(t.ne)}"
                              f" but {seen[0].name}'s {m['base']}.{m['suffix']} have "
                              f"{list(seen[1])}: a part of another model")


def _trunk(file: Path, name: str, num_layers: int, blocks: int) -> bool:
    """Whether tensor `name` is loaded for decoding: not a block past the trunk's layers (an
    MTP / nextn block, which llama.cpp skips unless asked to load it); PlacerError for a block
    past block_count."""
    block = BLOCK.match(name)
    if block is not None and int(block[1]) >= blocks:
        raise PlacerError(f"{file}: tensor {name!r} is in block {block[1]} but block_count is "
                          f"{blocks}")
    return block is None or int(block[1]) < num_layers


def _expert_ranges(file: Path, t: TensorInfo, num_experts: int) -> ExpertRanges | None:
    """The (layer, expert) ranges of tensor `t`, or None when it is not a routed expert's."""
    m = EXPERT_TENSOR.match(t.name)
    if m is None:
        if EXPERT_LIKE.match(t.name):
            raise PlacerError(f"{file}: tensor {t.name!r} is no routed expert tensor llama.cpp "
                              f"loads: blk.N.{{{','.join(_EXPERT_NAMES)}}}.SUFFIX with SUFFIX "
                              f"one of {', '.join(EXPERT_SUFFIXES)} (LLM_TN, src/llama-arch.cpp)")
        return None
    layer = int(m["layer"])
    if len(t.ne) < 2 or t.ne[-1] != num_experts:
        raise PlacerError(f"{file}: expert tensor {t.name!r} has ggml ne {list(t.ne)}, "
                          f"expected the outermost (last) to be expert_count {num_experts}")
    per = t.nbytes // num_experts
    return [((layer, e), TensorRange(t.name, file.name, t.offset + e * per, per, t.type_name,
                                     t.shape[1:], t.shape, e * per))
            for e in range(num_experts)]


def _string(path: Path, fields: dict, key: str) -> str:
    value = fields.get(key)
    if not isinstance(value, str) or not value:
        raise PlacerError(f"{path}: {key} is {_short(value)}, expected a string")
    return value


def _count(path: Path, fields: dict, key: str, *, low: int = 1) -> int:
    """An integer key at least `low` and at most MAX_COUNT (the trace schema's int16)."""
    value = fields.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= MAX_COUNT:
        raise PlacerError(f"{path}: {key} is {_short(value)}, expected an integer in "
                          f"[{low}, {MAX_COUNT}]")
    return value


def _short(value: object) -> str:
    text = "missing" if value is None else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _config(arch: str, fields: dict, num_layers: int, num_experts: int, top_k: int) -> dict:
    """The inventory's config: the keys placer's planners read, in config.json's names, and
    the architecture's GGUF metadata (what the fingerprint hashes besides the tensors)."""
    config: dict = {"model_type": arch, "num_hidden_layers": num_layers,
                    "num_experts": num_experts, "num_experts_per_tok": top_k}
    for name, key in (("hidden_size", Keys.LLM.EMBEDDING_LENGTH),
                      ("moe_intermediate_size", Keys.LLM.EXPERT_FEED_FORWARD_LENGTH)):
        value = fields.get(key.format(arch=arch))
        if isinstance(value, int) and not isinstance(value, bool):
            config[name] = value
    config["gguf"] = {k: str(v) if isinstance(v, Skipped) else v for k, v in fields.items()
                      if k == Keys.General.ARCHITECTURE or k.startswith(arch + ".")}
    return config
