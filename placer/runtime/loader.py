"""Load a placed directory: resident pages on the device, cold parts in host memory.

`load_placed` reads the manifest, puts every card file's tensors on the device through
`safe_open` (whole resident tensors under their own names; resident pages as uint8), keeps
every host file's cold parts in (pinned, on CUDA) host memory, and gives each card a
`CardStager` with the staging buffer the manifest sizes (its cache slots are the rows of the
layers' tables once those are bound: `hold`). `fetch` rebuilds the selected
experts' tensors from their byte streams: bytes that lie in one resident piece or in the
staged cold part are used in place (views); a tensor that straddles the resident/cold
boundary of a partly resident expert is joined with one device-side copy of its resident
head. Only host-to-device bytes count as staged. With `prefetch` the cache is a
`PrefetchCache` and `prefetch` copies a layer's predicted experts ahead
(placer/runtime/prefetch.py).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch
from safetensors import safe_open

from placer.placed.manifest import read_manifest
from placer.plan.placement import Plan, plan_caches, plan_from_json, plan_policy, plan_quotas
from placer.predict.copy_link import plan_link
from placer.runtime.counters import StagingCounters
from placer.runtime.prefetch import PrefetchCache
from placer.runtime.staging import CardStager
from solvers.cache import Lookup
from solvers.cache.prefetch import Link, Prefetch

TORCH_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16,
                "BF16": torch.bfloat16, "F8_E4M3": torch.float8_e4m3fn,
                "F8_E5M2": torch.float8_e5m2, "I64": torch.int64, "I32": torch.int32,
                "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool}
EXPERT_PREFIX = re.compile(r"^.*\.experts\.(?:\d+\.)?")


@dataclass(frozen=True)
class ExpertBytes:
    """Where one expert's stream lives: resident pieces (stream offset, device uint8) and
    its cold suffix (host uint8, None when fully resident); `whole` maps tensor name to the
    original-named device tensor when the card file keeps them whole."""

    card: int
    tensors: tuple[dict, ...]
    resident: tuple[tuple[int, torch.Tensor], ...]
    resident_bytes: int
    cold: torch.Tensor | None
    whole: Mapping[str, torch.Tensor] | None


def as_bytes(t: torch.Tensor) -> torch.Tensor:
    """A tensor's bytes as a flat uint8 view."""
    return t.reshape(-1).view(torch.uint8)


def typed(u8: torch.Tensor, dtype: str, shape: Sequence[int]) -> torch.Tensor:
    """uint8 bytes as a tensor of `dtype` and `shape` (a view where alignment allows)."""
    try:
        return u8.view(TORCH_DTYPES[dtype]).reshape(tuple(shape))
    except RuntimeError:  # storage offset not a multiple of the element size
        return u8.clone().view(TORCH_DTYPES[dtype]).reshape(tuple(shape))


@dataclass(frozen=True)
class Staged:
    """One selected cold expert after its card's fetch: the cache's answer `found` and the
    expert's weights on the device as this fetch staged them (None for a hit whose slot is a
    table row: the table holds it)."""

    card: int
    found: Lookup
    weights: Mapping[str, torch.Tensor] | None


class SlotRows(Protocol):
    """A layer's cache slots held as rows of its table (placer.runtime.tables)."""

    def keep(self, card: int, slot: int, weights: Mapping[str, torch.Tensor]) -> None:
        """Write the expert just admitted into `card`'s slot `slot` into that slot's row."""
        ...

    def weights(self, card: int, slot: int) -> Mapping[str, torch.Tensor]:
        """Views of the expert `card`'s slot `slot` holds, one per checkpoint tensor."""
        ...


