"""GPT-2's published weights as a lineage (`gpt2`): imported, sampled, analyzed, fine-tuned.

`import_gpt2(folder, root)` (the command `theseus import gpt2 SRC ROOT`) is
`import_hf` (`theseus.experiments.models.hf`) for a folder of `model_type` `gpt2`,
under the job `GPT2`: the folder is checked by `read_gpt2` (the Hugging Face reader,
restricted to GPT-2), its tokenizer is kept under `ROOT/tokenizers/`, and a fresh
`GPT2` job streams the weights into its layout and saves them as the checkpoint of its
first node. From there the lineage is like any other: `theseus sample`, analyses and
the debugger on a prompt (`inspection/prompt`), and resume or branch to fine-tune on
text prepared with the same tokenizer (`theseus data prepare text --tokenizer NAME`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from theseus.config import field
from theseus.experiments.models._imported import ImportedWeights, check_new_run
from theseus.experiments.models.hf import check_settings, import_hf
from theseus.model.gpt2 import read_gpt2
from theseus.model.hf import HFFolder, load_state
from theseus.registry import job
from theseus.store import Node
from theseus.training.base import BaseTrainerConfig

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
        """The folder's weights, checked against this job's configuration and streamed
        into its state layout (no optimizer state: a resume starts a fresh one)."""
        folder = read_gpt2(self.source())
        check_settings(self.configuration, folder)
        return load_state(self.layout, folder)


def import_gpt2(
    src: str | os.PathLike[str] | HFFolder,
    root: str | os.PathLike[str],
    run: str = "gpt2",
    *,
    project: str | None = None,
    group: str | None = None,
) -> Node:
    """Bring a local Hugging Face GPT-2 folder into `root` as a new lineage of `run`.

    The run's name is checked first, then the folder completely (configuration, every
    tensor's name, shape and dtype, tokenizer): a folder that does not hold a GPT-2
    writes nothing. Then `import_hf` with the job `GPT2` copies the tokenizer to
    `ROOT/tokenizers/gpt2-<hash>/` and saves the weights as the first node's
    checkpoint (step 0).

    Args:
        src: the folder, or one `read_gpt2` checked.

    Returns:
        The node holding the checkpoint (`name~nonce~0`).

    Raises:
        GPT2FolderError: the folder is not a GPT-2 this model can load.
        InvalidNodeError: `run`, `project` or `group` is not a valid name.
        TrainerError: the run already has a lineage under `root`.
    """
    check_new_run(root, run, project=project, group=group)  # refused before any reading
    if not (isinstance(src, HFFolder) and src.model_type == "gpt2"):
        src = read_gpt2(src.path if isinstance(src, HFFolder) else src)
    return import_hf(src, root, run, project=project, group=group, job_class=GPT2)
