"""What names a plan-shaped document and how an expert's bytes are cut into pages: shared by
the plan, its check and the manifest (a manifest is a plan plus where every byte landed)."""

from __future__ import annotations

PLAN_FORMAT = "placer-plan"
MANIFEST_FORMAT = "placer-manifest"
PLAN_VERSION = 2  # 2: cache_params (pooled slots, the learned policy's weights); reads 1 too
READ_VERSIONS = (1, 2)
MANIFEST_VERSION = 3  # 3: the manifest carries a digest of itself (placer.plan.seal)
PLACER_VERSION = "0.1.0"


def page_spans(nbytes: int, page_size: int | None) -> list[tuple[int, int]]:
    """(offset, length) of each page of an expert of `nbytes` bytes: page i covers
    [i * page_size, min((i + 1) * page_size, nbytes)); one page when `page_size` is None."""
    if page_size is None or page_size >= nbytes:
        return [(0, nbytes)]
    return [(o, min(page_size, nbytes - o)) for o in range(0, nbytes, page_size)]
