"""Exact incremental evaluation of one-page moves, for the greedy and the local search.

A StallState holds, for the current placement and every distinct step pattern ("row") of
every layer (see patterns.py), the cold bytes and transfers of each card, the card and link
times and the layer stall. It prices moving one page of any expert (evicting its last
resident page, or restoring its first cold page) exactly under the cost model of cost.py,
and applies moves, several at once when they touch disjoint rows.

Rows of all layers are numbered together (layer by layer); experts by their flat index
x = layer * E + e. An entry is a (row, expert) pair where the row's pattern selects the
expert; entries are stored row by row (CSR) and expert by expert (CSC). The times of a row
are one vector [C + G]: C card times, then G link times.
"""

from __future__ import annotations

import numpy as np

from solvers.patterns import LayerPatterns
from solvers.problem import Problem


def _ranges(start: np.ndarray, stop: np.ndarray) -> np.ndarray:
    """Concatenation of arange(start[i], stop[i]) over i."""
    length = stop - start
    return np.repeat(start - np.cumsum(length) + length, length) + np.arange(int(length.sum()))


class PatternIndex:
    """Rows (the patterns of every layer, numbered together) and their entries (row, expert),
    indexed by row (CSR) and by expert (CSC): the part of an incremental state that does not
    depend on the execution model. Subclasses give `row_cost`, what each row costs now."""

    def __init__(self, patterns: list[LayerPatterns], shape: tuple[int, int]) -> None:
        num_layers, num_experts = shape
        self.shape = (int(num_layers), int(num_experts))
        sel = np.concatenate([p.selected for p in patterns])  # [R, E]
        self.row_layer = np.concatenate(
            [np.full(p.selected.shape[0], layer) for layer, p in enumerate(patterns)]
        )
        self.row_weight = np.concatenate([p.weight for p in patterns])
        self.layer_rows = np.cumsum([0] + [p.selected.shape[0] for p in patterns])
        rows, experts = np.nonzero(sel)
        self.entry_row = rows
        self.entry_expert = self.row_layer[rows] * num_experts + experts
        self.row_ptr = np.searchsorted(rows, np.arange(sel.shape[0] + 1))
        order = np.argsort(self.entry_expert, kind="stable")
        self.expert_rows = rows[order]
        self.expert_ptr = np.searchsorted(
            self.entry_expert[order], np.arange(num_layers * num_experts + 1)
        )

    @property
    def num_rows(self) -> int:
        return int(self.row_weight.size)

    def row_cost(self) -> np.ndarray:
        """[R] seconds each row costs at the current placement (before its weight)."""
        raise NotImplementedError

    def objective(self) -> float:
        return float(self.row_weight @ self.row_cost())

    def layer_objective(self, layer: int) -> float:
        lo, hi = self.layer_rows[layer], self.layer_rows[layer + 1]
        return float(self.row_weight[lo:hi] @ self.row_cost()[lo:hi])

    def entries_of_rows(self, rows: np.ndarray) -> np.ndarray:
        """Entry indices of `rows` (int array of distinct rows)."""
        return _ranges(self.row_ptr[rows], self.row_ptr[rows + 1])

    def entries_of_layer(self, layer: int) -> slice:
        """The entries of `layer` (a contiguous range)."""
        lo, hi = self.layer_rows[layer], self.layer_rows[layer + 1]
        return slice(int(self.row_ptr[lo]), int(self.row_ptr[hi]))

    def rows_of(self, x: np.ndarray) -> np.ndarray:
        """Rows selecting any of experts x (concatenated; distinct when x are in distinct
        layers or never share a row)."""
        return self.expert_rows[_ranges(self.expert_ptr[x], self.expert_ptr[x + 1])]

    def per_expert(self, layer: int, values: np.ndarray) -> np.ndarray:
        """[E] sums, per expert of `layer`, of `values` given for the layer's entries (in
        entries_of_layer order)."""
        span = self.entries_of_layer(layer)
        local = self.entry_expert[span] - layer * self.shape[1]
        return np.bincount(local, weights=values, minlength=self.shape[1])


