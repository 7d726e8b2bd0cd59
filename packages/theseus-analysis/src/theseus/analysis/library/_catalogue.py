"""The library's catalogue: each analysis under the name `theseus` knows it by.

Importing this module registers them (`@analysis`: an analysis and a job of the same
name), so `theseus jobs library/` lists them and `theseus configure NAME FILE` writes
their settings. One line per analysis.
"""

from __future__ import annotations

from typing import Any

from theseus.analysis.library.drift import RepresentationDrift
from theseus.analysis.library.memorization import Memorization
from theseus.registry import analysis

__all__ = ["CATALOGUE"]

CATALOGUE: dict[str, type[Any]] = {
    "library/drift": RepresentationDrift,
    "library/memorization": Memorization,
}

for _name, _cls in CATALOGUE.items():
    analysis(_name)(_cls)
