"""theseus.analysis.library: the analyses researchers run first, as ordinary analyses.

Each runs in tandem (`ANALYSIS = [A]`), on one checkpoint (`theseus run RUN FILE ROOT
--resume NODE`) and over a lineage (`--over`), writes its values on the node
(`dynamics/...`, curves in the browser) and its figure as the artifact `NAME`, and is
registered by name (`theseus jobs library/`):

- `InductionHeads` (`library/induction`): each head's induction and previous-token score;
- `InContextLearning` (`library/icl`): the loss at a late position minus at an early one;
- `LogitLens` (`library/logit-lens`): each layer's loss and KL through the final unembedding;
- `LossByPosition` (`library/loss-by-position`): the loss at each token position;
- `LossByFrequency` (`library/loss-by-frequency`): the loss by the target token's frequency;
- `FirstAnalyses` (`library/first`): any of the five above together, one forward per node
  (each is `class A(LibraryAnalysis, PretrainGPT)`);
- `RepresentationDrift` (`library/drift`; base `DriftBase`): linear CKA of each layer's
  residual stream with the previous node's (and a reference node's);
- `Memorization` (`library/memorization`; base `MemorizationBase`): the share of the
  training sequences seen so far that greedy decoding reproduces, by the step each was seen.
"""

from theseus.analysis.library._base import LibraryAnalysis, LibraryBase
from theseus.analysis.library._catalogue import CATALOGUE
from theseus.analysis.library._recording import Recording
from theseus.analysis.library.drift import DriftBase, DriftSettings, RepresentationDrift
from theseus.analysis.library.first import FirstAnalyses
from theseus.analysis.library.frequency import LossByFrequency
from theseus.analysis.library.icl import InContextLearning
from theseus.analysis.library.induction import InductionHeads
from theseus.analysis.library.logit_lens import LogitLens
from theseus.analysis.library.memorization import (
    Memorization,
    MemorizationBase,
    MemorizationSettings,
)
from theseus.analysis.library.position import LossByPosition

__all__ = [
    "CATALOGUE",
    "DriftBase",
    "DriftSettings",
    "FirstAnalyses",
    "InContextLearning",
    "InductionHeads",
    "LibraryAnalysis",
    "LibraryBase",
    "LogitLens",
    "LossByFrequency",
    "LossByPosition",
    "Memorization",
    "MemorizationBase",
    "MemorizationSettings",
    "Recording",
    "RepresentationDrift",
]
