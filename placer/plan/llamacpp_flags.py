"""A llama-server command line as llama.cpp reads it, and the setup it runs (`placer evaluate
--engine llamacpp --flags '...'`): the inverse of `placer export llamacpp`
(placer/exporters/llamacpp.py engine_args).

Read from ggml-org/llama.cpp 0c1e57098bba43ac29e6e3b677cdceebdd22334f (vendored in
llama-cpp-python 0.3.36), `common/arg.cpp` `common_params_parse_ex`: the arguments are taken
one by one; a `--` argument has its `_` read as `-`; a flag that takes a value takes the
next argument whatever it is (there is no `--flag=value` form; `-fa` takes one too); an
unknown argument is an error to llama-server, and here is named as one placer does not
model. The flags placer models, with their spellings and values there:

- `-ngl/--gpu-layers/--n-gpu-layers N|auto|all` (`std::stoi`; `auto` is -1, `all` -2, the
  default `auto`); `src/llama-model.cpp` puts decoder layers il < n_layer + 1 - N on the CPU;
- `-ncmoe/--n-cpu-moe N` (N >= 0): one override `blk\\.{i}\\.ffn_(up|down|gate|gate_up)_(ch|)exps`
  = CPU for i in [0, N) (`common/common.h` `llm_add_n_cpu_ffn_overrides`);
  `-cmoe/--cpu-moe`: one override `\\.ffn_(up|down|gate|gate_up)_(ch|)exps` = CPU;
  `-ot/--override-tensor "<pattern>=<buffer type>,..."`: split on ',' then on the first '='
  (`parse_tensor_buffer_overrides`). All three append to one list, in command-line order, and
  `src/llama-model-loader.cpp` gives a tensor the buffer of the first pattern that
  `std::regex_search` finds in its name (Python's `re.search` here: the same for the
  patterns these flags are written with);
- `-ts/--tensor-split N0,N1,...` (split on `[,/]+`, `std::stof`);
- `-lm/--load-mode auto|none|mmap|mlock|mmap+mlock|dio` (default auto: mmap); `none`, `mlock`
  and `dio` read the host experts into pinned memory unless `--no-host` (docs/llamacpp.md);
- `-c/--ctx-size N`, `-ctk/--cache-type-k`, `-ctv/--cache-type-v` (f32, f16, bf16, q8_0,
  q4_0, q4_1, iq4_nl, q5_0, q5_1: `kv_cache_types`), `-ub/--ubatch-size N`,
  `-t/--threads N`;
- `-m/--model`, `--host`, `--port`, `-fa/--flash-attn`, `-dev/--device`: parsed, they do not
  change the placement.

`--moe-cache-mib N` (N >= 0, MiB) is the expert cache's flag (ggml-org/llama.cpp #29887,
b11480, as docs/llamacpp.md reads it at 4b060f27 `common/arg.cpp`: `{"--moe-cache-mib"}, "N"`,
an int, negative refused); `--moe-cache-cpu-share F` its CPU share (b12170 and later,
`docs/moe-cache.md` at b12191; solvers/llamacpp/builds.py says which build has which).
"""

from __future__ import annotations

import dataclasses
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from placer.errors import PlacerError
from solvers.errors import SolverError
from solvers.llamacpp.builds import CACHE_FLAG, SHARE_FLAG, Build
from solvers.llamacpp.cost import MIB, Machine, Setup, layer_devices, with_cache

EXPS_REGEX = r"\.ffn_(up|down|gate|gate_up)_(ch|)exps"  # common/common.h LLM_FFN_EXPS_REGEX
KV_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")
LOAD_MODES = ("auto", "none", "mmap", "mlock", "mmap+mlock", "dio")
PINNED_MODES = ("none", "mlock", "dio")
KV_NOTE = "parsed, KV size from the spec's reserved_kv"
UNMODELLED = "not modelled: "  # how a note on a flag placer does not model begins
SPILLED = "spilled to host memory"  # a card past its VRAM that spills (fit_notes)
NOT_LOADED = "llama.cpp would not load this as predicted"  # one that does not
# the GGUF expert tensors of a layer where the model's own names are not at hand (gguf-py
# constants.py FFN_{GATE,UP,DOWN}_EXP, as placer/exporters/llamacpp.py reads them)
STANDARD_TENSORS = ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")

