"""Which features of two SAEs are the same: decoder cosine under a one-to-one assignment.

Two dictionaries trained on the same site (a chain over checkpoints, or two seeds) name
the same features in different orders. :func:`match` pairs them one to one so that the
summed cosine similarity of the paired decoder rows is largest (the Hungarian method,
``scipy.optimize.linear_sum_assignment``), and says how many pairs are alike above a
threshold, which features of the new SAE have no alike partner (born) and which of the
old have none (gone).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from scipy.optimize import linear_sum_assignment  # type: ignore[import-untyped]

__all__ = ["Match", "match"]


class Match(NamedTuple):
    """The one-to-one assignment of ``old``'s features to ``new``'s.

    Attributes:
        pairs: ``(old index, new index)`` of each assigned pair, by old index.
        cosines: each pair's decoder cosine.
        matched: the share of the smaller dictionary's features paired above the threshold.
        born: indices of ``new``'s features paired with nothing alike.
        gone: indices of ``old``'s features paired with nothing alike.
    """

    pairs: np.ndarray
    cosines: np.ndarray
    matched: float
    born: np.ndarray
    gone: np.ndarray


def _unit(rows: np.ndarray) -> np.ndarray:
    rows = np.asarray(rows, np.float64)
    return rows / np.maximum(np.linalg.norm(rows, axis=1, keepdims=True), 1e-12)


def match(old: np.ndarray, new: np.ndarray, threshold: float = 0.9) -> Match:
    """Pair the decoder rows ``old`` ``[m, d]`` and ``new`` ``[n, d]`` one to one.

    Raises:
        ValueError: the rows are of different widths (one line).
    """
    if old.ndim != 2 or new.ndim != 2 or old.shape[1] != new.shape[1]:
        raise ValueError(
            f"Matching needs two [features, d] decoders of one d; got {old.shape} and {new.shape}."
        )
    cosine = _unit(old) @ _unit(new).T
    rows, cols = linear_sum_assignment(cosine, maximize=True)
    chosen = cosine[rows, cols]
    alike = chosen > threshold
    paired_new = set(cols[alike].tolist())
    paired_old = set(rows[alike].tolist())
    return Match(
        pairs=np.stack([rows, cols], axis=1),
        cosines=chosen,
        matched=float(alike.sum() / min(len(old), len(new))),
        born=np.array([j for j in range(len(new)) if j not in paired_new], dtype=np.int64),
        gone=np.array([i for i in range(len(old)) if i not in paired_old], dtype=np.int64),
    )
