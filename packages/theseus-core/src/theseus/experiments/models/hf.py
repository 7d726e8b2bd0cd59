"""A Hugging Face model folder as a lineage (`hf`): imported, sampled, analyzed, fine-tuned.

`import_hf(folder, root)` (the command `theseus import hf SRC ROOT`) checks a local
Hugging Face folder of a GPT-2, GPT-NeoX (Pythia), Llama, Mistral, Qwen2 or OLMo-2,
keeps a copy of its tokenizer under `ROOT/tokenizers/`, and runs a fresh `HF` job whose
only work is to stream those weights, shard by shard, into the layout of the chosen
`training/strategy` and `training/shard`, and save them as its first node's checkpoint.
`write_revision(job, folder)` writes one folder's weights as the checkpoint of any
node a job is set up at (a training suite's revisions, one node each).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from theseus.config import field
from theseus.data.tokenizer import install_tokenizer
from theseus.experiments.models._imported import ImportedWeights, check_new_run
from theseus.model.hf import HFFolder, HFFolderError, load_state, read_hf
from theseus.registry import job
from theseus.store import Node
from theseus.training._steps import accumulate_steps
from theseus.training.base import BaseTrainerConfig, TrainerError
from theseus.training.sharding import make_mesh

__all__ = [
    "HF",
    "HFConfig",
    "check_overrides",
    "check_settings",
    "compose",
    "import_hf",
    "read_model",
    "write_revision",
]

# Settings a user may set at import that the weights do not fix: the context of a
# rotary model (shorter than the folder's, for a smaller KV cache) is one.
_FREE_WITH_ROTARY = ("architecture/block_size",)


@dataclass
class HFConfig(BaseTrainerConfig):
    """The trainer's settings, and the folder a fresh run imports."""

    source: str = field(
        "hf/source", default="", help="the Hugging Face model folder the weights came from"
    )


def check_settings(configuration: Any, folder: HFFolder) -> None:
    """Refuse a configuration whose architecture differs from what the folder needs.

    A rotary model's `architecture/block_size` may be set lower than the folder's
    context (every position below it is computed exactly).

    Raises:
        TrainerError: the first setting that differs, named with both values.
    """
    rotary = folder.settings.get("architecture/positions") == "rotary"
    for key, value in folder.settings.items():
        have = configuration[key]
        if key in _FREE_WITH_ROTARY and rotary and isinstance(have, int) and 1 <= have <= value:
            continue
        if have != value:
            raise TrainerError(
                f"{key} is {have!r}, but the weights in {folder.path} need {value!r}; "
                "leave the architecture as the import sets it"
            )


@job("hf")
class HF(ImportedWeights):
    """Hugging Face weights: a fresh run imports `hf/source`; resume or branch fine-tunes."""

    CONFIG = HFConfig
    KIND = "hf"

    def initial_state(self) -> Any:
        """The folder's weights, streamed into this job's state layout."""
        folder = read_hf(self.source())
        check_settings(self.configuration, folder)
        return load_state(self.layout, folder)


def write_revision(job: HF, folder: HFFolder) -> None:
    """Write `folder`'s weights as the checkpoint of the node `job` is set up at.

    The seam for importing a training suite: the caller creates an `HF` job (through
    `quick`, fresh or resumed) at the node it chose, with the lineage's configuration,
    and passes each revision's checked folder. The weights are streamed into the
    job's layout (its `training/strategy` and `training/shard`) and saved at step 0 of
    that node; the checkpoint is registered when the job finishes (`job.on_finish()`,
    which calling the job does).

    Raises:
        TrainerError: the folder's architecture differs from the job's configuration.
        HFFolderError: a tensor could not be read.
    """
    check_settings(job.configuration, folder)
    job.state = load_state(job.layout, folder)  # the job is set up (quick's create() does it)
    job.save_checkpoint(copy=False)


def compose(
    tree: Any,
    folder: HFFolder,
    tokenizer: str,
    overrides: Mapping[str, Any] | None = None,
    *,
    source: str = "hf/source",
) -> None:
    """Set the import's configuration values in `tree`: the folder's settings, its path
    (at `source`, the job's `KIND/source`), the tokenizer's name, then `overrides`.

    `training/tokens`, which an import never trains, is raised to one batch of the
    folder's context when it is below (a 128k-token context makes the default too small
    for the rule that a run trains at least one batch), unless an override sets it.
    """
    tree.update(dict(folder.settings))
    tree.update({"architecture/tokenizer": tokenizer, source: str(folder.path)})
    tree.update(dict(overrides or {}))
    if "training/tokens" not in (overrides or {}):
        batch = int(tree["training/batch_size"]) * int(tree["architecture/block_size"])
        if int(tree["training/tokens"]) < batch:
            tree["training/tokens"] = batch


