"""`AnalysisResult`: what one run of an analysis produced, shown by itself in Jupyter."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from theseus.store import Artifact, Node

__all__ = ["AnalysisResult"]


@dataclass(frozen=True)
class AnalysisResult:
    """What one run of an analysis produced.

    Attributes:
        values: what `analyze()` returned, as NumPy arrays with their global shapes.
        node: the node the result is attached to.
        path: the file written under `spec.result()` (host zero; None when `plot()`
            returned None or on other hosts).
        artifact: the store record of that file (host zero), else None.
        figure: the matplotlib Figure `plot()` returned (host zero), else None.

    In Jupyter a result shows itself: its figure as an image, a JSON result as JSON.
    """

    values: Any
    node: Node
    path: Path | None
    artifact: Artifact | None
    figure: Any = field(default=None, repr=False, compare=False)

    def _repr_png_(self) -> tuple[bytes, dict[str, float]] | None:
        """The figure as PNG, for Jupyter (None: no figure, Jupyter shows the repr)."""
        if self.figure is None:
            return None
        from theseus.plot import to_png

        return to_png(self.figure), {"width": self.figure.get_figwidth() * 96}

    def _repr_json_(self) -> Any:
        """A JSON result's value, for Jupyter (None for a figure or nothing saved)."""
        if self.artifact is None or not self.artifact.filename.endswith(".json"):
            return None
        return json.loads(self.artifact.content)
