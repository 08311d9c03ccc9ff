"""How one expert's checkpoint tensors become its slice of a transformers experts module.

transformers 5 holds the routed experts of a layer as fused parameters of one module
(`gate_up_proj` [E, 2I, H], `down_proj` [E, H, I], gpt-oss also `*_bias` and [E, H, 2I]); on
load it stacks per-expert checkpoint tensors into them (`gate_proj` and `up_proj`
concatenated along rows, Mixtral's `w1`/`w3`/`w2` likewise), while a fused checkpoint
(gpt-oss) already stores expert E as slice E. A layout reproduces exactly that for the
selected experts only, so the module's own forward computes them bit for bit.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from placer.errors import PlacerError


@dataclass(frozen=True)
class ExpertLayout:
    """`params`: module parameter -> the expert's checkpoint tensors (names after
    `...experts.E.` or `...experts.`) concatenated along dim 0 to make its slice."""

    name: str
    params: Mapping[str, tuple[str, ...]]

    def assemble(self, experts: Sequence[Mapping[str, torch.Tensor]], dtype: torch.dtype,
                 device: torch.device) -> dict[str, torch.Tensor]:
        """The module's parameters for `experts` only: [len(experts), ...] per parameter."""
        out = {}
        for param, parts in self.params.items():
            rows = [w[parts[0]] if len(parts) == 1 else torch.cat([w[p] for p in parts])
                    for w in experts]
            out[param] = torch.stack(rows).to(device=device, dtype=dtype)
        return out

    def row_shapes(self, shapes: Mapping[str, Sequence[int]]) -> dict[str, tuple[int, ...]]:
        """Each parameter's slice shape for one expert whose tensors have `shapes`."""
        out = {}
        for param, parts in self.params.items():
            first = tuple(shapes[parts[0]])
            out[param] = (sum(int(shapes[p][0]) for p in parts), *first[1:])
        return out

    def fill(self, params: Mapping[str, torch.Tensor], row: int,
             weights: Mapping[str, torch.Tensor]) -> None:
        """Write one expert's tensors `weights` into row `row` of the module's parameters
        `params`: one copy per tensor (converting dtype as `assemble` does), no temporary."""
        for param, parts in self.params.items():
            start = 0
            for part in parts:
                n = weights[part].shape[0]
                params[param][row, start:start + n].copy_(weights[part])
                start += n

    def split(self, params: Mapping[str, torch.Tensor], row: int,
              shapes: Mapping[str, Sequence[int]]) -> dict[str, torch.Tensor]:
        """The inverse of `fill`: views of row `row` of `params`, one per checkpoint tensor."""
        out = {}
        for param, parts in self.params.items():
            start = 0
            for part in parts:
                n = int(shapes[part][0])
                out[part] = params[param][row, start:start + n]
                start += n
        return out


GATE_UP_DOWN = ExpertLayout("per-expert gate/up/down_proj", {
    "gate_up_proj": ("gate_proj.weight", "up_proj.weight"), "down_proj": ("down_proj.weight",)})
MIXTRAL = ExpertLayout("per-expert w1/w3/w2", {
    "gate_up_proj": ("w1.weight", "w3.weight"), "down_proj": ("w2.weight",)})
LAYOUTS = (GATE_UP_DOWN, MIXTRAL)


def layout_for(params: Sequence[str], tensors: Sequence[str]) -> ExpertLayout:
    """The layout that builds module parameters `params` from checkpoint tensors `tensors`."""
    params, tensors = set(params), set(tensors)
    if params == tensors:
        return ExpertLayout("fused", {p: (p,) for p in sorted(params)})
    for layout in LAYOUTS:
        if set(layout.params) == params and {t for ts in layout.params.values()
                                             for t in ts} == tensors:
            return layout
    raise PlacerError(f"the reference runtime cannot build experts parameters {sorted(params)} "
                      f"from checkpoint tensors {sorted(tensors)} (quantized experts, e.g. "
                      "fp8 scales or MXFP4 blocks, are not supported)")
