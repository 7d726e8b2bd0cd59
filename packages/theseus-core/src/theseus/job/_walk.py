"""``CheckpointWalker``: the interface of a job that one call runs over many checkpoints.

theseus-core never imports theseus-analysis, yet ``theseus run --over`` and
``q.find()...over()`` must drive an analysis over every checkpoint of a lineage. Core
owns this small protocol; ``theseus.analysis.AnalysisBase`` satisfies it. A job class
that does not (a trainer) is refused before anything is read or written.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from theseus.store import Node

__all__ = ["CheckpointWalker"]


@runtime_checkable
class CheckpointWalker(Protocol):
    """A job set up (resumed) at the first of several checkpoints that walks them all.

    ``over(nodes, force=...)`` plans the walk; calling the job then runs it, in order,
    on one instance (so what it compiled is reused), and returns what it made.
    """

    def over(self, nodes: Sequence[Node], *, force: bool = False) -> None:
        """Make the next call of the job run over `nodes` (one lineage, in seq order).

        Args:
            nodes: checkpointed nodes of one lineage, the first the job is set up at.
            force: recompute nodes whose result for this configuration already exists.
        """
        ...
