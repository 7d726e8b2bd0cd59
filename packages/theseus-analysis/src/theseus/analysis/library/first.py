"""`FirstAnalyses` (`library/first`): the library's analyses together, one forward each.

The analyses `library/analyses` names run in one compiled program: the trainer's
`trace` runs once on the repeated random tokens and once per validation batch, and
every analysis reads the same recorded forward. Each publishes as it would alone (its
values on the node, its figure as its own artifact `NAME`); this job's own artifact,
`first-analyses` (`first-analyses.json`), holds every analysis's values, and is what
a walk over a lineage (`--over`) finds to skip a node already analyzed with the same
settings.
"""

from __future__ import annotations

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
from theseus.experiments.models.gpt import PretrainGPT

__all__ = ["FirstAnalyses"]


class FirstAnalyses(LibraryBase, PretrainGPT):
    """The library's analyses in one program: one forward per batch kind at each node."""

    NAME = "first-analyses"
    #: The analyses it can run, by `NAME`: the catalogue's `LibraryAnalysis` classes
    #: (`_catalogue.py` fills it, so this module never imports the catalogue).
    KNOWN: ClassVar[dict[str, type[LibraryAnalysis[Any, Any]]]] = {}
    SETTINGS = (SetSettings, ValidationSettings, InductionSettings, ICLSettings, FrequencySettings)

    def members(self) -> tuple[type[LibraryAnalysis[Any, Any]], ...]:
        """The analyses `library/analyses` names, in that order.

        Raises:
            AnalysisError: an empty list, a name given twice, or a name that is not one
                of the library's analyses (the message lists them).
        """
        if "members" not in self._library:
            known = self.KNOWN
            names = list(self.configure(SetSettings).analyses)
            unknown = [n for n in names if n not in known]
            if not names or unknown or len(set(names)) < len(names):
                got = ", ".join(map(repr, names)) or "nothing"
                raise AnalysisError(
                    f"library/analyses names {got}; expected distinct names among "
                    f"{', '.join(known)}, e.g. library/analyses=[induction,logit-lens]"
                )
            self._library["members"] = tuple(known[n] for n in names)
        members: tuple[type[LibraryAnalysis[Any, Any]], ...] = self._library["members"]
        return members

    def plot(self, results: Any) -> dict[str, dict[str, float]]:
        """`first-analyses.json`: each analysis's values, by its NAME."""
        return {m.NAME: m.values(results[m.NAME]) for m in self.members()}
