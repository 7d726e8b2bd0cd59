"""GPT-2's published weights as a lineage (`gpt2`): imported, sampled, analyzed, fine-tuned.

`import_gpt2(folder, root)` (the command `theseus import gpt2 SRC ROOT`) checks a local
Hugging Face GPT-2 folder, keeps a copy of its tokenizer under `ROOT/tokenizers/`, and
runs a fresh `GPT2` job whose only work is to save those weights as the checkpoint of
its first node. From there the lineage is like any other: `theseus sample`, analyses
and the debugger on a prompt (`inspection/prompt`), and resume or branch to fine-tune
on text prepared with the same tokenizer (`theseus data prepare text --tokenizer NAME`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from theseus.config import field
from theseus.data.tokenizer import install_tokenizer
from theseus.experiments.models._imported import ImportedWeights, check_new_run
from theseus.model.gpt2 import read_gpt2
from theseus.registry import job
from theseus.store import Node
from theseus.training import state as train_state
from theseus.training.base import BaseTrainerConfig, TrainerError

__all__ = ["GPT2", "GPT2Config", "check_new_run", "import_gpt2"]


@dataclass
class GPT2Config(BaseTrainerConfig):
    """The trainer's settings, and the folder a fresh run imports."""

    source: str = field(
        "gpt2/source", default="", help="the Hugging Face GPT-2 folder the weights came from"
    )


@job("gpt2")
class GPT2(ImportedWeights):
    """GPT-2 weights: a fresh run imports `gpt2/source`; resume or branch fine-tunes on `text`."""

    CONFIG = GPT2Config
    KIND = "gpt2"

    def initial_state(self) -> Any:
        """The folder's weights, checked against this job's configuration."""
        folder = read_gpt2(self.source())
        for key, value in folder.settings.items():
            if self.configuration[key] != value:
                raise TrainerError(
                    f"{key} is {self.configuration[key]!r}, but the weights in "
                    f"{folder.path} need {value!r}; leave the architecture as the import sets it"
                )
        assert self._layout is not None
        return train_state.from_params(self._layout, folder.params())


def import_gpt2(
    src: str | os.PathLike[str],
    root: str | os.PathLike[str],
    run: str = "gpt2",
    *,
    project: str | None = None,
    group: str | None = None,
) -> Node:
    """Bring a local Hugging Face GPT-2 folder into `root` as a new lineage of `run`.

    The folder is checked completely first (configuration, every tensor's name and
    shape, tokenizer): a folder that does not hold a GPT-2 writes nothing. Then the
    tokenizer is copied to `ROOT/tokenizers/gpt2-<hash>/` and a fresh `GPT2` job saves
    the weights as its first node's checkpoint (step 0).

    Returns:
        The node holding the checkpoint (`name~nonce~0`).

    Raises:
        GPT2FolderError: the folder is not a GPT-2 this model can load.
        InvalidNodeError: `run`, `project` or `group` is not a valid name.
        TrainerError: the run already has a lineage under `root`.
    """
    from theseus.quick import quick

    check_new_run(root, run, project=project, group=group)
    folder = read_gpt2(src)
    with quick(root) as q:
        q.build(GPT2, run, project=project, group=group)
        for key, value in folder.settings.items():
            q.config[key] = value
        q.config["architecture/tokenizer"] = install_tokenizer(root, folder.tokenizer, "gpt2")
        q.config["gpt2/source"] = str(folder.path)
        imported = q.create()
        imported()
        return imported.node