# canonical name -> (aliases, what its value is: None for a flag without one)
FLAGS: dict[str, tuple[tuple[str, ...], str | None]] = {
    "-ngl": (("--gpu-layers", "--n-gpu-layers"), "N, auto or all"),
    "-ncmoe": (("--n-cpu-moe",), "N >= 0"),
    "-cmoe": (("--cpu-moe",), None),
    "-ot": (("--override-tensor",), "<pattern>=<buffer type>,..."),
    CACHE_FLAG: ((), "N >= 0 (MiB)"),
    SHARE_FLAG: ((), "a share from 0 to 1"),
    "-ts": (("--tensor-split",), "N0,N1,... (proportions >= 0, a positive sum)"),
    "-lm": (("--load-mode",), ", ".join(LOAD_MODES)),
    "--no-host": ((), None),
    "-c": (("--ctx-size",), "N >= 0"),
    "-ctk": (("--cache-type-k",), ", ".join(KV_TYPES)),
    "-ctv": (("--cache-type-v",), ", ".join(KV_TYPES)),
    "-ub": (("--ubatch-size",), "N >= 1"),
    "-t": (("--threads",), "N"),
    "-m": (("--model",), "FNAME"),
    "--host": ((), "HOST"),
    "--port": ((), "PORT"),
    "-fa": (("--flash-attn",), "on, off or auto"),
    "-dev": (("--device",), "<dev1,dev2,..>"),
}
PLACEMENT_FREE = ("-m", "--host", "--port", "-fa")
ALIASES = {alias: name for name, (aliases, _) in FLAGS.items() for alias in (name, *aliases)}
_INT = re.compile(r"^[+-]?\d{1,9}$")


_BLOCK = re.compile(r"^blk\.(\d+)\.")


@dataclass(frozen=True)
class Override:
    """One tensor buffer override: GGUF tensor names `pattern` finds go to `buffer`; `flag`:
    the flag that made it (-ot, -ncmoe or -cmoe). `below`: -ncmoe N's N overrides
    `blk\\.{i}` + EXPS_REGEX for i < N, one after another in the list, as one (the
    pattern EXPS_REGEX in a tensor of block i < N: the same first match, without N
    patterns for a large N)."""

    pattern: str
    buffer: str
    flag: str
    below: int | None = None

    def finds(self, tensor: str) -> bool:
        if self.below is not None:
            block = _BLOCK.match(tensor)
            if block is None or int(block.group(1)) >= self.below:
                return False
        return re.search(self.pattern, tensor) is not None


@dataclass(frozen=True)
class ServerFlags:
    """One llama-server command line as parsed (module docstring). `values`: the canonical
    flags given, with their last value (llama.cpp keeps the last; `-ot`, `-ncmoe` and `-cmoe`
    append to `overrides` each time); `unmodelled`: the arguments placer does not model, as
    given (a flag with the value it seemed to take)."""

    text: str
    values: dict[str, str]
    overrides: tuple[Override, ...]
    unmodelled: tuple[str, ...] = ()

    def get(self, flag: str, default: str | None = None) -> str | None:
        return self.values.get(flag, default)

    @property
    def gpu_layers(self) -> int | None:
        """-ngl as a count, None for every layer (all) or llama.cpp's default (auto)."""
        value = self.get("-ngl", "auto")
        return None if value in ("auto", "all", "-1", "-2") else int(value)

    @property
    def cache_mib(self) -> int:
        return int(self.get(CACHE_FLAG, "0"))

    @property
    def cpu_share(self) -> float:
        return float(self.get(SHARE_FLAG, "0"))

    @property
    def tensor_split(self) -> tuple[float, ...] | None:
        value = self.get("-ts")
        return None if value is None else tuple(float(x) for x in _split_ts(value))

    @property
    def pinned(self) -> bool:
        """The host experts in pinned memory (-lm none|mlock|dio without --no-host)."""
        return self.get("-lm", "auto") in PINNED_MODES and "--no-host" not in self.values

    def kv(self) -> list[str]:
        """-c, -ctk, -ctv as given (they size the KV cache where the model's config is known:
        placer.predict.llamacpp_flags)."""
        return [f"{f} {self.values[f]}" for f in ("-c", "-ctk", "-ctv") if f in self.values]

    def placement_free(self) -> list[str]:
        return [f"{f} {self.values[f]}" for f in PLACEMENT_FREE if f in self.values]


