"""The one table of option rules (issue 44, class 3): every numeric option of every command,
by its parameter name, checked before the command does any work.

Each command used to check its own options on its own code path, so a path that skipped the
checks (`solve --engine llamacpp`: `--concurrency 0` an IndexError, all-zero weights a
ZeroDivisionError, weights of another length a zip() error) or a command that never had one
(a negative `--seed` reaching numpy in `traces split` and `bench`) failed deep inside. Here a
name means the same thing in every command (`--seed` is a seed in 0..2**31-1 wherever it
appears: SCIP's random seed shift is a C int, numpy takes any of them), with `OVERRIDES`
where one command bounds it differently, and `AGREE` lists the options whose lengths must
match.

`placer.commands.common.command` applies the table to every command's values before the
command's function runs; the library entry points (`solve_plan`, `evaluate`, `collect`,
`split_traces`) apply the same table to the same names, so a caller that skips the CLI
gets the same answer, and no rule has a twin. This module lives in traces/ because both
stages check options with it (traces/ may not import placer/).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from traces.errors import TraceError

MAX_SEED = 2**31 - 1          # SCIP's random seed shift is a C int
MAX_INT = 2**63 - 1           # no option counts past an int64
MAX_CONCURRENCY = 1 << 16     # requests at once: far past any batch a card decodes
MAX_CACHE_SLOTS = 1 << 16     # run, serve, bench: slots per card the runtime allocates
MAX_PLAN_SLOTS = 1 << 31      # evaluate --cache-slots: what a plan may hold (plan.check)
MAX_SOLVE_SLOTS = 1 << 24     # solve --cache
MAX_POSITION = 2**31 - 1      # token positions and lengths: int32 in traces and llama.cpp
MAX_STEPS = 1 << 24           # decode steps sampled per profile and concurrency (plan schema)
MAX_ALIGN = 1 << 21           # emit --align: a shard's data offset alignment, at most a
#                               huge page (2 MiB): every tensor is padded to it, so 2**30
#                               wrote 49 GB of padding for a 200 kB model
MAX_CARDS = 1024              # cards in a spec (placer.hardware.spec)
MAX_CORES = 1024              # hardware new --cpu-cores, bench --threads
MAX_CTX = 1 << 24             # --ctx: a context past 16M tokens is a typo (placer.checkpoint.kv)


@dataclass(frozen=True)
class Rule:
    """What one option's value may be: an int or float in [low, high] (`open_low`/`open_high`
    exclude the end), finite; `many`: a list, or a comma-separated string of them, each
    such a value; `words`: strings meaning something else ("auto"); `some_positive`: a list
    not all 0; `power_of_two`: an integer power of two."""

    kind: type = int
    low: float | None = None
    high: float | None = None
    open_low: bool = False
    open_high: bool = False
    many: bool = False
    words: tuple[str, ...] = ()
    some_positive: bool = False
    power_of_two: bool = False

    def describe(self) -> str:
        """How the error words the rule: ">= 1", "in 0..2**31-1", "in (0, 1)"."""
        if self.kind is float:
            if self.low == 0 and self.open_low and self.high is None:
                text = "a positive number"
            else:
                text = (f"in {'(' if self.open_low else '['}{_show(self.low)}, "
                        f"{_show(self.high)}{')' if self.open_high else ']'}"
                        if self.high is not None else f">= {_show(self.low)}")
        else:
            text = f">= {_show(self.low)}" if self.high is None or self.high >= MAX_INT \
                else f"in {_show(self.low)}..{_show(self.high)}"
        text = f"a power of two {text}" if self.power_of_two else text
        return f"{' or '.join(self.words)} or {text}" if self.words else text

    def holds(self, value: object) -> bool:
        """Whether one value (not a list) keeps the rule."""
        if isinstance(value, str) and value.strip().lower() in self.words:
            return True
        if isinstance(value, bool) or not isinstance(value, int | float) or (
                self.kind is int and not isinstance(value, int)) or not math.isfinite(value):
            return False
        if self.low is not None and (value < self.low or (self.open_low and value == self.low)):
            return False
        if self.power_of_two and (value < 1 or value & (value - 1)):
            return False
        return self.high is None or not (value > self.high or
                                         (self.open_high and value == self.high))


def _show(bound: float | None) -> str:
    if bound is None:
        return "-inf"
    known = {MAX_SEED: "2**31-1", MAX_INT: "2**63-1"}
    return known.get(bound, f"{bound:g}" if isinstance(bound, float) else str(bound))


COUNT = Rule(int, 1, MAX_INT)
RULES: dict[str, Rule] = {
    "seed": Rule(int, 0, MAX_SEED),
    "concurrency": Rule(int, 1, MAX_CONCURRENCY, many=True),
    "weights": Rule(float, 0, None, many=True, some_positive=True),
    "steps": Rule(int, 1, MAX_STEPS), "trials": COUNT, "max_new_tokens": COUNT, "batch_size": COUNT,
    "max_tokens": COUNT, "random_tokens": COUNT, "top_k": COUNT, "tokens": COUNT, "mb": COUNT,
    "max_length": Rule(int, 1, MAX_POSITION),
    "prompt_start": Rule(int, 0, MAX_POSITION),
    "folds": Rule(int, 2, MAX_INT),
    "time_limit": Rule(float, 0, None, open_low=True),
    "oracle_time_limit": Rule(float, 0, None, open_low=True),
    "request_timeout": Rule(float, 0, None, open_low=True),
    "offload": Rule(float, 0, 1, open_low=True, open_high=True),
    "fraction": Rule(float, 0, 1, open_low=True, open_high=True),
    "cache_slots": Rule(int, 0, MAX_CACHE_SLOTS),
    "cache": Rule(int, 0, MAX_SOLVE_SLOTS, words=("auto",)),
    "kv_tokens": Rule(int, 64, MAX_INT),
    "port": Rule(int, 0, 65535),
    "align": Rule(int, 8, MAX_ALIGN, power_of_two=True),
    "expert_tokens": Rule(int, 1, MAX_INT, many=True),
    "batch": Rule(int, 1, MAX_INT, many=True),
    "cards": Rule(int, 1, MAX_CARDS), "cpu_cores": Rule(int, 1, MAX_CORES),
    "threads": Rule(int, 1, MAX_CORES), "max_prompt_tokens": Rule(int, 1, MAX_POSITION),
    "ctx": Rule(int, 1, MAX_CTX),
}
OVERRIDES: dict[tuple[str, str], Rule | None] = {  # (command, name): the rule there
    ("evaluate", "cache_slots"): Rule(int, 0, MAX_PLAN_SLOTS),
    ("collect", "weights"): None,  # a flag there: record the gate weights
}
AGREE = (("weights", "concurrency"),)  # (a list, the list it must match in length)


def available_memory(device: str = "cpu") -> int:
    """Bytes free on the torch `device` for a count's allocation to be checked against
    ("counts by memory"): a CUDA device's free memory; for cpu the host RAM available
    (MemAvailable of /proc/meminfo: free pages and the caches the kernel gives back; else the
    free pages)."""
    if device.startswith("cuda"):
        import torch

        free, _ = torch.cuda.mem_get_info(torch.device(device))
        return int(free)
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


KV_BYTES = 2  # a key or value element in the model's cache (bf16, f16)


def kv_bytes_per_token(config: Mapping, element: int = KV_BYTES) -> int:
    """Bytes of key/value cache one token takes in a Hugging Face model of `config` (its
    config.json's keys) at `element` bytes a value, a floor: every layer's keys and values of
    its key/value heads (MLA models: of every head, keys of qk_nope + qk_rope and values of
    v_head_dim wide, as transformers caches them); 0 where the config lacks the attention
    shape."""
    layers, heads = config.get("num_hidden_layers") or 0, config.get("num_attention_heads")
    hidden = config.get("hidden_size")
    if not layers or not heads or not hidden:
        return 0
    if config.get("kv_lora_rank"):
        width = ((config.get("qk_nope_head_dim") or 0) + (config.get("qk_rope_head_dim") or 0)
                 + (config.get("v_head_dim") or 0))
        return layers * heads * width * element
    head_dim = config.get("head_dim") or hidden // heads
    return 2 * layers * (config.get("num_key_value_heads") or heads) * head_dim * element


def _values(value: object, kind: type) -> list | None:
    """The values of a list option (a list, or "1,8"); None where the text is not a list."""
    if isinstance(value, list | tuple):
        return list(value)
    if isinstance(value, int | float) and not isinstance(value, bool):
        return [value]
    items = [v.strip() for v in str(value).split(",") if v.strip()]
    try:
        return [kind(v) for v in items]
    except ValueError:
        return None


def check_rules(values: Mapping[str, object], command: str = "", *,
                name_of: Callable[[str], str] | None = None,
                error: type[ValueError] = TraceError) -> None:
    """`error` in one line naming the first option of `values` ({parameter name: value}; None
    means not given) that breaks its rule (RULES, OVERRIDES for `command`) or AGREE.
    `name_of(name)`: how the user typed it (default --name-with-dashes)."""
    flag = name_of or (lambda n: f"--{n.replace('_', '-')}")
    lists: dict[str, list] = {}
    for name, value in values.items():
        rule = OVERRIDES[command, name] if (command, name) in OVERRIDES else RULES.get(name)
        if rule is None or value is None:
            continue
        if not rule.many:
            if isinstance(value, str) and value.strip().lower() not in rule.words:
                try:
                    value = rule.kind(value)
                except ValueError:
                    raise error(f"{flag(name)} must be {rule.describe()}, got {value!r}"
                                ) from None
            if not rule.holds(value):
                raise error(f"{flag(name)} must be {rule.describe()}, got {value}")
            continue
        items = _values(value, rule.kind)
        if items == []:
            raise error(f"{flag(name)}: empty list")
        if items is None:
            raise error(f"{flag(name)}: expected a comma-separated list of numbers "
                        f"{rule.describe()}, got {str(value)[:60]!r}")
        if not all(rule.holds(v) for v in items):
            raise error(f"{flag(name)}: every value must be {rule.describe()}, got "
                        f"{','.join(map(str, items))[:80]}")
        if rule.some_positive and not any(v > 0 for v in items):
            raise error(f"{flag(name)} must not all be 0, got {','.join(map(str, items))}")
        lists[name] = items
    for name, other in AGREE:
        if name in lists and other in lists and len(lists[name]) != len(lists[other]):
            raise error(f"{flag(name)}: {len(lists[name])} values for {len(lists[other])} "
                        f"{flag(other)} values; give one for each")
