"""What placer predicts for the very tokens a llama.cpp bench served, and what its replay of
the expert cache says llama.cpp's log should read.

The bench records, per option, the experts every token of every sequence was routed to, in
llama.cpp itself (traces/llamacpp/worker.py). Those ubatches, in the order llama.cpp ran
them (each prompt as one ubatch, then each decode token as its own), go through the llama.cpp
cost (solvers/llamacpp/cost.py `step_costs`, the cache replayed as b11669 runs it) and the
decode steps' stalls become the predicted decode tokens/s, B / (base step + stall) at B = 1
with the plan's hardware spec, with evaluate's bootstrap interval over the prompts
(solvers.judge.intervals). Every prompt ubatch is replayed, so the cache's state at each
decode step is the one llama.cpp had: at a layer where a prompt of more than 32 tokens
computes more than 32 (every layer but the last, which computes the output token only:
solvers/llamacpp/lru.py, "Which ubatches use it") it does not touch the cache and is left
out; at the others its tokens there are kept (`prompt_rows`).

The cache's log (`llama_moe_cache: ubatch <= 8: hits = H, misses = M, ...` at b11669,
`log_stats`) is compared with `log_stats` of the same replay: equal counts mean the build ran
the policy placer replays; other counts mean it runs another policy.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from placer.plan.llamacpp import plan_machine
from placer.plan.placement import Plan
from solvers.judge.intervals import (
    REPLICATES,
    Estimate,
    Units,
    attribute,
    estimable,
    line_figures,
    replicate_weights,
)
from solvers.llamacpp.builds import parse_build
from solvers.llamacpp.cost import Machine, Setup, step_costs, with_cache
from solvers.llamacpp.lru import MAX_BATCH, LlamaCppCache, layer_tokens, log_stats

POLICY = "b11669's LRU (solvers/llamacpp/lru.py, ggml-org/llama.cpp@4b060f27)"


@dataclass(frozen=True)
class Ubatches:
    """The ubatches of a bench pass as the replay takes them: tokens [S, W, L, k] (-1: none,
    W the widest replayed ubatch), decode [S] whether a step is a
    decode token, prompt [S] the prompt (sequence) index of each."""

    tokens: np.ndarray
    decode: np.ndarray
    prompt: np.ndarray

    @property
    def decode_steps(self) -> int:
        return int(self.decode.sum())


def ubatches_of(routing: list[tuple[int, np.ndarray]], warmup: int = 0) -> Ubatches:
    """`routing`: per sequence fed (prompt tokens P, experts [T, L, k] of its T tokens), the
    first `warmup` of them a warm-up whose decode steps are replayed but not counted."""
    rows, decode, prompt = [], [], []
    for fed, (p, experts) in enumerate(routing):
        index = fed - warmup
        experts = np.asarray(experts, dtype=np.int64)
        kept = prompt_rows(experts[:p])
        if kept is not None:
            rows.append(kept)
            decode.append(False)
            prompt.append(index)
        for t in range(p, len(experts)):
            rows.append(experts[t:t + 1])
            decode.append(index >= 0)
            prompt.append(index)
    width = max(len(r) for r in rows)
    num_layers, k = rows[0].shape[1:]
    tokens = np.full((len(rows), width, num_layers, k), -1, dtype=np.int64)
    for s, r in enumerate(rows):
        tokens[s, :len(r)] = r
    return Ubatches(tokens, np.asarray(decode), np.asarray(prompt))


def prompt_rows(experts: np.ndarray) -> np.ndarray | None:
    """A prompt ubatch's rows [P, L, k] as the replay takes them: whole where P <= 32; else
    only the layers that compute at most 32 of its tokens (those with an id there: the last
    layer's output token), each layer's tokens moved to the front in their order (a fetch
    reads one layer's ids in token order, so the rows of two layers need not be the same
    token's), the other layers -1: [W, L, k], W the most kept at a layer; None where no
    layer is kept. (The ubatch's own size then reads W: only ClassLRU's clock, not the
    bench's b11669 LRU, reads it.)"""
    if len(experts) <= MAX_BATCH:
        return experts
    present = (experts >= 0).any(axis=2)
    counts = present.sum(axis=0)
    keep = np.flatnonzero((counts > 0) & (counts <= MAX_BATCH))
    if not len(keep):
        return None
    out = np.full((int(counts[keep].max()), *experts.shape[1:]), -1, dtype=experts.dtype)
    for il in keep:
        out[:counts[il], il] = experts[present[:, il], il]
    return out


# The build whose cache the bench replays and whose flags it passes: the bundled binding's
# (placer.serve.llamacpp.binding.BUILD), also the policy the server driver's logs are
# compared with; a plan solved for a newer build is benched as b11669 runs it.
BENCH_BUILD = parse_build("b11669")


def bench_machine(plan: Plan, alignment: int | None) -> Machine:
    """The plan's machine with the buffer alignment of the device llama.cpp ran on (the
    cache pads its banks to it, so the slots follow it)."""
    machine = dataclasses.replace(plan_machine(plan), cache=BENCH_BUILD.cache)
    return dataclasses.replace(machine, alignment=int(alignment)) if alignment else machine


def option_setup(machine: Machine, name: str, host: np.ndarray, cache_mib: int) -> Setup:
    return with_cache(machine, name, np.asarray(host, dtype=bool), int(cache_mib))


def predict_decode(machine: Machine, setup: Setup, ub: Ubatches, num_prompts: int,
                   base_step_s: float, seed: int = 0, replicates: int = REPLICATES) -> dict:
    """Predicted decode figures of the decode steps of `ub` under `setup` (module docstring):
    tokens/s and its 95% interval over prompts (None under 5 prompts), the stall per step,
    and `estimate` (point and replicates of tokens/s) for paired ratios."""
    costs = step_costs(machine, setup, ub.tokens)[ub.decode]
    unit_of = ub.prompt[ub.decode][:, None]
    units = Units(unit_of, num_prompts, "prompts")
    weights = replicate_weights(num_prompts, replicates, seed)
    sums = attribute(unit_of, costs, num_prompts)
    figures, stall = line_figures(sums, units.tokens(), weights, 1, base_step_s)
    ok = estimable(units)
    return {"tokens_per_s": figures["tokens_per_s"],
            "tokens_per_s_ci95": figures["tokens_per_s_ci95"] if ok else None,
            "stall_ms_per_step": figures["stall_ms_per_step"],
            "base_step_ms": base_step_s * 1e3, "interval_over": units.over,
            "estimate": Estimate(1.0 / (base_step_s + stall.point),
                                 1.0 / (base_step_s + stall.replicates))}


def replayed_log(machine: Machine, setup: Setup, ub: Ubatches) -> dict[str, list[int]]:
    """{"ubatch <= 8" | "ubatch  > 8": [hits, misses, uploaded bytes]} of placer's replay
    of `ub` under `setup`, as llama.cpp logs them (empty without a cache)."""
    if not setup.cache_mib:
        return {}
    groups = machine.groups(setup.host)
    fetches = LlamaCppCache(groups, setup.slots, machine.top_k).replay(ub.tokens)
    return {name: list(v) for name, v in log_stats(fetches, layer_tokens(ub.tokens),
                                                   groups).items()}


def logs_agree(logged: dict[str, list], replayed: dict[str, list[int]]) -> bool:
    """Whether llama.cpp's logged (hits, misses) equal the replay's, line by line (a line
    llama.cpp did not print is one with no fetch)."""
    names = set(logged) | set(replayed)
    return all(list(logged.get(n, [0, 0])[:2]) == list(replayed.get(n, [0, 0])[:2])
               for n in names)


TERMS = ("sync_s", "expert_s", "latency_s")  # the spec figures a calibration fits


def with_figures(machine: Machine, sync_s: float, expert_s: float, latency_s: float
                 ) -> Machine:
    """`machine` with the host's per-layer sync, one expert's CPU seconds at one token (a
    curve of the model's largest expert, linear in tokens) and each card's per-copy latency
    set to these values (the rest as the plan's spec says)."""
    from solvers.cpu import ExpertCurve

    eb = float(np.asarray(machine.expert_bytes).max())
    host = dataclasses.replace(machine.host, sync_s=sync_s,
                               curves=(ExpertCurve(eb, (1,), (expert_s,)),))
    lat = tuple(latency_s for _ in machine.per_device(machine.latency_s))
    return dataclasses.replace(machine, host=host, latency_s=lat)


def cost_terms(machine: Machine, setup: Setup, ub: Ubatches) -> dict[str, float]:
    """The predicted stall per decode step, split into what each fitted figure multiplies
    (the cost is linear in each: solvers/llamacpp/cost.py): {"fixed_s": the rest (the
    activations' round trip, the misses' bytes over the link), "sync_s": layers synced per
    step, "expert_s": experts the CPU computes per step (at one token each), "latency_s":
    upload copies per step}. stall = fixed_s + sum(term x figure)."""
    def stall(*figures: float) -> float:
        m = with_figures(machine, *figures)
        return float(step_costs(m, setup, ub.tokens)[ub.decode][:, 0].mean())

    fixed = stall(0.0, 0.0, 0.0)
    out = {"fixed_s": fixed}
    for i, name in enumerate(TERMS):
        unit = [0.0, 0.0, 0.0]
        unit[i] = 1.0
        out[name] = stall(*unit) - fixed
    return out
