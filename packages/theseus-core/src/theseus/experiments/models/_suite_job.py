"""The job that writes a suite's revisions as the checkpointed nodes of one lineage.

`RevisionWriter` is a mixin over a job whose fresh run imports one folder (`HF`).
Instead of a new lineage's seq 0, its live node is the first planned revision's node
(`name~nonce~step`, in a new lineage or in the suite's existing one), and its run moves
through the plan in step order: each revision's node is recorded with its parent (the
node before it), the job's configuration (so each node restores and resumes alone),
its checkpoint (the revision's weights and a fresh optimizer at state step 0, in the
checkpoint folder named by the revision's step, so the revisions of one lineage
folder never collide) and its `import/...` values. The
checkpoints are saved by the trainer's own keeper, so a save overlaps the next
revision's read. Resumed or branched, the job is the family's job: it trains.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from theseus.config import dump
from theseus.job import Mode, is_primary
from theseus.registry import job_key
from theseus.store import Node, Scalar
from theseus.training import state as train_state
from theseus.training.base import BaseTrainer

__all__ = ["Planned", "RevisionWriter"]


@dataclass
class Planned:
    """One revision to write.

    Attributes:
        node: its node (`seq` = its step; after the last step for a name without one).
        step: the checkpoint's step (the folder's name): the revision's step, else `seq`.
        load: returns its weights as a train state laid out as the given `StateLayout`
            (a fresh optimizer; `theseus.model.hf.load_state` streams them in).
        values: the `import/...` values for its node.
    """

    node: Node
    step: int
    load: Callable[[train_state.StateLayout], Any]
    values: Mapping[str, Scalar] = field(default_factory=dict)


class RevisionWriter(BaseTrainer):
    """A fresh run that writes `plan` (set before the call) as checkpointed nodes."""

    plan: list[Planned]

    def _choose(self, mode: Mode) -> Node:
        """Fresh: the first planned node (recorded with its parent and configuration)."""
        if mode is not Mode.FRESH:
            return super()._choose(mode)
        if not getattr(self, "plan", None):
            raise ValueError(f"{type(self).__name__} writes a plan; set job.plan before setup")
        return self._enter(self.plan[0].node)

    def _enter(self, node: Node) -> Node:
        if is_primary():
            self.store.touch(node)
            self.store.record_job(node, job_key(type(self)), dump(self.configuration))
        return node

    def initial_state(self) -> Any:
        """The first planned revision's weights."""
        return self._revision_state(self.plan[0])

    def _revision_state(self, planned: Planned) -> Any:
        return planned.load(self.layout)

    def run(self) -> Any:
        """Fresh: write every planned revision, in order. Resumed or branched: train."""
        if self.mode is not Mode.FRESH:
            return super().run()
        for index, planned in enumerate(self.plan):
            if index:
                self._node = self._enter(planned.node)
                self.state = self._revision_state(planned)
            self._save_revision(planned)
            self.log(dict(planned.values))
        return self.state

    def _save_revision(self, planned: Planned) -> None:
        """Start saving the live state as `planned.step` of the live node (as
        `save_checkpoint` does, with the revision's step naming the folder)."""
        self.loop.save(copy=False, step=planned.step)  # the next revision is new arrays
