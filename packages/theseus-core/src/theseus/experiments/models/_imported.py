"""Published weights as a lineage: the job shape `theseus import gpt2` and `import hf` share.

An `ImportedWeights` job's fresh run reads a folder (its `initial_state`, which each
import defines) and saves those weights as its first node's checkpoint; nothing else.
Resumed or branched, it is a GPT trainer that fine-tunes on text prepared with the
imported tokenizer (`text`). `check_new_run` refuses, before anything is read, a run
that already has a lineage under the root.
"""

from __future__ import annotations

import os
import shlex
from typing import Any, ClassVar

from theseus.data.datasets import TextFiles
from theseus.experiments.models.gpt import PretrainGPT
from theseus.job import Mode, store_root
from theseus.store import MARKER, Node, Store
from theseus.training.base import TrainerError
from theseus.training.flywheel.strategy import Sampling

__all__ = ["ImportedWeights", "check_new_run"]


class ImportedWeights(PretrainGPT):
    """A fresh run saves the weights of the folder its `source` setting names; resume or
    branch fine-tunes on `text`. Subclasses define `initial_state` (the weights)."""

    DATASET = Sampling(TextFiles, 1.0, "pmd")
    #: the import command's kind (`theseus import KIND`), for messages
    KIND: ClassVar[str]

    def data_required(self, mode: Mode) -> bool:
        """Only a branch must find its data at setup (an import reads none)."""
        return mode is Mode.BRANCH

    def source(self) -> str:
        """The folder a fresh run imports.

        Raises:
            TrainerError: the setting is empty (a fresh run started without an import).
        """
        if not self.args.source:
            raise TrainerError(
                f"a fresh {self.KIND} run imports weights and {self.KIND}/source is empty; "
                f"run theseus import {self.KIND} FOLDER ROOT, or resume or branch an "
                "imported lineage"
            )
        return str(self.args.source)

    def run(self) -> Any:
        """Fresh: save the imported weights as the first node's checkpoint. Else: train."""
        if self.mode is not Mode.FRESH:
            return super().run()
        self.save_checkpoint(copy=False)  # nothing changes the weights while they are written
        return self.state

    def outcome(self, result: Any) -> list[str]:
        if self.mode is not Mode.FRESH:
            return super().outcome(result)
        root = shlex.quote(str(self.spec.root))
        return [
            f"Tokenizer: {self.configuration['architecture/tokenizer']} "
            f"(under {os.path.join(self.spec.root, 'tokenizers')})",
            f"Sample:    theseus sample {root} {self.node.name}~{self.node.nonce} "
            "'Hello, my name is' --max-new-tokens 20",
        ]


def check_new_run(
    root: str | os.PathLike[str], run: str, *, project: str | None = None, group: str | None = None
) -> None:
    """Refuse a name that cannot be a run's, or a run that already has a lineage in `root`.

    Raises:
        InvalidNodeError: not a valid name.
        TrainerError: the run exists (an import makes a run of its own).
    """
    name = Node.new(run, project=project, group=group).name
    if not (store_root(root) / MARKER).is_file():
        return
    with Store(store_root(root)) as store:
        taken = sorted({f"{n.name}~{n.nonce}" for n in store.query().name(name).all()})
    if taken:
        raise TrainerError(
            f"run {name} already has lineage(s) {', '.join(taken)} under {root}; import "
            "under another --run, or use that lineage"
        )