class PlacedRuntime:
    """A placed directory loaded for every card on one device (see module docstring)."""

    def __init__(self, placed: Path, device: torch.device, cache_slots: int | None = None,
                 prefetch: Prefetch | None = None, link: Link | None = None) -> None:
        self.manifest = read_manifest(placed)
        self.plan: Plan = plan_from_json(self.manifest)
        self.device = device
        placed = Path(placed)
        device_tensors: dict[tuple[str, str], torch.Tensor] = {}
        host_tensors: dict[tuple[str, str], torch.Tensor] = {}
        for f in self.manifest["files"]:
            on_card = f["kind"] == "card"
            target = str(device) if on_card else "cpu"
            with safe_open(placed / f["name"], "pt", device=target) as st:
                for name in st.keys():
                    if name.startswith("pad."):
                        continue
                    t = st.get_tensor(name)
                    if not on_card and device.type == "cuda":
                        t = t.pin_memory()
                    (device_tensors if on_card else host_tensors)[(f["name"], name)] = t
        self.experts: dict[tuple[int, int], ExpertBytes] = {}
        for ex in self.manifest["experts"]:
            resident = tuple(
                (page["offset"] + sum(q["length"] for q in page["pieces"][:i]),
                 as_bytes(device_tensors[(p["file"], p["tensor"])])[
                     p["start"]:p["start"] + p["length"]])
                for page in ex["pages"] if page["resident"]
                for i, p in enumerate(page["pieces"]))
            cold = None if ex["cold"] is None else \
                host_tensors[(ex["cold"]["file"], ex["cold"]["tensor"])]
            whole = None
            names = [t["name"] for t in ex["tensors"]]
            files = {p["file"] for page in ex["pages"] for p in page["pieces"]}
            if ex["cold"] is None and all(p["tensor"] in names for page in ex["pages"]
                                          for p in page["pieces"]):
                (file,) = files
                whole = {EXPERT_PREFIX.sub("", n): device_tensors[(file, n)] for n in names}
            self.experts[(ex["layer"], ex["expert"])] = ExpertBytes(
                ex["card"], tuple(ex["tensors"]), resident, ex["resident_bytes"], cold, whole)
        moe_layers = self.plan.moe_layers
        self.row = {layer: i for i, layer in enumerate(moe_layers)}
        self.counters = StagingCounters(tuple(moe_layers), len(self.plan.cards),
                                        prefetching=prefetch is not None)
        cold_max = [max((e.cold.numel() for e in self.experts.values()
                         if e.card == c.index and e.cold is not None), default=0)
                    for c in self.plan.cards]
        self.prefetching = prefetch is not None
        self.cache = plan_caches(self.plan, cache_slots) if prefetch is None else PrefetchCache(
            plan_quotas(self.plan, cache_slots), len(moe_layers) * self.plan.experts_per_layer,
            pooled=plan_policy(self.plan).options["pooled"],
            link=plan_link(self.plan) if link is None else link, prefetch=prefetch,
            counters=self.counters)
        self.landing: dict[tuple[int, int], torch.cuda.Event] = {}  # (card, key): prefetch
        # the token clock of the caches (solvers/cache/kernels.py): the tokens of every forward
        # so far, this one's included; a forward starts at a MoE layer no later than the last
        self.now, self._last_row = 0, len(moe_layers)
        self.holders: dict[int, SlotRows] = {}  # layer -> the table holding its slots
        self.stagers = [CardStager(c.index, device, staging_bytes=c.staging_bytes,
                                   slot_bytes=cold_max[c.index], cache=self.cache,
                                   counters=self.counters) for c in self.plan.cards]

    def tensor_names(self, layer: int) -> tuple[str, ...]:
        first = self.experts[(layer, 0)]
        return tuple(EXPERT_PREFIX.sub("", t["name"]) for t in first.tensors)

    def hold(self, layer: int, rows: SlotRows) -> None:
        """Let `rows` hold layer `layer`'s cache slots from now on (the cache starts empty;
        the stagers never allocate slots of their own for it)."""
        self.holders[layer] = rows
        self.cache.reset()
        self.now, self._last_row = 0, len(self.row)

    def advance(self, layer: int, tokens: int) -> None:
        """Decoder layer `layer`'s experts compute `tokens` tokens now: at a forward's first
        MoE layer the token clock advances by them (the caches' `now`)."""
        row = self.row[layer]
        if row <= self._last_row:
            self.now += int(tokens)
        self._last_row = row

    def stage(self, layer: int, experts: Sequence[int]) -> list[Staged]:
        """Stage the cold parts of `experts` (distinct, each with cold bytes) of decoder
        layer `layer`: one copy per miss, per their home card. Where a table holds the
        layer's slots, an admitted miss is kept in its slot's row there."""
        holder = self.holders.get(layer)
        by_card: dict[int, list[int]] = {}
        for e in experts:
            by_card.setdefault(self.experts[(layer, e)].card, []).append(e)
        row, width = self.row[layer], self.plan.experts_per_layer
        out: dict[int, Staged] = {}
        for card, ids in by_card.items():
            found, views = self.stagers[card].stage(
                row, [row * width + e for e in ids], [self.experts[(layer, e)].cold for e in ids],
                into_slots=holder is None, now=self.now)
            self._await(card, row, [row * width + e for e, f in zip(ids, found, strict=True)
                                    if f.hit])
            for e, f, view in zip(ids, found, views, strict=True):
                weights = None if view is None else self._tensors(self.experts[(layer, e)], view)
                if holder is not None and weights is not None and f.slot is not None:
                    holder.keep(card, f.slot, weights)
                out[e] = Staged(card, f, weights)
        return [out[e] for e in experts]

    def _await(self, card: int, row: int, hits: list[int]) -> None:
        """On CUDA: the compute stream waits for the prefetch copies of the keys `hits`
        found in `card`'s cache that are still landing (counted late_measured at `row`)."""
        for key in hits:
            event = self.landing.pop((card, key), None)
            if event is not None:
                self.counters.late_measured[row, card] += not event.query()
                torch.cuda.current_stream(self.device).wait_event(event)

    def prefetch(self, layer: int, experts: Sequence[int],
                 ready: torch.cuda.Event | None = None) -> None:
        """Prefetch decoder layer `layer`'s predicted `experts` (best first): per home card,
        those with cold bytes, through the cache's `issue` (placer/runtime/prefetch.py),
        each copied into its slot (kept in its table row where a table holds the layer's
        slots); on CUDA after `ready` (None: the compute queued so far)."""
        row, width = self.row[layer], self.plan.experts_per_layer
        holder = self.holders.get(layer)
        by_card: dict[int, list[int]] = {}
        for e in dict.fromkeys(int(e) for e in experts):
            if self.experts[(layer, e)].cold is not None:
                by_card.setdefault(self.experts[(layer, e)].card, []).append(e)
        for card, ids in by_card.items():
            stager = self.stagers[card]
            for key, slot in self.cache.issue(card, row, ids):
                eb = self.experts[(layer, key - row * width)]
                view = stager.copy_ahead(row, eb.cold, slot, into_slot=holder is None,
                                         ready=ready)
                if holder is not None:
                    with stager.ahead():
                        holder.keep(card, slot, self._tensors(eb, view))
                event = stager.landed()
                if event is not None:
                    self.landing[(card, key)] = event

    def fetch(self, layer: int, experts: Sequence[int]) -> list[Mapping[str, torch.Tensor]]:
        """The weights of `experts` of decoder layer `layer` on the device (cold parts of
        the selected experts staged, one copy each, per their home card)."""
        cold = [e for e in experts if self.experts[(layer, e)].cold is not None]
        staged = dict(zip(cold, self.stage(layer, cold), strict=True))
        holder = self.holders.get(layer)
        out = []
        for e in experts:
            s = staged.get(e)
            if s is None:
                out.append(self._tensors(self.experts[(layer, e)], None))
            elif holder is not None and s.found.slot is not None:
                out.append(holder.weights(s.card, s.found.slot))
            else:
                out.append(s.weights)
        return out

    def _tensors(self, eb: ExpertBytes, cold: torch.Tensor | None) -> dict[str, torch.Tensor]:
        if eb.whole is not None:
            return dict(eb.whole)
        segments = [*eb.resident, *([(eb.resident_bytes, cold)] if cold is not None else [])]
        out = {}
        for t in eb.tensors:
            lo, hi = t["stream_offset"], t["stream_offset"] + t["length"]
            parts = [seg[max(lo, off) - off:min(hi, off + seg.numel()) - off]
                     for off, seg in segments if off < hi and off + seg.numel() > lo]
            u8 = parts[0] if len(parts) == 1 else torch.cat(parts)
            out[EXPERT_PREFIX.sub("", t["name"])] = typed(u8, t["dtype"], t["shape"])
        return out

    def cards_json(self) -> list[dict]:
        return [{"card": c.index, "resident_bytes": c.resident_bytes,
                 "staging_bytes": c.staging_bytes, "cache_slots": int(self.cache.slots[c.index]),
                 "cache_policy": self.cache.name} for c in self.plan.cards]


def load_placed(placed: Path, *, device: torch.device | str = "cpu",
                cache_slots: int | None = None, prefetch: Prefetch | None = None,
                link: Link | None = None) -> PlacedRuntime:
    """Load the placed directory `placed` for every card onto `device`, with the cache slots
    its manifest gives (`cache_slots`: that many on every card instead); `prefetch`: prefetch
    with these parameters (placer/runtime/prefetch.py; None: stage on demand only), on the
    clock of `link` (None: the plan's card 0, placer.predict.copy_link)."""
    return PlacedRuntime(Path(placed), torch.device(device), cache_slots, prefetch, link)