def check_overrides(
    folder: HFFolder,
    overrides: Mapping[str, Any] | None = None,
    *,
    job_class: type[ImportedWeights] = HF,
) -> None:
    """Compose the import's configuration (of `job_class`) and check it, writing nothing.

    Raises:
        ConfigError: an override names no setting, does not fit it, or breaks a rule;
            `training/shard` does not divide the device count.
        TrainerError: an override changes the architecture the weights fix, or the
            batch does not split over the data-parallel devices.
    """
    from theseus.data.tokenizer import tokenizer_name

    name = tokenizer_name(folder.tokenizer, folder.model_type, folder.eot)
    tree = job_class.schema()
    compose(tree, folder, name, overrides, source=f"{job_class.KIND}/source")
    tree.check()  # the rules across settings
    check_settings(tree, folder)
    # what the job's setup refuses about the devices, refused before the root is touched
    mesh = make_mesh(int(tree["training/shard"]))
    accumulate_steps(
        int(tree["training/batch_size"]),
        int(tree["training/per_device_batch_size"]),
        int(mesh.shape["batch"]),
    )


def read_model(src: str | os.PathLike[str]) -> HFFolder:
    """`read_hf(src)`; a suite's folder (a cache or one subfolder per revision) is
    refused with the way to import a suite."""
    from theseus.experiments.models._revisions import RevisionError, discover

    try:
        return read_hf(src)
    except HFFolderError as error:
        folder, found = Path(src).expanduser(), []
        if not (folder / "config.json").is_file():
            with contextlib.suppress(RevisionError):  # not a suite: read_hf's message stands
                found = [revision.name for revision in discover(folder)]
        if not found:
            raise error
        shown = ", ".join(found[:4]) + (", ..." if len(found) > 4 else "")
        raise HFFolderError(
            f"{folder} holds a training suite of {len(found)} revision(s) ({shown}), not "
            "one model's folder; import it with --revisions all or --revisions R1,R2 "
            "(import_suite in Python), or pass one revision's folder"
        ) from None


def import_hf(
    src: str | os.PathLike[str] | HFFolder,
    root: str | os.PathLike[str],
    run: str = "hf",
    *,
    project: str | None = None,
    group: str | None = None,
    overrides: Mapping[str, Any] | None = None,
    job_class: type[ImportedWeights] = HF,
) -> Node:
    """Bring a local Hugging Face model folder into `root` as a new lineage of `run`.

    The folder and the overrides are checked completely first (configuration, every
    tensor's name, shape and dtype, tokenizer, the composed job configuration): a bad
    folder writes nothing, not even the root. Then the tokenizer is copied to
    `ROOT/tokenizers/<model_type>-<hash>/` and a fresh `job_class` job (`HF`) streams
    the weights into its state and saves them as its first node's checkpoint (step 0).

    Args:
        overrides: configuration values (`{"training/strategy": "fsdp"}`), e.g. parsed
            from the command line's KEY=VALUE; the architecture is the folder's.
        job_class: the import's job (`theseus import gpt2` passes `GPT2`, whose folder
            setting is `gpt2/source`).

    Returns:
        The node holding the checkpoint (`name~nonce~0`).

    Raises:
        HFFolderError: the folder is not a model this import can load.
        ConfigError: an override names no setting or does not fit it.
        InvalidNodeError: `run`, `project` or `group` is not a valid name.
        TrainerError: the run already has a lineage under `root`, or an override
            changes the architecture.
    """
    from theseus.quick import quick

    check_new_run(root, run, project=project, group=group)
    folder = src if isinstance(src, HFFolder) else read_model(src)
    check_overrides(folder, overrides, job_class=job_class)
    with quick(root) as q:
        q.build(job_class, run, project=project, group=group)
        installed = install_tokenizer(root, folder.tokenizer, folder.model_type, folder.eot)
        compose(q.config, folder, installed, overrides, source=f"{job_class.KIND}/source")
        imported = q.create()
        imported()
        return imported.node
