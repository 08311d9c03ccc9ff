"""The options `placer solve` and `placer plan` share, declared once: their help, and the one
function that turns their values into SolveOptions. A command gives each its own default
where the two differ (plan judges B = 1 and 8 by default). Also the dtypes of an inventory
estimated from a config.json, which `solve`, `inspect` and `evaluate --flags` take with
--config."""

from __future__ import annotations

from typing import Annotated

import typer

from placer.checkpoint.config import DTYPE_HELP
from placer.errors import PlacerError
from placer.plan.options import EXECUTIONS, SOLVERS, SolveOptions
from placer.units import parse_bytes
from solvers.cache_table import cache_policy_help

ExpertDtype = Annotated[str | None, typer.Option(
    help=f"With --config: expert weight dtype ({DTYPE_HELP}; default: the config's "
         "quantization method, else its torch_dtype, else bf16).")]
DenseDtype = Annotated[str | None, typer.Option(
    help=f"With --config: dense weight dtype ({DTYPE_HELP}; default: the config's "
         "torch_dtype, else bf16).")]
Solver = Annotated[str, typer.Option(
    help=f"One of {', '.join(SOLVERS)}: what places a static placement (--cache 0, or where "
         "the cache split's best candidate is static); a split with cache slots is chosen by "
         "replays instead, and the summary says so.")]
Budget = Annotated[str | None, typer.Option(
    help="VRAM per card for expert pages and the staging buffer, e.g. 20GiB (default: each "
         "card's free VRAM; a model that fits gets a plan with every expert resident).")]
Offload = Annotated[float | None, typer.Option(
    help="Share of each card's expert bytes that stays on the host, e.g. 0.3: pinned "
         "experts and cache slots hold at most the rest, the staging buffer comes on top.")]
Concurrency = Annotated[str, typer.Option(
    help="Concurrent sequences to optimize for and judge at, e.g. 1,8.")]
Weights = Annotated[str | None, typer.Option(
    help="Weight of each concurrency in the objective, e.g. 0.5,0.5.")]
Ep = Annotated[str, typer.Option(
    help="Expert-parallel homes: contiguous (vLLM/SGLang default) or balanced.")]
PageSize = Annotated[str | None, typer.Option(
    help="Cut experts into pages of this size (default: one page per expert).")]
Robust = Annotated[bool, typer.Option(
    help="Hold up on traffic the plan was not solved on: minimize the mean regret (stall over "
         "that traffic's own best) across the --traces sets and --concurrency values, never "
         "worse than layer offload on any of them; a cache split also counts each set's "
         "held-out folds with their experts renamed (traffic unlike the calibration, e.g. "
         "another task).")]
TimeLimit = Annotated[float, typer.Option(
    help="Seconds for the ILP (--solver ilp, --robust's MILP) where it places the plan; the "
         "cache split's replays (--cache auto or N) are not bounded by it.")]
Steps = Annotated[int | None, typer.Option(
    help="Sample this many decode steps per profile and concurrency instead of using every "
         "calibration token (imported counts are always sampled: 256 by default).")]
Cache = Annotated[str, typer.Option(
    help="Cache slots per card for staged experts, beside the pinned ones: auto (split each "
         "card's budget between pins and per-layer slots, judged on held-out folds of the "
         "calibration sequences), N (N slots per card, the rest pinned) or 0 (a static "
         "placement by --solver).")]
CachePolicy = Annotated[str, typer.Option(help=cache_policy_help())]
Execution = Annotated[str, typer.Option(
    help=f"How a cold expert runs: {' | '.join(EXECUTIONS)}. stage: its cold bytes are "
         "copied to its GPU, which computes it (placer's runtime); cpu: the host CPU computes "
         "it from host RAM (llama.cpp -ot / --n-cpu-moe, KTransformers; needs the spec's "
         "\\[host] table).")]
Engine = Annotated[str | None, typer.Option(
    help="Whose runtime the plan is for: placer (pinned experts, staging and placer's cache; "
         "emit + serve) or llamacpp (which MoE layers llama.cpp keeps in host memory, -ot / "
         "-ncmoe, and how big its --moe-cache-mib cache is; several cards by -ts; needs the "
         "spec's \\[host] table; docs/llamacpp.md). Default: placer (`placer plan`: llamacpp "
         "for a GGUF model).")]
LlamacppVersion = Annotated[str | None, typer.Option(
    help="With --engine llamacpp: the llama.cpp build to plan for (bNNNNN, vX.Y.Z or the "
         "first line of `llama-server --version`): its cache policy and flags (default: the "
         "newest policy known, said in the output).")]

Ctx = Annotated[int | None, typer.Option(
    "--ctx", help="The context (tokens) to reserve KV cache for: reserved_kv becomes the "
                  "model's KV cache at it (from its config: grouped-query heads, MLA, "
                  "sliding windows), in place of the spec's, and `export llamacpp` prints "
                  "-c (default: the spec's reserves, and its \\[context] if any).")]
KvType = Annotated[str | None, typer.Option(
    "--kv-type", help="The KV cache type, llama.cpp's -ctk/-ctv: f16 (default), q8_0, q4_0 "
                      "(also bf16, f32, q4_1, q5_0, q5_1, iq4_nl).")]


def solve_options(*, solver: str, budget: str | None, offload: float | None,
                  concurrency: str, weights: str | None, ep: str, page_size: str | None,
                  robust: bool, time_limit: float, seed: int, steps: int | None, cache: str,
                  cache_policy: str, execution: str) -> SolveOptions:
    """SolveOptions from the shared options' values as typed (parsed, not yet checked:
    placer.plan.engine.check_solve checks them)."""
    from placer.commands.common import parse_list

    return SolveOptions(
        solver=solver, budget=None if budget is None else parse_bytes(budget, "--budget"),
        offload=offload, concurrency=tuple(parse_list(concurrency, int, "--concurrency")),
        weights=None if weights is None else tuple(parse_list(weights, float, "--weights")),
        ep=ep, page_size=None if page_size is None else parse_bytes(page_size, "--page-size"),
        robust=robust, time_limit=time_limit, seed=seed, num_steps=steps,
        execution=execution, cache=parse_cache(cache), cache_policy=cache_policy)


def parse_cache(value: str) -> int | None:
    """--cache: auto (None) or a slot count."""
    if value.strip().lower() == "auto":
        return None
    try:
        return int(value)
    except ValueError:
        raise PlacerError(f"--cache: expected auto or a number of slots per card, not "
                          f"{value!r}") from None
