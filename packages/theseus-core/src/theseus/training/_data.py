"""The trainer's side of its data: the node-cached batches, and that the datasets fit the model.

`NodeBatches` keeps the host batches the live node has read, so `batch()` at one node
always returns the same rows and a new node reads afresh. `check_data` runs at setup:
every prepared dataset has a window's worth of tokens, was prepared with the model's
tokenizer, and uses no id past the model's vocabulary. `records` are what a checkpoint
keeps of the tokens it was trained on (each header's sha256 and settings), and `changed_tokens`
says, on restore, which datasets now hold other tokens: a resumed lineage would read
other batches than it did before (`theseus data prepare --replace` was run since).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from theseus.config import Tree
from theseus.data.batches import Batch, MixturePlan
from theseus.data.prepared import setting_changes, short_digest
from theseus.training._errors import TrainerError

__all__ = ["NodeBatches", "changed_tokens", "check_data", "records"]


class NodeBatches:
    """Host batches of the live node, by `(node, slice, validation index)`."""

    def __init__(self) -> None:
        self._held: dict[tuple[Any, ...], Batch] = {}

    def get(self, key: tuple[Any, ...], read: Callable[[], Batch]) -> Batch:
        """The batch held under `key` (its first entry the node), or `read()` and hold it.

        A batch read for a new node drops those of every other node.
        """
        if key not in self._held:
            batch = read()
            self._held = {k: v for k, v in self._held.items() if k[0] == key[0]}
            self._held[key] = batch
        return self._held[key]


def check_data(plan: MixturePlan | None, configuration: Tree, block_size: int) -> None:
    """Every dataset of `plan` speaks the model's tokenizer, within its vocabulary.

    The model's are `architecture/tokenizer` (any, when unset) and
    `architecture/vocab_size` of `configuration`. No plan (no data) passes.

    Raises:
        TrainerError: a dataset too short for one window of `block_size` (+1 target),
            prepared with another tokenizer, or with more ids than the vocabulary.
    """
    if plan is None:
        return
    vocab = int(configuration["architecture/vocab_size"])
    tokenizer = configuration.get("architecture/tokenizer")
    for source, style in zip(plan.sources, plan.styles, strict=True):
        for split, count in source.header["count"].items():
            if style == "pmd" and count <= block_size:
                raise TrainerError(
                    f"dataset {source.name!r} has {count:,} {split} tokens, too few for "
                    f"one window of architecture/block_size = {block_size} (+1 "
                    "target); prepare it from more text, or lower block_size"
                )
        used = source.header["tokenizer"]
        if tokenizer is not None and used != tokenizer:
            raise TrainerError(
                f"dataset {source.name!r} was prepared with tokenizer {used!r}, but the "
                f"model reads {tokenizer!r} ids (architecture/tokenizer); prepare it again "
                f"in those (replacing the {used!r} tokens, which runs trained on them would "
                f"read from then on): theseus data prepare {source.name} --root ROOT --source "
                f"DIR --tokenizer {tokenizer} --replace"
            )
        needed = source.tokenizer.vocab_size
        if vocab < needed:
            raise TrainerError(
                f"architecture/vocab_size = {vocab} is smaller than the {source.tokenizer.name} "
                f"tokenizer's {needed} ids used by dataset {source.name!r}; set "
                f"architecture/vocab_size={needed} or larger"
            )


def records(plan: MixturePlan | None) -> dict[str, dict[str, Any]]:
    """What a checkpoint records of the tokens it trained on, by dataset name: each
    header's `digest` (sha256 of the tokens), `tokenizer`, `count` and the dataset's own
    `meta` (its settings: a language's seed, a source folder). A dataset prepared before
    headers kept a digest is left out, and so is every dataset of a trainer without data."""
    if plan is None:
        return {}
    return {
        source.name: {
            key: source.header.get(key) for key in ("digest", "tokenizer", "count", "meta")
        }
        for source in plan.sources
        if source.header.get("digest")
    }


def changed_tokens(recorded: dict[str, Any] | None, plan: MixturePlan | None) -> str | None:
    """What differs between the tokens a checkpoint `recorded` (its meta's `data`) and
    those `plan` reads now, in words (each dataset's digests then and now and its settings
    that changed), or None where every dataset both know is the same.

    A checkpoint saved before checkpoints recorded their tokens, a dataset that one side
    lacks, or one prepared before headers kept a digest is not compared."""
    now = records(plan)
    differ = []
    for name, then in sorted((recorded or {}).items()):
        then = then if isinstance(then, dict) else {"digest": then}  # a digest alone
        if name not in now or now[name]["digest"] == then.get("digest"):
            continue
        settings = setting_changes(then, now[name])
        differ.append(
            f"{name!r} (sha256 {short_digest(then.get('digest'))} then, "
            f"{short_digest(now[name]['digest'])} now"
            + (f": {'; '.join(settings)}" if settings else "")
            + ")"
        )
    if not differ:
        return None
    return f"dataset{'s' if len(differ) > 1 else ''} {', '.join(differ)}"
