"""theseus.analysis.library: the analyses researchers run first, as ordinary analyses.

Each runs in tandem (`ANALYSIS = [A]`), on one checkpoint (`theseus run RUN FILE ROOT
--resume NODE`) and over a lineage (`--over`), writes its values on the node
(`dynamics/...`, curves in the browser) and its figure as the artifact `NAME`, and is
registered by name (`_catalogue.py`):

- `RepresentationDrift` (`library/drift`; base `DriftBase`): linear CKA of each layer's
  residual stream with the previous node's (and a reference node's);
- `Memorization` (`library/memorization`; base `MemorizationBase`): the share of the
  training sequences seen so far that greedy decoding reproduces, by the step each was seen.
"""

from theseus.analysis.library._catalogue import CATALOGUE
from theseus.analysis.library.drift import DriftBase, DriftSettings, RepresentationDrift
from theseus.analysis.library.memorization import (
    Memorization,
    MemorizationBase,
    MemorizationSettings,
)

__all__ = [
    "CATALOGUE",
    "DriftBase",
    "DriftSettings",
    "Memorization",
    "MemorizationBase",
    "MemorizationSettings",
    "RepresentationDrift",
]