def parse_flags(text: str) -> ServerFlags:
    """`text` (one --flags value; a leading program name such as llama-server is skipped) as
    llama-server parses it; PlacerError, one line naming the flag, for a bad value."""
    try:
        args = shlex.split(text)
    except ValueError as exc:
        raise PlacerError(f"--flags {text[:60]!r}: {exc}") from None
    if args and not args[0].startswith("-"):
        args = args[1:]  # llama-server (or its path)
    values: dict[str, str] = {}
    overrides: list[Override] = []
    unmodelled: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        given = arg.replace("_", "-") if arg.startswith("--") else arg
        name = ALIASES.get(given)
        if name is None and ALIASES.get(given.partition("=")[0]):
            raise PlacerError(f"--flags: llama-server takes {given.partition('=')[0]} VALUE, "
                              f"not {arg} (common/arg.cpp has no --flag=value form)")
        if name is None:
            takes = i + 1 < len(args) and _value_like(args[i + 1])
            unmodelled.append(" ".join(args[i:i + 1 + takes]))
            i += 1 + takes
            continue
        kind = FLAGS[name][1]
        if kind is None:
            values[name] = ""
            overrides += [Override(EXPS_REGEX, "CPU", name)] if name == "-cmoe" else []
            i += 1
            continue
        if i + 1 >= len(args):
            raise PlacerError(f"--flags: {arg} expects a value ({kind})")
        value = args[i + 1]
        check_value(name, arg, value)
        values[name] = value
        if name == "-ncmoe" and int(value) > 0:
            overrides.append(Override(EXPS_REGEX, "CPU", name, int(value)))
        elif name == "-ot":
            overrides += [Override(p, b, name) for p, b in parse_overrides(arg, value)]
        i += 2
    return ServerFlags(text, values, tuple(overrides), tuple(unmodelled))


def _value_like(arg: str) -> bool:
    """Whether the argument after an unknown flag looks like its value (not a flag)."""
    return not arg.startswith("-") or bool(re.match(r"^-[\d.]", arg))


def _split_ts(value: str) -> list[str]:
    return [x for x in re.split(r"[,/]+", value) if x != ""]


def check_value(name: str, arg: str, value: str) -> None:
    """PlacerError, one line naming `arg`, where `value` is not what llama.cpp takes."""
    kind = FLAGS[name][1]
    bad = PlacerError(f"--flags: {arg} expects {kind}, got {value!r}")
    if name in ("-ncmoe", CACHE_FLAG, "-c", "-ub", "-t", "--port"):
        # -t N <= 0 is every hardware thread (arg.cpp); the others are counts
        if not _INT.match(value) or (name != "-t" and int(value) < (name == "-ub")):
            raise bad
    elif name == "-ngl":
        if value not in ("auto", "all") and (not _INT.match(value) or int(value) < -2):
            raise bad
    elif name == SHARE_FLAG:
        if not _float(value) or not 0.0 <= float(value) <= 1.0:
            raise bad
    elif name == "-ts":
        parts = _split_ts(value)
        if not parts or not all(_float(x) and float(x) >= 0 for x in parts) or not sum(
                float(x) for x in parts) > 0:
            raise bad
    elif name in ("-ctk", "-ctv"):
        if value not in KV_TYPES:
            raise bad
    elif name == "-lm":
        if value not in LOAD_MODES:
            raise bad
    elif name == "-fa":
        if value not in ("on", "enabled", "true", "1", "off", "disabled", "false", "0",
                         "auto", "-1"):
            raise bad


def _float(text: str) -> bool:
    try:
        return np.isfinite(float(text))
    except ValueError:
        return False


def parse_overrides(arg: str, value: str) -> list[tuple[str, str]]:
    """The (pattern, buffer type) pairs of one -ot value, each pattern compiled."""
    out = []
    for part in value.split(","):
        pattern, eq, buffer = part.partition("=")
        if not eq or not buffer:
            raise PlacerError(f"--flags: {arg} expects <tensor name pattern>=<buffer type>,..., "
                              f"got {part!r}")
        try:
            re.compile(pattern)
        except re.error as exc:
            raise PlacerError(f"--flags: {arg} pattern {pattern!r}: {exc}") from None
        buffer_device(arg, buffer)
        out.append((pattern, buffer))
    return out


def buffer_device(arg: str, buffer: str, devices: list[str] | None = None) -> int:
    """The card a buffer type names (-1: host memory: CPU or a backend's _Host buffer):
    its position in `devices` (-dev) where given, else its trailing number (CUDA1 -> 1;
    Metal -> 0). PlacerError naming `arg` for one placer cannot read."""
    if buffer == "CPU" or buffer.endswith("_Host"):
        return -1
    if devices and buffer in devices:
        return devices.index(buffer)
    m = re.match(r"^[A-Za-z][A-Za-z_]*?(\d+)$", buffer)
    if m:
        return int(m.group(1))
    if buffer == "Metal":
        return 0
    raise PlacerError(f"--flags: {arg} buffer type {buffer!r}: expected CPU or a device's "
                      "buffer as `llama-server --list-devices` names it (CUDA0, Vulkan1, ...)")


