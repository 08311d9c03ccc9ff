"""Which MoE layers llama.cpp should keep in host memory, and how much of the VRAM they free
to give to `--moe-cache-mib`: a search judged by the replay (solvers/llamacpp/cost.py).

Candidates: the host layers are the first `count` of a ranking, for `count` from the fewest
that let the other layers' experts fit their cards up to every layer, and the cache takes a share
(0, 1/4, 1/2, all) of the VRAM those layers free. Two rankings, each fitted on the steps it
is given: `cpu` (host first the layers whose selected experts cost the CPU least per byte:
the right set without a cache) and `cache` (host first the layers a per-layer LRU of a
quarter of their experts misses least: locality, which is what the cache lives on; the
real cache is one LRU per group, shared by its layers, and the replay judges that). With
several GPUs a ranking first puts on the host, per GPU, the fewest of that GPU's layers in
its order that let the rest fit (fit_first), then goes on in its order. The
`-ncmoe N` baseline is the first N MoE layers, N the fewest that fit.

Each cached candidate is also tried with the build's `--moe-cache-cpu-share` values
(`Space.cpu_shares`: CPU_SHARES, up to upstream's 0.95 and 0.98; 0 alone for a build without
the flag), and every candidate
with its host experts mmap'd (llama.cpp's default) and pinned (`-lm none`): pinned experts
upload faster but take host RAM for the whole model (refused where the spec's host_ram is
less than the host layers' bytes). Upstream's tuner grid (`tuner_grid`: every MoE layer on
the host, `-cmoe`, x TUNER_SIZES x the tuner's shares, mmap'd and pinned) is among the
candidates too, so the choice is never worse than the tuner's pick on the search's own
objective. A candidate with every MoE layer on the host is ranked "ncmoe" whatever ranking
made it (the order no longer matters), so equal setups are judged once. A build without the
cache (before b11480) gets no cached candidate. The cache replay of a (host layers, slots) is
shared by its shares and pinnings.

Every candidate is judged on held-out folds of the calibration sequences: for each fold the
rankings are fitted on the other folds and the candidate replayed on the fold itself, so a
setup is chosen on traffic it was not fitted on. The objective is predicted decode tok/s,
B / (base step + mean stall), weighted over the scenarios (traffic x concurrency).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from solvers.cache import even_quotas, make_policy
from solvers.cache.replay import Requests
from solvers.errors import SolverError
from solvers.llamacpp.cost import (
    MIB,
    HostCosts,
    Machine,
    Setup,
    host_costs,
    step_costs,
    with_cache,
)
from traces.storing.profile import step_mask

SHARES = (0.0, 0.25, 0.5, 1.0)  # of the VRAM the host layers free, given to the cache
COUNTS = 5                        # host-layer counts tried, from the fewest to every layer
RANKINGS = ("cpu", "cache")
CPU_SHARES = (0.0, 0.5, 0.9, 0.95, 0.98)  # --moe-cache-cpu-share values tried where it exists
TUNER_SHARES = (0.0, 0.5, 0.8, 0.9, 0.95, 0.98)  # scripts/moe-cache-tune.py SHARES at b12191
TUNER_SIZES = (0.25, 0.5, 0.75, 1.0)   # of the VRAM -cmoe frees (its sizes: not readable)


@dataclass(frozen=True)
class Space:
    """What the build and the box allow: the cache at all, its CPU shares, and pinning."""

    cache: bool = True
    cpu_shares: tuple[float, ...] = (0.0,)
    tuner_shares: tuple[float, ...] = (0.0,)  # the tuner grid's (TUNER_SHARES where it has them)
    pinned: tuple[bool, ...] = (False, True)
    offloads: bool = True  # some step is op-offloaded (search sets it from the traffic)


@dataclass(frozen=True)
class Scenario:
    """One calibration traffic at one concurrency: all of its steps (tokens [S, B, L, k],
    seqs [S, B]), per fold (train tokens, held-out tokens), and its weight and base step."""

    name: str
    tokens: np.ndarray
    seqs: np.ndarray
    folds: list[tuple[np.ndarray, np.ndarray]]
    weight: float
    base_step_s: float


@dataclass(frozen=True)
class Candidate:
    """A point of the search: the first `count` layers of ranking `rank` on the host, and
    `share` of the VRAM they free as the cache."""

    rank: str
    count: int
    share: float
    cpu_share: float = 0.0
    pinned: bool = False

    @property
    def label(self) -> str:
        cache = "no cache" if self.share == 0 else f"cache {self.share:g} of freed VRAM"
        cpu = f", cpu share {self.cpu_share:g}" if self.cpu_share else ""
        return (f"{self.count} host layers by {self.rank}, {cache}{cpu}, "
                f"{'pinned' if self.pinned else 'mmap'}")


def rank_layers(machine: Machine, rank: str, steps: list[tuple[np.ndarray, float]]
                ) -> np.ndarray:
    """[L] MoE layers, the first to go to the host first, under ranking `rank` fitted on
    `steps` ([(tokens, weight)]); "ncmoe": in order."""
    num_layers, experts = machine.expert_bytes.shape
    if rank == "ncmoe":
        return np.arange(num_layers)
    cost = np.zeros(num_layers)
    for tokens, weight in steps:
        if rank == "cpu":
            cost += weight * host_costs(machine, tokens).stall.mean(axis=0)
        else:
            requests = Requests.of(step_mask(tokens, experts))
            lru = make_policy("lru", even_quotas([num_layers * max(1, experts // 4)],
                                                 num_layers), num_layers * experts)
            misses = requests.misses(lru, np.ones((num_layers, experts), dtype=bool),
                                     np.zeros((num_layers, experts), dtype=np.int64))
            cost += weight * misses.sum(axis=1) / max(1, len(tokens))
    per_byte = cost / np.maximum(machine.layer_bytes, 1)
    return fit_first(machine, np.lexsort((np.arange(num_layers), per_byte)))


def fit_first(machine: Machine, order: np.ndarray) -> np.ndarray:
    """`order` with, first, each GPU's leading layers in it that must go to the host for the
    rest of that GPU's layers to fit it (in their order), then the others: so the fewest host
    layers of the ranking are the fewest per GPU, not a prefix that takes layers from a GPU
    with room while another still overflows. One GPU: `order` itself."""
    capacity = machine.per_device(machine.capacity)
    device = machine.layer_device[order]
    sizes = machine.layer_bytes[order]
    first = np.zeros(len(order), dtype=bool)
    for d in range(len(capacity)):
        mine = np.flatnonzero(device == d)
        left = sizes[mine].sum() - np.concatenate([[0], np.cumsum(sizes[mine])])
        first[mine[:int(np.flatnonzero(left <= capacity[d])[0])]] = True
    return np.concatenate([order[first], order[~first]])


def fewest_host(machine: Machine, order: np.ndarray) -> int:
    """The fewest leading layers of `order` on the host that let the rest fit their GPUs
    (each GPU its own layers: Machine.layer_device)."""
    capacity = machine.per_device(machine.capacity)
    sizes = np.zeros((len(order), len(capacity)))
    sizes[np.arange(len(order)), machine.layer_device[order]] = machine.layer_bytes[order]
    gpu = sizes.sum(axis=0) - np.vstack([np.zeros(len(capacity)), np.cumsum(sizes, axis=0)])
    return int(np.flatnonzero((gpu <= capacity).all(axis=1))[0])


def host_mask(order: np.ndarray, count: int) -> np.ndarray:
    out = np.zeros(len(order), dtype=bool)
    out[order[:count]] = True
    return out


def setup_of(machine: Machine, name: str, order: np.ndarray, count: int, share: float,
             cpu_share: float = 0.0, pinned: bool = False, host_ram: int = 0
             ) -> Setup | None:
    """The setup of a candidate (None where llama.cpp would refuse its cache, or pinned host
    experts would not fit `host_ram` bytes; 0: not known, not checked)."""
    host = host_mask(order, count)
    if pinned and host_ram and machine.layer_bytes[host].sum() > host_ram:
        return None
    mib = int(share * machine.bank_room(host) // MIB)
    if share > 0 and mib == 0:
        return None
    try:
        return with_cache(machine, name, host, mib, cpu_share if mib else 0.0, pinned)
    except SolverError:
        return None


def tuner_grid(num_layers: int, shares: tuple[float, ...],
               pinned: tuple[bool, ...] = (False,)) -> list[Candidate]:
    """Upstream's tuner grid (scripts/moe-cache-tune.py at b12191): every MoE layer on the host
    (`-cmoe`) x TUNER_SIZES of the VRAM that frees x `shares` (the build's: 0 alone without
    --moe-cache-cpu-share), with its host experts as `pinned` says (the tuner runs the
    user's command: mmap'd by default, pinned with -lm none)."""
    return [Candidate("ncmoe", num_layers, size, share, p)
            for size in TUNER_SIZES for share in shares for p in pinned]


def candidates(machine: Machine, orders: dict[str, np.ndarray], space: Space = Space()
               ) -> list[Candidate]:
    """Every candidate of the search (module docstring)."""
    num_layers = machine.expert_bytes.shape[0]
    base = [Candidate("ncmoe", fewest_host(machine, orders["ncmoe"]), 0.0)]
    for rank in RANKINGS:
        low = fewest_host(machine, orders[rank])
        counts = sorted({int(round(c)) for c in np.linspace(low, num_layers, COUNTS)})
        base.append(Candidate(rank, low, 0.0))
        if space.cache:
            base += [Candidate(rank, c, s) for c in counts if c > 0 for s in SHARES[1:]]
    # without a cache, pinning changes only op-offloaded copies (steps of offload_min_batch
    # tokens or more): where no step is that large, mmap'd alone is tried
    plain = space.pinned if space.offloads else (False,)
    out = [Candidate("ncmoe" if c.count == num_layers else c.rank, c.count, c.share, f, p)
           for c in dict.fromkeys(base)
           for f in (space.cpu_shares if c.share else (0.0,))
           for p in (space.pinned if c.share else plain)]
    if space.cache:
        out += tuner_grid(num_layers, space.tuner_shares, space.pinned)
    return list(dict.fromkeys(out))


def objective(machine: Machine, setup: Setup, held: list[tuple[np.ndarray, HostCosts,
              float, float]], replays: dict | None = None) -> float:
    """Predicted tok/s, weighted: sum of weight x B / (base + mean stall) over `held`
    [(tokens, their HostCosts, weight, base step seconds)]; `replays`: step_costs' memo."""
    total = 0.0
    for tokens, costs, weight, base in held:
        stall = (float(step_costs(machine, setup, tokens, costs, replays)[:, 0].mean())
                 if len(tokens) else 0.0)
        total += weight * tokens.shape[1] / (base + stall)
    return total


