"""theseus.analysis.library: the analyses researchers run first, as ordinary analyses.

Each is an analysis class like any other (in tandem, on one checkpoint, `--over` a
lineage), registered under `library/...`, with a base to mix into another trainer:

- `library/drift` (`RepresentationDrift`, `DriftBase`): linear CKA of each layer's
  residual stream with the previous node's (and a reference node's).
- `library/memorization` (`Memorization`, `MemorizationBase`): the share of the training
  sequences seen so far that greedy decoding reproduces, by the step each was seen.

The names load on first use (importing the package imports no JAX).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from theseus.analysis.library.drift import DriftBase, DriftSettings, RepresentationDrift
    from theseus.analysis.library.memorization import (
        Memorization,
        MemorizationBase,
        MemorizationSettings,
    )

__all__ = [
    "DriftBase",
    "DriftSettings",
    "Memorization",
    "MemorizationBase",
    "MemorizationSettings",
    "RepresentationDrift",
]

_LAZY = {
    "DriftBase": "theseus.analysis.library.drift",
    "DriftSettings": "theseus.analysis.library.drift",
    "RepresentationDrift": "theseus.analysis.library.drift",
    "Memorization": "theseus.analysis.library.memorization",
    "MemorizationBase": "theseus.analysis.library.memorization",
    "MemorizationSettings": "theseus.analysis.library.memorization",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'theseus.analysis.library' has no attribute {name!r}")