class StallState(PatternIndex):
    """Per-row card loads of a placement.

    resident_pages: [L, E] int, copied. `pages` ([L * E], flat) holds the current placement
    and `objective()` its weighted stall (= cost.objective of the problem whose steps gave the
    patterns, up to float rounding).
    """

    def __init__(
        self, problem: Problem, patterns: list[LayerPatterns], resident_pages: np.ndarray
    ) -> None:
        super().__init__(patterns, problem.expert_bytes.shape)
        cards = problem.cards
        self.num_cards = cards.num_cards
        latency = np.asarray(cards.latency, dtype=np.float64)
        bandwidth = np.asarray(cards.bandwidth, dtype=np.float64)
        link_of = np.asarray(cards.link_of)
        link_bw = np.asarray(cards.link_bandwidth, dtype=np.float64)
        self.latency, self.bandwidth = latency, bandwidth
        self.link_of, self.link_bw = link_of, link_bw

        # Per expert (flat).
        self.expert_bytes = np.asarray(problem.expert_bytes, dtype=np.int64).ravel()
        self.page_bytes = (
            self.expert_bytes.copy() if problem.page_bytes is None
            else np.full_like(self.expert_bytes, int(problem.page_bytes))
        )
        self.num_pages = problem.num_pages().ravel()
        self.card = np.asarray(problem.home).ravel().astype(np.int64)
        self.link = link_of[self.card]
        self.pages = np.array(resident_pages, dtype=np.int64).ravel()

        rows = self.entry_row
        num_rows = self.num_rows

        # Per entry: flat positions of its card and link in `times`, its row weight and the
        # bandwidth of its link.
        width = self.num_cards + link_bw.size
        entry_card = self.card[self.entry_expert]
        self.entry_card_at = rows * width + entry_card
        self.entry_link_at = rows * width + self.num_cards + self.link[self.entry_expert]
        self.entry_weight = self.row_weight[rows]
        self.entry_link_bw = link_bw[self.link[self.entry_expert]]

        cold = (self.expert_bytes - self.resident_bytes_flat()).astype(np.float64)
        key = rows * self.num_cards + entry_card
        self.cold_bytes = np.bincount(
            key, weights=cold[self.entry_expert], minlength=num_rows * self.num_cards
        ).reshape(num_rows, self.num_cards)
        self.transfers = np.bincount(
            key, weights=(cold[self.entry_expert] > 0).astype(np.float64),
            minlength=num_rows * self.num_cards,
        ).reshape(num_rows, self.num_cards)
        self.link_bytes = self.cold_bytes @ np.eye(link_bw.size)[link_of]  # [R, G]
        self.times = np.concatenate(
            [self.transfers * latency + self.cold_bytes / bandwidth, self.link_bytes / link_bw],
            axis=1,
        )
        self.stall = self.times.max(axis=1) if num_rows else np.zeros(0)
        n = self.pages.size
        self.evict_bytes, self.restore_bytes = np.zeros(n), np.zeros(n)
        self.evict_card, self.restore_card = np.zeros(n), np.zeros(n)
        self._refresh_sizes(np.arange(n))

    # --- placement ---------------------------------------------------------------------------

    def resident_bytes_flat(self) -> np.ndarray:
        return np.minimum(self.pages * self.page_bytes, self.expert_bytes)

    def resident_pages(self) -> np.ndarray:
        """[L, E] int64 current resident pages."""
        return self.pages.reshape(self.shape).copy()

    def card_resident_bytes(self) -> np.ndarray:
        """[C] float resident bytes of each card."""
        return np.bincount(self.card, weights=self.resident_bytes_flat().astype(np.float64),
                           minlength=self.num_cards)

    def row_cost(self) -> np.ndarray:
        return self.stall

    def _page_size(self, x: np.ndarray, page: np.ndarray) -> np.ndarray:
        """Bytes of page index `page` (0-based) of experts x; the last page is shorter."""
        eb, pb = self.expert_bytes[x], self.page_bytes[x]
        return np.minimum(np.maximum(eb - page * pb, 0), pb)

    def _refresh_sizes(self, x: np.ndarray) -> None:
        """Recompute what the next eviction / restore of experts x frees / takes:
        evict_bytes, restore_bytes [L * E] bytes; evict_card, restore_card [L * E] card
        seconds the next eviction adds / the next restore saves."""
        r, full = self.pages[x], self.num_pages[x]
        lat, bw = self.latency[self.card[x]], self.bandwidth[self.card[x]]
        out = np.where(r > 0, self._page_size(x, r - 1), 0)
        back = np.where(r < full, self._page_size(x, r), 0)
        self.evict_bytes[x] = out
        self.restore_bytes[x] = back
        self.evict_card[x] = np.where(r > 0, (r == full) * lat + out / bw, 0.0)
        self.restore_card[x] = (r == full - 1) * lat + back / bw

    # --- pricing -----------------------------------------------------------------------------

    def evict_rise(self, entries: np.ndarray | slice) -> np.ndarray:
        """Weighted stall increase of each entry's row if one more page of its expert is
        evicted (0 where nothing of it is resident). entries: int array or slice."""
        x = self.entry_expert[entries]
        times = self.times.ravel()
        new = np.maximum(
            times[self.entry_card_at[entries]] + self.evict_card[x],
            times[self.entry_link_at[entries]] + self.evict_bytes[x] / self.entry_link_bw[entries],
        )
        new -= self.stall[self.entry_row[entries]]
        np.maximum(new, 0.0, out=new)
        return new * self.entry_weight[entries]

    def restore_drop(self, entries: np.ndarray | slice) -> np.ndarray:
        """Weighted stall change (<= 0) of each entry's row if one more page of its expert is
        restored. entries: int array or slice."""
        rows, x = self.entry_row[entries], self.entry_expert[entries]
        out = np.zeros(rows.size)
        if rows.size == 0:
            return out
        card_at, link_at = self.entry_card_at[entries], self.entry_link_at[entries]
        # Rows are read once per run of equal rows (entries come grouped by row). Only the
        # entry's card and link times change, so the row's stall can only drop where one of
        # them is its first largest time; it then falls to the largest of the changed two
        # and of the row's three largest times that are neither (times are >= 0: 0 pads).
        first = np.concatenate([[True], rows[1:] != rows[:-1]])
        run = np.cumsum(first) - 1  # [n] run of each entry
        width = self.times.shape[1]
        times = self.times[rows[first]]  # [runs, C + G]
        if width < 3:
            times = np.pad(times, ((0, 0), (0, 3 - width)))
        top = np.argsort(-times, axis=1, kind="stable")[:, :3]  # top[:, 0] is the argmax
        at = top[run, 0] + rows * width  # flat position of the row's argmax
        hit = np.flatnonzero((at == card_at) | (at == link_at))
        run, rows, x = run[hit], rows[hit], x[hit]
        card_at, link_at = card_at[hit], link_at[hit]
        pos = top[run] + (rows * width)[:, None]  # flat positions, as card_at and link_at
        free = (pos != card_at[:, None]) & (pos != link_at[:, None])  # >= 1 true per entry
        rest = np.take_along_axis(times, top, axis=1)[run, free.argmax(axis=1)]
        flat = self.times.ravel()
        link_bw = self.entry_link_bw[entries][hit]
        new = np.maximum(np.maximum(flat[card_at] - self.restore_card[x],
                                    flat[link_at] - self.restore_bytes[x] / link_bw), rest)
        old = self.stall[rows]
        out[hit] = (np.minimum(new, old) - old) * self.entry_weight[entries][hit]
        return out

    # --- moves -------------------------------------------------------------------------------

    def move(self, x: np.ndarray, step: int) -> np.ndarray:
        """Evict (step=-1) or restore (step=+1) one page of each expert x (flat indices of
        experts that never share a row, e.g. one per layer). Returns the rows touched."""
        x = np.asarray(x, dtype=np.int64)
        r, full = self.pages[x], self.num_pages[x]
        size = self._page_size(x, r - 1 if step < 0 else r).astype(np.float64)
        dtransfer = (r + step < full).astype(np.float64) - (r < full)
        self.pages[x] = r + step
        self._refresh_sizes(x)
        count = self.expert_ptr[x + 1] - self.expert_ptr[x]
        rows = self.rows_of(x)
        if rows.size == 0:
            return rows
        c, g = np.repeat(self.card[x], count), np.repeat(self.link[x], count)
        size, dtransfer = np.repeat(size, count), np.repeat(dtransfer, count)
        self.cold_bytes[rows, c] -= step * size
        self.transfers[rows, c] += dtransfer
        self.link_bytes[rows, g] -= step * size
        self.times[rows, c] = (
            self.transfers[rows, c] * self.latency[c] + self.cold_bytes[rows, c] / self.bandwidth[c]
        )
        self.times[rows, self.num_cards + g] = self.link_bytes[rows, g] / self.link_bw[g]
        self.stall[rows] = self.times[rows].max(axis=1)
        return rows