@dataclass(frozen=True)
class Model:
    """What a setup needs of the model: its decoder layers, the decoder layer of each MoE
    layer, and the GGUF expert tensor names of a MoE layer (a function of its decoder
    layer)."""

    num_layers: int
    moe_layers: tuple[int, ...]
    tensors: Callable[[int], list[str]] = field(default=lambda layer: [
        f"blk.{layer}.{name}.weight" for name in STANDARD_TENSORS])


@dataclass(frozen=True)
class FlagLine:
    """One command line as predicted: its name, the Setup and the Machine it runs (the cards
    by -ts and -ot), the flags, and notes on what is not modelled or assumed."""

    name: str
    flags: ServerFlags
    setup: Setup
    machine: Machine
    notes: tuple[str, ...]


def flag_line(name: str, flags: ServerFlags, machine: Machine, model: Model, build: Build,
              batches: tuple[int, ...], kv_note: str | None = None) -> FlagLine:
    """The setup `flags` run on `machine` (the cards; its tensor split where no -ts) for
    `model` with `build`'s cache; `kv_note`: how its -c/-ctk/-ctv sized the KV cache (None:
    the spec's reserved_kv stands); PlacerError naming the flag where it cannot be run."""
    notes = [f"{UNMODELLED}{a}" for a in flags.unmodelled]
    for flag in (CACHE_FLAG, SHARE_FLAG):
        if flag in flags.values and float(flags.values[flag]) > 0 and flag not in build.flags:
            raise PlacerError(f"--flags: {flag}: {build.label} does not have it (give "
                              "--llamacpp-version of a build that has)")
    machine, device, split_note = cards_of(flags, machine, model)
    notes += split_note
    gpu_from = first_gpu_layer(flags, model.num_layers)
    host = np.zeros(len(model.moe_layers), dtype=bool)
    device = list(device)
    for i, layer in enumerate(model.moe_layers):
        where = {tensor_place(flags, t) for t in model.tensors(layer)}
        where = {(-1 if layer < gpu_from else device[i]) if w is None else w for w in where}
        if len(where) > 1:
            raise PlacerError(f"--flags: -ot puts the expert tensors of layer {layer} on "
                              "several devices: placer models a layer's experts in one place")
        place = where.pop()
        if place >= len(machine.per_device(machine.capacity)):
            raise PlacerError(f"--flags: -ot sends layer {layer}'s experts to card {place}; "
                              f"the spec has {len(machine.per_device(machine.capacity))}")
        host[i] = place < 0
        if place >= 0 and place != device[i]:
            notes.append(f"{UNMODELLED}-ot puts layer {layer}'s experts on card {place}, the "
                         f"layer on card {device[i]} (predicted as if on card {place}: the "
                         "activations' copies between the cards are not)")
            device[i] = place
    if gpu_from:
        notes.append(f"{UNMODELLED}-ngl {flags.get('-ngl')} (decoder layers 0-{gpu_from - 1} "
                     "on the CPU: their experts are predicted as host layers, their attention "
                     "and dense weights are not: the spec's base step has every layer on the "
                     "GPUs)")
        if flags.cache_mib and host[np.asarray(model.moe_layers) < gpu_from].any():
            raise PlacerError(f"--flags: {CACHE_FLAG} with -ngl {flags.get('-ngl')}: "
                              "llama.cpp caches only the host experts of layers on a GPU, "
                              "which placer models with every layer on the GPUs (-ngl all)")
    if flags.get("-ngl", "auto") in ("auto", "-1"):
        notes.append("-ngl auto (llama.cpp's default): taken as every layer on the GPUs "
                     "(its --fit may place fewer; give -ngl all to be exact)")
    if len(set(device)) > 1 or machine.tensor_split:
        machine = dataclasses.replace(machine, device=tuple(int(d) for d in device))
    try:
        setup = with_cache(machine, name, host, flags.cache_mib,
                           flags.cpu_share if flags.cache_mib else 0.0, flags.pinned)
    except SolverError as exc:
        raise PlacerError(f"--flags: {CACHE_FLAG} {flags.cache_mib}: {exc}") from None
    return FlagLine(name, flags, setup, machine,
                    tuple(notes + fit_notes(machine, setup) + device_notes(flags, machine)
                          + carried_notes(flags, batches, kv_note)))