@dataclass(frozen=True)
class SearchResult:
    """The chosen candidate, its rankings fitted on all the traffic, and every candidate's
    held-out objective (tok/s, None where refused)."""

    best: Candidate
    orders: dict[str, np.ndarray]
    scores: dict[Candidate, float | None]


def search(machine: Machine, scenarios: list[Scenario], space: Space = Space(),
           host_ram: int = 0) -> SearchResult:
    """The candidate with the best held-out objective (module docstring); `host_ram`: the
    host's bytes for pinned experts (0: not known)."""
    folds = len(scenarios[0].folds)
    big = max(sc.tokens.shape[1] for sc in scenarios)
    space = dataclasses.replace(space, offloads=bool(machine.host.offloads(big)))
    totals: dict[Candidate, float | None] = {}
    for f in range(folds):
        train = [(sc.folds[f][0], sc.weight) for sc in scenarios]
        orders = {r: rank_layers(machine, r, train) for r in (*RANKINGS, "ncmoe")}
        held = [(sc.folds[f][1], host_costs(machine, sc.folds[f][1]), sc.weight,
                 sc.base_step_s) for sc in scenarios]
        replays: dict = {}
        for cand in candidates(machine, orders, space):
            setup = setup_of(machine, cand.label, orders[cand.rank], cand.count, cand.share,
                             cand.cpu_share, cand.pinned, host_ram)
            if setup is None:
                totals[cand] = None
            elif totals.get(cand, 0.0) is not None:
                totals[cand] = (totals.get(cand, 0.0)
                                + objective(machine, setup, held, replays) / folds)
    scored = {c: v for c, v in totals.items() if v is not None}
    top = max(scored.values())
    # ties (to 1e-9, float sums in another order) go to no cache, then to plain -ncmoe N,
    # then to no CPU share and to mmap'd experts (llama.cpp's defaults: fewer flags)
    best = max(scored, key=lambda c: (round(scored[c] / top, 9), -c.share, c.rank == "ncmoe",
                                      -c.cpu_share, not c.pinned))
    whole = [(sc.tokens, sc.weight) for sc in scenarios]
    orders = {r: rank_layers(machine, r, whole) for r in (*RANKINGS, "ncmoe")}
    return SearchResult(best, orders, totals)
