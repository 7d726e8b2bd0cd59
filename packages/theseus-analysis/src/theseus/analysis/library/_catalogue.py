"""The library's catalogue: each analysis under the name `theseus` knows it by.

Importing this module registers them (`@analysis`: an analysis and a job of the same
name), so `theseus jobs library/` lists them and `theseus configure NAME FILE` writes
their settings with no `--import`: theseus-analysis names this package in the
`theseus.jobs` entry-point group, which the registry loads with its built-in jobs.
One line per analysis.
"""

from __future__ import annotations

from typing import Any

from theseus.analysis.library._base import LibraryAnalysis
from theseus.analysis.library.drift import RepresentationDrift
from theseus.analysis.library.first import FirstAnalyses
from theseus.analysis.library.frequency import LossByFrequency
from theseus.analysis.library.icl import InContextLearning
from theseus.analysis.library.induction import InductionHeads
from theseus.analysis.library.logit_lens import LogitLens
from theseus.analysis.library.memorization import Memorization
from theseus.analysis.library.position import LossByPosition
from theseus.registry import analysis

__all__ = ["CATALOGUE", "by_name"]

CATALOGUE: dict[str, type[Any]] = {
    "library/induction": InductionHeads,
    "library/icl": InContextLearning,
    "library/logit-lens": LogitLens,
    "library/loss-by-position": LossByPosition,
    "library/loss-by-frequency": LossByFrequency,
    "library/first": FirstAnalyses,
    "library/drift": RepresentationDrift,
    "library/memorization": Memorization,
}

for _name, _cls in CATALOGUE.items():
    analysis(_name)(_cls)


def by_name() -> dict[str, type[LibraryAnalysis[Any, Any]]]:
    """The analyses that share a forward (`LibraryAnalysis`), by their `NAME`."""
    return {
        cls.NAME: cls
        for cls in CATALOGUE.values()
        if isinstance(cls, type) and issubclass(cls, LibraryAnalysis)
    }


FirstAnalyses.KNOWN = by_name()
FirstAnalyses.COMPANIONS = {cls.NAME: cls for cls in (RepresentationDrift, Memorization)}
