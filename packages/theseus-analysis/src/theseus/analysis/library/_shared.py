"""What a set of library analyses computes for a companion in its own program.

A drift companion (`DriftBase`) compares every block's output at fixed positions of one
fixed batch. Where the set's program already runs the trainer's `trace` on that batch (its
first validation batch), or can run it once more, the set records the streams there
(`_residuals.at_positions`, as drift's own program picks them) and hands them to
`DriftBase.compute_from`: the walk compiles no program for drift. `shared_drift`
decides, once per set, whether and how.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np

from theseus.analysis.library.drift import DriftBase

__all__ = ["DRIFT", "SharedDrift", "same_rows", "shared_drift"]

#: The set's program's output holding a drift companion's residual streams.
DRIFT = "drift-residuals"


@dataclasses.dataclass(frozen=True)
class SharedDrift:
    """A drift companion whose residual streams the set's program records.

    Attributes:
        name: the companion's `NAME`.
        view: the companion.
        paths: the blocks it compares (a subset of the set's).
        chosen: the flat positions of its fixed batch it compares.
        first: True where its fixed batch is the set's first validation batch (read
            from that forward), False where the program runs one more forward on it.
        batch: its fixed batch, placed (the program's input where `first` is False).
    """

    name: str
    view: DriftBase[Any, Any]
    paths: tuple[str, ...]
    chosen: np.ndarray
    first: bool
    batch: dict[str, Any]


def shared_drift(
    views: Mapping[str, Any],
    blocks: tuple[str, ...],
    first_validation: dict[str, np.ndarray] | None,
) -> SharedDrift | None:
    """The first drift companion among `views` (by name) whose compared blocks the set
    records (`blocks`), or None. `first_validation`: the host rows of the set's first
    validation batch, None where no member reads validation batches."""
    for name, view in views.items():
        if not isinstance(view, DriftBase):
            continue
        paths = view.compared_blocks()
        if not set(paths) <= set(blocks):
            return None
        rows, batch, chosen = view.fixed_tokens()
        first = first_validation is not None and same_rows(rows, first_validation)
        return SharedDrift(name, view, paths, chosen, first, batch)
    return None


def same_rows(a: Mapping[str, np.ndarray], b: Mapping[str, np.ndarray]) -> bool:
    """Whether two batches of host rows hold the same arrays under the same keys."""
    return a.keys() == b.keys() and all(
        np.shape(a[k]) == np.shape(b[k]) and np.array_equal(a[k], b[k]) for k in a
    )
