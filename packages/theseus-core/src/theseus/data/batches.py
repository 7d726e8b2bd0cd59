"""Batches as a pure function of (seed, step, split, host): the batch plan.

Every host computes the same global plan for a step (which dataset, which window or
document, for each row) from `numpy.random.default_rng([seed, step, split])` and reads
only its own contiguous slice of rows. The plan does not depend on how many hosts there
are, so a run that restarts on another topology sees the same global batches.

Targets that must not be trained on are `-1`; `padding_mask` is true for real tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from theseus.data._errors import DataError
from theseus.data.prepared import PreparedData, Split

__all__ = ["IGNORE", "Batch", "MixturePlan", "Style"]

IGNORE = -1
Style = Literal["pmd", "padded"]
Batch = dict[str, np.ndarray]
_SPLIT_IDS = {"train": 0, "val": 1}


def _pmd_draw(tokens: np.ndarray, block_size: int, rng: np.random.Generator, n: int) -> np.ndarray:
    """Start offsets of `n` contiguous windows (they may cross document boundaries)."""
    span = tokens.size - block_size - 1
    if span < 0:
        raise DataError(
            f"a split of {tokens.size} tokens is too short for windows of block_size "
            f"{block_size} (+1 target); prepare more data or lower architecture/block_size"
        )
    return rng.integers(0, span + 1, size=n)


def _pmd_rows(tokens: np.ndarray, block_size: int, starts: np.ndarray) -> Batch:
    index = starts[:, None] + np.arange(block_size + 1)[None, :]
    window = np.asarray(tokens[index], dtype=np.int32)
    return {
        "x": window[:, :-1],
        "y": window[:, 1:],
        "padding_mask": np.ones((starts.size, block_size), dtype=bool),
    }


def _padded_rows(
    tokens: np.ndarray, starts: np.ndarray, block_size: int, pad: int, docs: np.ndarray
) -> Batch:
    """One document per row, truncated to the block and padded after its end."""
    ends = np.append(starts[1:], tokens.size)
    n = docs.size
    x = np.full((n, block_size), pad, dtype=np.int32)
    y = np.full((n, block_size), IGNORE, dtype=np.int32)
    for row, doc in enumerate(docs):
        piece = np.asarray(tokens[starts[doc] : min(ends[doc], starts[doc] + block_size + 1)])
        length = piece.size - 1
        x[row, :length] = piece[:-1]
        y[row, :length] = piece[1:]
    return {"x": x, "y": y, "padding_mask": y != IGNORE}


@dataclass(frozen=True)
class MixturePlan:
    """Datasets mixed by rate; each row of a batch is drawn from one of them.

    Args:
        sources: the prepared datasets.
        rates: the probability of each source per row; they must sum to 1.
        styles: `"pmd"` (contiguous windows) or `"padded"` (one document per row) per source.
        seed: the data seed (`data/seed`).
    """

    sources: Sequence[PreparedData]
    rates: Sequence[float]
    styles: Sequence[Style]
    seed: int

    def __post_init__(self) -> None:
        if not (len(self.sources) == len(self.rates) == len(self.styles)) or not self.sources:
            raise DataError(
                "a mixture needs one rate and one style per dataset, and at least one dataset"
            )
        if abs(sum(self.rates) - 1.0) > 1e-6 or min(self.rates) < 0:
            raise DataError(
                f"sampling rates must be non-negative and sum to 1, got {list(self.rates)} "
                f"(sum {sum(self.rates):g}); rescale them"
            )
        for style in self.styles:
            if style not in ("pmd", "padded"):
                raise DataError(f"unknown sampling style {style!r}; use 'pmd' or 'padded'")

    def batch(
        self,
        step: int,
        split: Split,
        rows: int,
        block_size: int,
        *,
        host: int = 0,
        n_hosts: int = 1,
    ) -> Batch:
        """Rows `[host * rows/n_hosts, (host+1) * rows/n_hosts)` of the global batch at `step`.

        Returns:
            `x` and `y` int32 `[rows / n_hosts, block_size]`, `padding_mask` bool of the same shape.
        """
        if rows % n_hosts:
            raise DataError(f"the global batch of {rows} rows does not split over {n_hosts} hosts")
        rng = np.random.default_rng([self.seed, step, _SPLIT_IDS[split]])
        which = rng.choice(len(self.sources), size=rows, p=np.asarray(self.rates, dtype=np.float64))
        per_host = rows // n_hosts
        low, high = host * per_host, (host + 1) * per_host
        out = {
            "x": np.empty((per_host, block_size), dtype=np.int32),
            "y": np.empty((per_host, block_size), dtype=np.int32),
            "padding_mask": np.empty((per_host, block_size), dtype=bool),
        }
        for index, (source, style) in enumerate(zip(self.sources, self.styles, strict=True)):
            # Each source draws for all of its rows from its own stream, so every host
            # makes the same draws, then materializes only the rows it keeps.
            picked = np.flatnonzero(which == index)
            own = np.random.default_rng([self.seed, step, _SPLIT_IDS[split], index + 1])
            tokens = source.tokens(split)
            keep = (picked >= low) & (picked < high)
            if style == "pmd":
                starts = _pmd_draw(tokens, block_size, own, picked.size)
                drawn = _pmd_rows(tokens, block_size, starts[keep])
            else:
                doc_starts = source.doc_starts(split)
                if doc_starts.size == 0:
                    raise DataError(f"dataset {source.name!r} has no {split} documents to sample")
                docs = own.integers(0, doc_starts.size, size=picked.size)
                pad = source.tokenizer.pad
                drawn = _padded_rows(tokens, doc_starts, block_size, pad, docs[keep])
            for key in out:
                out[key][picked[keep] - low] = drawn[key]
        return out
