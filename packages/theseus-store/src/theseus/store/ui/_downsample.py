"""Min/max downsampling: at most a page's points of a curve, every peak and dip kept.

Pure functions over arrays of values: each block of :data:`BLOCK` values has a
smallest and a largest (the summary a remembered curve keeps as it grows), so the
extremes of a bucket are found from whole blocks plus its two ragged ends.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from typing import Any

__all__ = ["downsample"]

# Values a curve's min/max summary covers per block (see ``_curve.Curve``).
BLOCK = 64


def _summary(ys: array[float]) -> tuple[array[float], array[float]]:
    """Each block's smallest and largest value (see ``_curve.Curve``)."""
    mins, maxs = array("d"), array("d")
    for lo in range(0, len(ys), BLOCK):
        chunk = ys[lo : lo + BLOCK]
        mins.append(min(chunk))
        maxs.append(max(chunk))
    return mins, maxs


def _first_extreme(ys: array[float], blocks: array[float], lo: int, hi: int, pick: Any) -> int:
    """The index of the first smallest (``pick=min``) or largest value in ``ys[lo:hi]``."""
    b0, b1 = -(-lo // BLOCK), hi // BLOCK  # the whole blocks inside: b0 .. b1 - 1
    if b1 - b0 < 2:
        return ys.index(pick(ys[lo:hi]), lo, hi)
    left, right = ys[lo : b0 * BLOCK], ys[b1 * BLOCK : hi]
    middle = pick(blocks[b0:b1])
    best = pick([middle, *([pick(left)] if left else []), *([pick(right)] if right else [])])
    if left and pick(left) == best:
        return ys.index(best, lo, b0 * BLOCK)
    if middle == best:
        block = blocks.index(best, b0, b1)
        return ys.index(best, block * BLOCK, (block + 1) * BLOCK)
    return ys.index(best, b1 * BLOCK, hi)


def _kept(ys: array[float], mins: array[float], maxs: array[float], max_points: int) -> list[int]:
    """The indices :func:`downsample` keeps of ``ys`` (``mins``/``maxs``: its block summary)."""
    if max_points < 4:
        raise ValueError(
            f"max_points must be at least 4 (first, last, one bucket); got {max_points}."
        )
    n = len(ys)
    if n <= max_points:
        return list(range(n))
    inner = n - 2
    buckets = (max_points - 2) // 2
    kept = [0]
    for b in range(buckets):
        lo = 1 + (b * inner) // buckets
        hi = 1 + ((b + 1) * inner) // buckets
        if lo >= hi:
            continue
        low = _first_extreme(ys, mins, lo, hi, min)
        high = _first_extreme(ys, maxs, lo, hi, max)
        kept.extend(sorted({low, high}))
    kept.append(n - 1)
    return kept


def downsample(points: Sequence[tuple[Any, ...]], max_points: int = 2000) -> list[tuple[Any, ...]]:
    """At most ``max_points`` of ``points`` (sorted by x): first, last, each bucket's min and max.

    The points between the first and the last are cut into equal buckets (by
    position); each bucket keeps its smallest and its largest value (the first
    of equal ones; in x order, once if they are one point), so every peak and dip
    survives the cut. The values (``point[1]``) must be numbers, NaN excluded.
    """
    ys = array("d", (p[1] for p in points))
    return [points[i] for i in _kept(ys, *_summary(ys), max_points)]
