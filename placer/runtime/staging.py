"""One card's staging: copies selected cold experts from host memory into device memory.

Each card has one staging buffer, preallocated at the size the plan gives it, and optionally
cache slots (each as large as the card's largest cold part) under the plan's cache policy
(any of `solvers.cache.POLICIES`, per layer or pooled, with the plan's `cache_params`), the
very class the replay predicts with (`solvers.cache`), on the runtime's token clock. A fetch
stages exactly the cold bytes of the selected experts that are not cached: one copy per
expert (its cold part is one contiguous host range), into a cache slot when the policy admits
it, else into the staging buffer at a `ALIGN`-aligned offset. Where the layers' tables hold
the slots as rows (placer.runtime.tables), a hit needs nothing from here and every miss lands
in the buffer for the table to keep. On CUDA the copies run on a side stream from pinned
memory; the compute stream waits on an event, and the side stream first waits for the
compute stream, so a buffer is never overwritten while earlier compute still reads it.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence

import torch

from placer.runtime.counters import StagingCounters
from solvers.cache import CachePolicy, Lookup

ALIGN = 256  # bytes; every staged part starts at a multiple (any dtype's view is aligned)


def align_up(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


class CardStager:
    """Staging for card `card` on `device` (see module docstring)."""

    def __init__(self, card: int, device: torch.device, *, staging_bytes: int,
                 slot_bytes: int, cache: CachePolicy, counters: StagingCounters) -> None:
        self.card = card
        self.device = device
        self.counters = counters
        self.buffer = torch.empty(staging_bytes, dtype=torch.uint8, device=device)
        # The slots are allocated by the first fetch that caches into them: where the layers'
        # tables hold the slots as rows (placer.runtime.tables), never.
        self.slot_shape = (int(cache.slots[card]), align_up(slot_bytes))
        self.slots = torch.empty((0, self.slot_shape[1]), dtype=torch.uint8, device=device)
        self.cache = cache
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        # a prefetch's copy lands here when a table keeps it (copy_ahead): one expert at a
        # time, apart from the staging buffer, which the compute stream may still read
        self.ahead_buffer = torch.empty(0, dtype=torch.uint8, device=device)
        self.grown = 0  # fetches whose staged bytes exceeded the buffer, which then grew

    def stage(self, row: int, keys: Sequence[int], cold: Sequence[torch.Tensor], *,
              into_slots: bool = True, now: int | None = None
              ) -> tuple[list[Lookup], list[torch.Tensor | None]]:
        """The cache's answer for each selected cold part and its device bytes: `cold[i]`
        (host uint8) is that of expert key `keys[i]` (row * experts per layer + expert, as
        the cache numbers them).

        Misses are staged (counted at MoE layer row `row`), hits come from their cache slot.
        With `into_slots` False the layer's slots are held elsewhere (its table's rows,
        placer.runtime.tables): every miss is staged into the staging buffer for the holder
        to keep, and a hit has no view here (None). The views stay valid until this card's
        next fetch. `now`: the token clock (tokens served, this forward's included) for the
        policies that age by it (classlru, learned; None: no tokens since the last fetch).
        """
        lookups = self.cache.lookup(self.card, keys, now)
        slotted = [into_slots and f.slot is not None for f in lookups]
        if any(slotted) and not self.slots.numel():
            self.slots = torch.empty(self.slot_shape, dtype=torch.uint8, device=self.device)
        need = sum(align_up(src.numel()) for src, f, s in zip(cold, lookups, slotted, strict=True)
                   if not (f.hit or s))
        if need > self.buffer.numel():
            self.buffer = torch.empty(need, dtype=torch.uint8, device=self.device)
            self.grown += 1
        views: list[torch.Tensor | None] = []
        copies, offset = [], 0
        for src, found, in_slot in zip(cold, lookups, slotted, strict=True):
            view = None
            if in_slot:
                view = self.slots[found.slot, :src.numel()]
            elif not found.hit:
                view = self.buffer[offset:offset + src.numel()]
                offset += align_up(src.numel())
            if not found.hit:
                copies.append((view, src))
            views.append(view)
        self._copy(row, copies)
        self.counters.record(row, self.card, nbytes=sum(s.numel() for _, s in copies),
                             copies=len(copies), hits=sum(f.hit for f in lookups))
        return lookups, views

    def _copy(self, row: int, copies: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        if not copies:
            return
        if self.stream is None:
            start = time.perf_counter()
            for dst, src in copies:
                dst.copy_(src)
            self.counters.add_seconds(row, self.card, time.perf_counter() - start)
            return
        compute = torch.cuda.current_stream(self.device)
        begin, done = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        self.stream.wait_stream(compute)
        with torch.cuda.stream(self.stream):
            begin.record(self.stream)
            for dst, src in copies:
                dst.copy_(src, non_blocking=True)
            done.record(self.stream)
        compute.wait_event(done)
        self.counters.add_events(row, self.card, begin, done)

    def copy_ahead(self, row: int, src: torch.Tensor, slot: int, *, into_slot: bool,
                   ready: torch.cuda.Event | None = None) -> torch.Tensor:
        """Prefetch one cold part `src` (host uint8) for MoE layer row `row`: into cache slot
        `slot` (`into_slot`), else into the prefetch buffer for a table to keep (the caller
        does, under `ahead`, before the next copy_ahead). On CUDA on the copy stream, after
        the compute stream's `ready` event (None: all the compute queued so far); on a CPU
        device now. Its device bytes."""
        if into_slot:
            if not self.slots.numel():
                self.slots = torch.empty(self.slot_shape, dtype=torch.uint8, device=self.device)
            dst = self.slots[slot, :src.numel()]
        else:
            if self.ahead_buffer.numel() < src.numel():
                self.ahead_buffer = torch.empty(self.slot_shape[1], dtype=torch.uint8,
                                                device=self.device)
            dst = self.ahead_buffer[:src.numel()]
        if self.stream is not None:
            compute = torch.cuda.current_stream(self.device)
            if ready is None:
                self.stream.wait_stream(compute)
            else:
                self.stream.wait_event(ready)
        with self.ahead():
            dst.copy_(src, non_blocking=self.stream is not None)
        self.counters.ahead_bytes[row, self.card] += src.numel()
        return dst

    @contextlib.contextmanager
    def ahead(self) -> Iterator[None]:
        """Device work of a prefetch: on the copy stream on CUDA (in order after its copy)."""
        if self.stream is None:
            yield
        else:
            with torch.cuda.stream(self.stream):
                yield

    def landed(self) -> torch.cuda.Event | None:
        """An event after the copy stream's work so far (None on a CPU device)."""
        if self.stream is None:
            return None
        event = torch.cuda.Event()
        event.record(self.stream)
        return event
