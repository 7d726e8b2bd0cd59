"""What the browser tells apart about an imported revision: its job records and settings.

``theseus import hf --revisions ...`` writes a published training suite as one lineage,
one node per revision (seq = the training step), each holding ``import/revision``
(``import/step`` where the revision's name gives one) and a job record of its own, so
each restores alone. Those records are revisions brought in, not a run started again,
and the record's training settings (learning rate, batch, tokens) never applied to
them: only the architecture and the import's own keys (``import/*``) did. A node
trained after an import (a resume or a branch of the suite) holds no ``import/revision``
and is a real run again.
"""

from __future__ import annotations

from collections.abc import Mapping

from theseus.store._node import Node
from theseus.store._store import Store

__all__ = ["IMPORT", "applied_settings", "imported", "job_starts"]

# The value an imported revision's node holds (its revision's name).
IMPORT = "import/revision"
# The key of an imported revision's training step, where its name gives one.
IMPORT_STEP = "import/step"
# The sections of a job configuration that apply to an imported revision.
APPLIED = ("job", "architecture")


def imported(values: Mapping[str, object]) -> bool:
    """Whether a node's ``values`` are an imported revision's (they hold ``import/revision``)."""
    return IMPORT in values


def job_starts(
    store: Store, name: str, nonce: str, seqs: list[int], jobs: list[int]
) -> tuple[list[int], list[int | str]]:
    """Split a lineage's job records into resumes and imported revisions.

    Args:
        seqs: the lineage's seqs, sorted; ``jobs``: the seqs that hold a job record.

    Returns:
        ``(resumes, revisions)``: the seqs past the lineage's first node where a job
        started again, and the imported revisions' steps (``import/step``, else the
        revision's name), in seq order.
    """
    if not seqs or not jobs:
        return [], []
    steps = dict(store.numeric_series(name, nonce, IMPORT_STEP, seqs[0], seqs[-1]))
    resumes: list[int] = []
    revisions: list[int | str] = []
    for seq in jobs:
        if seq in steps:
            revisions.append(int(steps[seq]))
            continue
        revision = store.values(Node(name, nonce, seq)).get(IMPORT)
        if revision is not None:
            revisions.append(str(revision))
        elif seq > seqs[0]:
            resumes.append(seq)
    return resumes, revisions


def applied_settings(config: str) -> str:
    """The part of a job configuration (YAML, as the store holds it) that applied to an
    imported revision: its ``job:`` line and ``architecture:`` section, comments kept.

    >>> applied_settings("job: hf/suite\\ntraining:\\n  lr: 0.1\\narchitecture:\\n  n_layers: 2\\n")
    'job: hf/suite\\narchitecture:\\n  n_layers: 2\\n'
    """
    kept: list[str] = []
    keep = False
    for line in config.splitlines(keepends=True):
        if line.strip() and not line[0].isspace():  # a top-level key starts a section
            keep = line.split(":", 1)[0].strip() in APPLIED
        if keep:
            kept.append(line)
    return "".join(kept)
