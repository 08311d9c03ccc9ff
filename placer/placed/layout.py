"""The byte layout of a placed directory's safetensors files: which source bytes go where.

card<N>.safetensors holds card N's resident expert bytes: a fully resident expert stored
as whole per-expert tensors keeps each under its original name, dtype and shape; anything
else resident (pages of a partly resident expert, slices of fused 3D tensors) is one uint8
tensor per page, `res.L<layer>.E<expert>.P<page>`. host<G>.safetensors holds, for the cards of
host-link group G, each expert's cold suffix as ONE uint8 tensor `cold.L<layer>.E<expert>`,
ordered by layer, then card, then expert. Every tensor of every file starts at an absolute
file offset that is a multiple of `align` (the header is padded with spaces, gaps are
`pad.<n>` uint8 tensors, as safetensors wants tensors to tile the data section), so staging a
cold part is one aligned copy. manifest.json is written last (see docs/manifest.md).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from placer.checkpoint.experts import Expert, Inventory
from placer.plan.placement import Plan


@dataclass(frozen=True)
class Segment:
    """`length` bytes at absolute `offset` of source `file`, from source tensor `tensor`
    (dtype, shape of the whole tensor) at byte `start` of its data."""

    file: str
    offset: int
    length: int
    tensor: str
    dtype: str
    shape: tuple[int, ...]
    start: int


@dataclass
class Entry:
    """One output tensor: its header fields and the source segments that fill it."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    segments: list[Segment]
    owner: tuple[int, int] | None = None  # (layer, expert); None for padding
    stream: int = 0  # where the entry starts in its expert's byte stream
    offset: int = 0  # absolute offset in its output file, set by layout()

    @property
    def length(self) -> int:
        return sum(s.length for s in self.segments)


@dataclass
class OutputFile:
    name: str
    kind: str
    card: int | None
    link: int | None
    entries: list[Entry] = field(default_factory=list)


def stream_segments(expert: Expert, begin: int, end: int) -> list[Segment]:
    """Source segments of bytes [begin, end) of an expert's byte stream (tensors in order)."""
    out, pos = [], 0
    for t in expert.tensors:
        lo, hi = max(begin, pos), min(end, pos + t.length)
        if lo < hi:
            whole = t.fused_shape if t.fused_shape is not None else t.shape
            out.append(Segment(t.file, t.offset + lo - pos, hi - lo, t.name, t.dtype,
                               tuple(whole), t.tensor_offset + lo - pos))
        pos += t.length
    return out


def plan_files(plan: Plan, inv: Inventory) -> list[OutputFile]:
    """What goes in every output file, in order (see module docstring)."""
    cards = [OutputFile(f"card{c.index}.safetensors", "card", c.index, None) for c in plan.cards]
    groups = plan.hardware.groups()
    hosts = [OutputFile(f"host{g}.safetensors", "host", None, g) for g in range(len(groups))]
    group_of = {c: g for g, members in enumerate(groups) for c in members}
    for ep in plan.experts:
        ex = inv.expert(ep.layer, ep.expert)
        whole = ep.resident_bytes == ep.bytes and all(t.fused_shape is None for t in ex.tensors)
        if whole:
            cards[ep.card].entries += [
                Entry(t.name, t.dtype, tuple(t.shape), stream_segments(ex, pos, pos + t.length),
                      (ep.layer, ep.expert), pos)
                for t, pos in zip(ex.tensors, expert_starts(ex), strict=True)]
        else:
            cards[ep.card].entries += [
                Entry(f"res.L{ep.layer}.E{ep.expert}.P{p.index}", "U8", (p.length,),
                      stream_segments(ex, p.offset, p.offset + p.length),
                      (ep.layer, ep.expert), p.offset)
                for p in ep.pages if p.resident]
    for ep in sorted(plan.experts, key=lambda e: (e.layer, e.card, e.expert)):
        cold = ep.bytes - ep.resident_bytes
        if cold:
            ex = inv.expert(ep.layer, ep.expert)
            hosts[group_of[ep.card]].entries.append(
                Entry(f"cold.L{ep.layer}.E{ep.expert}", "U8", (cold,),
                      stream_segments(ex, ep.resident_bytes, ep.bytes),
                      (ep.layer, ep.expert), ep.resident_bytes))
    return cards + hosts


def expert_starts(ex: Expert) -> list[int]:
    """Where each of the expert's tensors starts in its byte stream."""
    pos, out = 0, []
    for t in ex.tensors:
        out.append(pos)
        pos += t.length
    return out


def layout(entries: list[Entry], align: int) -> tuple[bytes, list[Entry]]:
    """The safetensors header (padded so data starts aligned) and the entries with pad
    tensors between them; sets each entry's absolute offset."""
    with_pads: list[Entry] = []
    rel = 0
    for e in entries:
        gap = -rel % align
        if gap:
            with_pads.append(Entry(f"pad.{len(with_pads)}", "U8", (gap,), []))
            rel += gap
        with_pads.append(e)
        rel += e.length
    header: dict = {}
    pos = 0
    for e in with_pads:
        header[e.name] = {"dtype": e.dtype, "shape": list(e.shape),
                          "data_offsets": [pos, pos + entry_len(e)]}
        pos += entry_len(e)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-(8 + len(text)) % align)
    data_start = 8 + len(text)
    pos = data_start
    for e in with_pads:
        e.offset = pos
        pos += entry_len(e)
    return len(text).to_bytes(8, "little") + text, with_pads


def entry_len(e: Entry) -> int:
    """Bytes an entry takes in its file (a pad entry has no segments, only a shape)."""
    return e.length if e.segments else e.shape[0]



def copy_runs(entries: Iterable[Entry]) -> Iterator[tuple[str, int, int] | bytes]:
    """What an output file's data section is made of, in order: (source file, offset,
    length) for source bytes, merged where segments follow each other in the same source
    file (a whole expert's tensors often do), and bytes for padding."""
    run: tuple[str, int, int] | None = None
    for e in entries:
        if not e.segments:
            if run:
                yield run
                run = None
            yield bytes(e.shape[0])
        for s in e.segments:
            if run and run[0] == s.file and run[1] + run[2] == s.offset:
                run = (s.file, run[1], run[2] + s.length)
                continue
            if run:
                yield run
            run = (s.file, s.offset, s.length)
    if run:
        yield run