def cards_of(flags: ServerFlags, machine: Machine, model: Model
             ) -> tuple[Machine, list[int], list[str]]:
    """The machine with -ts's split (several cards; without -ts the machine's own, or the
    cards' VRAM for experts in proportion, which is how placer solves), each MoE layer's
    card, and a note where the split was not given."""
    cards = len(machine.per_device(machine.capacity))
    split = flags.tensor_split
    if split is not None and len(split) > cards:
        raise PlacerError(f"--flags: -ts gives {len(split)} proportions for the spec's "
                          f"{cards} card{'s' if cards > 1 else ''}")
    if cards == 1:
        return machine, [0] * len(model.moe_layers), []
    notes = []
    if split is None:
        split = machine.tensor_split or tuple(float(c) for c in machine.per_device(
            machine.capacity))
        notes.append(f"no -ts: the layers split {','.join(f'{x:g}' for x in split)} over "
                     "the cards (placer's split; llama.cpp splits by free memory at load)")
    split = tuple(split) + (0.0,) * (cards - len(split))
    device = layer_devices(model.num_layers, split)[list(model.moe_layers)]
    return dataclasses.replace(machine, tensor_split=split), [int(d) for d in device], notes


def first_gpu_layer(flags: ServerFlags, num_layers: int) -> int:
    """The first decoder layer on a GPU under -ngl (llama-model.cpp: n_layer + 1 - N)."""
    n = flags.gpu_layers
    return 0 if n is None else max(num_layers + 1 - n, 0)


def tensor_place(flags: ServerFlags, tensor: str) -> int | None:
    """The card of the first override whose pattern finds `tensor` (-1: the host), None where
    none does (the tensor goes with its layer)."""
    devices = flags.get("-dev", "").split(",") if flags.get("-dev") else None
    for o in flags.overrides:
        if o.finds(tensor):
            return buffer_device(o.flag, o.buffer, devices)
    return None


def fit_notes(machine: Machine, setup: Setup) -> list[str]:
    """Where the setup's GPU experts and cache do not fit the cards' VRAM for them: spilled
    to host memory where the card spills (predicted so: solvers/llamacpp/cost.py), else a
    setup llama.cpp would not load."""
    room = machine.per_device(machine.capacity) - machine.gpu_bytes(setup.host)
    spilled = machine.spill_bytes(setup.host)
    notes = [f"card {d}: its experts exceed its VRAM for experts by {int(-r) // MIB} MiB: "
             + (f"{SPILLED} ({int(spilled[d]) // MIB} MiB past its VRAM: the os and backend "
                "of the spec, or its spills; placer/hardware/data/spill.csv), the share a "
                f"step touches read at {machine.spill_rate:g} x the card's h2d_bandwidth "
                "(fitted: placer/hardware/data/host_fit.csv)" if spilled[d] > 0 else
                f"{NOT_LOADED} (it does not spill on the spec's os and backend: "
                "placer/hardware/data/spill.csv)")
             for d, r in enumerate(room) if r < 0]
    room_mib = max(machine.bank_room(setup.host), 0) // MIB
    if setup.cache_mib and setup.cache_mib > room_mib:
        notes.append(f"{CACHE_FLAG} {setup.cache_mib}: more than the {room_mib} MiB the "
                     "cards have beside their experts (within their backend's largest "
                     "allocation: docs/hardware.md)")
    return notes


def device_notes(flags: ServerFlags, machine: Machine) -> list[str]:
    """-dev: the spec's cards in order where it lists as many, else named as not modelled."""
    if "-dev" not in flags.values:
        return []
    cards = len(machine.per_device(machine.capacity))
    listed = [d for d in flags.values["-dev"].split(",") if d and d != "none"]
    if len(listed) == cards:
        return [f"-dev {flags.values['-dev']}: the spec's {cards} card(s), in that order"]
    return [f"{UNMODELLED}-dev {flags.values['-dev']} (predicted on the spec's {cards} "
            "card(s))"]


def carried_notes(flags: ServerFlags, batches: tuple[int, ...], kv_note: str | None
                  ) -> list[str]:
    """What the flags carry without changing the prediction, and how they sized the KV."""
    notes = [kv_note] if kv_note else []
    if flags.kv() and not kv_note:
        notes.append(f"{', '.join(flags.kv())}: {KV_NOTE}")
    ub = flags.get("-ub")
    if ub is not None and any(b > int(ub) for b in batches):
        notes.append(f"{UNMODELLED}-ub {ub} below the concurrency (a step is predicted as "
                     "one ubatch of all its tokens)")
    if "-t" in flags.values:
        notes.append(f"{UNMODELLED}-t {flags.get('-t')} (the spec's [host] figures stand)")
    if "--no-host" in flags.values:
        notes.append("--no-host: host experts taken as mmap'd (not pinned)")
    if flags.placement_free():
        notes.append(f"does not change placement: {', '.join(flags.placement_free())}")
    return notes
