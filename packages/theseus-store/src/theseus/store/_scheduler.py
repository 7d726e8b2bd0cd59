"""The scheduler job beside a lineage: what ``theseus run --scheduler-job`` records.

A run started by ``theseus submit`` records ``slurm/job``, ``slurm/state`` (running,
preempted, requeued, finished, failed) and ``slurm/restarts`` beside each
``job/status`` it records. :func:`scheduler_state` reads them from the lineage's last
node that has a state, for ``theseus-store show|lineage`` and the browser.
"""

from __future__ import annotations

from typing import NamedTuple

from theseus.store._node import Node
from theseus.store._reading import StoreReader

__all__ = ["SchedulerState", "scheduler_state"]


class SchedulerState(NamedTuple):
    """The scheduler's job as the lineage last recorded it."""

    job: str
    state: str
    restarts: int
    seq: int  # the node that recorded it

    def __str__(self) -> str:
        again = f", requeued {self.restarts}x" if self.restarts else ""
        return f"SLURM job {self.job}: {self.state}{again} (at seq {self.seq})"


def scheduler_state(store: StoreReader, name: str, nonce: str) -> SchedulerState | None:
    """The lineage's scheduler job and its last recorded state, or None (not scheduled)."""
    found = store.last_value(name, nonce, "slurm/state")
    if found is None:
        return None
    seq, state = found
    values = store.values(Node(name, nonce, seq))
    restarts = values.get("slurm/restarts", 0)
    return SchedulerState(
        job=str(values.get("slurm/job", "?")),
        state=str(state),
        restarts=restarts if isinstance(restarts, int) else 0,
        seq=seq,
    )
