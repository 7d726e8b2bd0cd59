"""The analysis engine's exceptions (each says what to change)."""

from __future__ import annotations

from theseus.errors import TheseusError

__all__ = ["AnalysisError", "AnalysisSelectionError"]


class AnalysisError(TheseusError, RuntimeError):
    """An analysis used or written in a way that cannot work."""


class AnalysisSelectionError(AnalysisError, ValueError):
    """`select()` returned something other than discovered path strings."""
