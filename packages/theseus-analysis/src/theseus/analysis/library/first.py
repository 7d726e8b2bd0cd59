"""`FirstAnalyses` (`library/first`): the library's analyses together, one forward each.

The analyses `library/analyses` names run in one compiled program: the trainer's
`trace` runs once on the repeated random tokens and once per validation batch, and
every analysis reads the same recorded forward. `drift` and `memorization`, which have
programs of their own, run beside it on the same state (companions: one checkpoint read
per node serves them all). Each publishes as it would alone (its values on the node,
its figure as its own artifact `NAME`); this job's own artifact, `first-analyses`
(`first-analyses.json`), holds every analysis's values, and is what a walk over a
lineage (`--over`) finds to skip a node already analyzed with the same settings.
"""

from __future__ import annotations

import difflib
from typing import Any, ClassVar

from theseus.analysis._errors import AnalysisError
from theseus.analysis.library._base import LibraryAnalysis, LibraryBase
from theseus.analysis.library._settings import (
    FrequencySettings,
    ICLSettings,
    InductionSettings,
    SetSettings,
    ValidationSettings,
)
from theseus.analysis.library.drift import DriftBase, DriftSettings
from theseus.analysis.library.memorization import MemorizationBase, MemorizationSettings
from theseus.experiments.models.gpt import PretrainGPT

__all__ = ["Companion", "FirstAnalyses"]

#: A companion's class: an analysis with a program of its own (`companions()`).
Companion = type[DriftBase[Any, Any]] | type[MemorizationBase[Any, Any]]


class FirstAnalyses(LibraryBase, PretrainGPT):
    """The library's analyses in one program: one forward per batch kind at each node."""

    NAME = "first-analyses"
    #: The analyses it can run, by `NAME`: the catalogue's `LibraryAnalysis` classes
    #: (`_catalogue.py` fills it, so this module never imports the catalogue).
    KNOWN: ClassVar[dict[str, type[LibraryAnalysis[Any, Any]]]] = {}
    #: The analyses with programs of their own it can run beside them, by `NAME` (the
    #: catalogue's `drift` and `memorization`; `_catalogue.py` fills it too).
    COMPANIONS: ClassVar[dict[str, Companion]] = {}
    SETTINGS = (
        SetSettings,
        ValidationSettings,
        InductionSettings,
        ICLSettings,
        FrequencySettings,
        DriftSettings,
        MemorizationSettings,
    )

    def _named(self) -> tuple[str, ...]:
        """`library/analyses`, checked.

        Raises:
            AnalysisError: an empty list, a name given twice, or a name that is not one
                of the library's analyses (the message lists them).
        """
        if "named" not in self._library:
            known = [*self.KNOWN, *self.COMPANIONS]
            names = list(self.configure(SetSettings).analyses)
            unknown = [n for n in names if n not in known]
            twice = sorted({n for n in names if names.count(n) > 1})
            among = f"among {', '.join(known)}, e.g. library/analyses=[induction,logit-lens]"
            if unknown:
                near = {  # a part of a name (lens), else a near spelling (inductoin)
                    n: [k for k in known if n in k] or difflib.get_close_matches(n, known, n=1)
                    for n in unknown
                }
                hints = "".join(
                    f" ({n}: did you mean {' or '.join(close)}?)"
                    for n, close in near.items()
                    if close
                )
                raise AnalysisError(
                    f"library/analyses names {', '.join(map(repr, unknown))}, which the "
                    f"library has no analysis of{hints}; name analyses {among}"
                )
            if twice:
                raise AnalysisError(
                    f"library/analyses names {', '.join(map(repr, twice))} more than once; "
                    f"name each analysis once, {among}"
                )
            if not names:
                raise AnalysisError(f"library/analyses is empty; name one or more {among}")
            self._library["named"] = tuple(names)
        named: tuple[str, ...] = self._library["named"]
        return named

    def members(self) -> tuple[type[LibraryAnalysis[Any, Any]], ...]:
        """The analyses `library/analyses` names that share one program, in that order.

        Raises:
            AnalysisError: `library/analyses` is empty, names one twice, or names
                something that is not one of the library's analyses.
        """
        return tuple(self.KNOWN[n] for n in self._named() if n in self.KNOWN)

    def companions(self) -> tuple[Companion, ...]:
        """The analyses `library/analyses` names that have programs of their own
        (`drift`, `memorization`), in that order."""
        return tuple(self.COMPANIONS[n] for n in self._named() if n in self.COMPANIONS)

    def plot(self, results: Any) -> dict[str, dict[str, Any]]:
        """`first-analyses.json`: each analysis's values, by its NAME."""
        out: dict[str, dict[str, Any]] = {m.NAME: m.values(results[m.NAME]) for m in self.members()}
        for companion in self.companions():
            out[companion.NAME] = companion.node_values(results[companion.NAME])
        return out
