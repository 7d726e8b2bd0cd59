"""A key's finite numeric points along a stitched lineage, kept with a min/max summary.

The browser's memory (:mod:`theseus.store.ui._memory`) holds one :class:`Curve` per
(lineage, key) it served, appends the points of new nodes, patches the points of
nodes written again, and cuts a page's points from it (:mod:`theseus.store.ui._downsample`).
"""

from __future__ import annotations

import bisect
import time
from array import array
from collections.abc import Sequence

from theseus.store.ui._downsample import BLOCK

__all__ = ["Curve"]


class Curve:
    """A key's finite numeric points along a stitched lineage, with a min/max summary.

    ``xs``/``ys`` hold the points in x order; ``mins[b]``/``maxs[b]`` the smallest and
    largest y of ``ys[b * BLOCK : (b + 1) * BLOCK]``, kept as points are appended.
    """

    def __init__(
        self, chain: list[tuple[str, str, int]], version: int, starts: list[int] | None = None
    ) -> None:
        self.chain = chain  # (name, nonce, last seq taken), oldest first; the last one grows
        # The seq at which each part left the part before it (the first part's: -1).
        self.starts = starts if starts is not None else [-1] * len(chain)
        self.offsets: list[int] = []
        offset = 0
        for _, _, upto in chain:
            self.offsets.append(offset)
            offset += upto + 1
        self.version = version
        self.built = time.monotonic()
        self.xs = array("q")
        self.ys = array("d")
        self.mins = array("d")
        self.maxs = array("d")

    @property
    def seen(self) -> int:
        """The last seq read of the lineage itself (the chain's last part)."""
        return self.chain[-1][2]

    def append(self, points: Sequence[tuple[int, float]]) -> None:
        """Add points past every one held (x increasing), keeping the summary."""
        start = len(self.ys)
        for x, y in points:
            self.xs.append(x)
            self.ys.append(y)
        self._summarize(start)

    def patch(self, changes: Sequence[tuple[int, float | None]]) -> None:
        """Set the point at each ``x`` (x increasing) to ``y``, or remove it (``None``)."""
        xs, ys = self.xs, self.ys
        n = len(xs)
        found, there, kept = [], [], []
        for x, y in changes:
            i = bisect.bisect_left(xs, x)
            present = i < n and xs[i] == x
            if present or y is not None:  # else: no point before, none now
                found.append(i)
                there.append(present)
                kept.append((x, y))
        changes = kept
        if not changes:
            return
        if all(there) and all(y is not None for _, y in changes):
            blocks = set()
            for i, (_, y) in zip(found, changes, strict=True):
                ys[i] = y  # type: ignore[assignment]
                blocks.add(i // BLOCK)
            for b in blocks:
                chunk = ys[b * BLOCK : (b + 1) * BLOCK]
                self.mins[b], self.maxs[b] = min(chunk), max(chunk)
            return
        new_xs, new_ys = array("q"), array("d")
        pos = 0
        for i, present, (x, y) in zip(found, there, changes, strict=True):
            new_xs.extend(xs[pos:i])
            new_ys.extend(ys[pos:i])
            if y is not None:
                new_xs.append(x)
                new_ys.append(y)
            pos = i + 1 if present else i
        new_xs.extend(xs[pos:])
        new_ys.extend(ys[pos:])
        self.xs, self.ys = new_xs, new_ys
        self._summarize(found[0])

    def cut(self, x: int) -> None:
        """Forget every point at ``x`` or after."""
        keep = bisect.bisect_left(self.xs, x)
        del self.xs[keep:]
        del self.ys[keep:]
        self._summarize(keep)

    def _summarize(self, start: int) -> None:
        first = start // BLOCK
        del self.mins[first:]
        del self.maxs[first:]
        ys = self.ys
        for lo in range(first * BLOCK, len(ys), BLOCK):
            chunk = ys[lo : lo + BLOCK]
            self.mins.append(min(chunk))
            self.maxs.append(max(chunk))

    def node(self, index: int) -> str:
        """The node, serialized, that holds point ``index``."""
        x = self.xs[index]
        part = bisect.bisect_right(self.offsets, x) - 1
        name, nonce, _ = self.chain[part]
        return f"{name}~{nonce}~{x - self.offsets[part]}"
