"""Where a trainer's state comes from when it does not start fresh: a node's checkpoint.

A resumed or branched trainer (and an analysis walking a lineage) finds its base's last
checkpoint through the store (`checkpoint_path`, read on host zero and broadcast), reads
it into the state's layout (`read_checkpoint`, given the layout and the trainer's
`surgery`), and takes it as the live state with the data cursor the checkpoint sets
(`cursors`). `BaseTrainer`'s `checkpoint_path`, `read_checkpoint` and `restore_node`
call these with what they need; nothing here knows the trainer. `restore_node` moves a
resumed trainer to another node through the same path as setup into the same layout,
so programs compiled for the previous node are reused (an analysis walking a lineage
compiles once). The two refusals of this path live here too, each naming the
checkpoint to use instead: a node without a checkpoint (`no_checkpoint_message`) and a
resume that would train over later checkpoints (`refuse_later_checkpoints`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from theseus.job import Mode, from_host_zero
from theseus.store import Node, Store
from theseus.training import state as train_state
from theseus.training._errors import TrainerError

__all__ = [
    "checkpoint_path",
    "cursors",
    "no_checkpoint_message",
    "read_checkpoint",
    "refuse_later_checkpoints",
]


def checkpoint_path(store: Callable[[], Store], node: Node, mode: Mode = Mode.RESUME) -> str:
    """The folder of `node`'s (last) checkpoint: host zero reads the store, every host
    receives it.

    Args:
        store: gives the store (called on host zero only, which alone opens it).

    Raises:
        TrainerError: `node` has no checkpoint; the message names the closest one
            of its lineage (`mode` words it: resume or branch from).
    """
    saved = from_host_zero(lambda: store().checkpoints(node))
    if not saved:
        raise TrainerError(from_host_zero(lambda: no_checkpoint_message(store(), node, mode)))
    return saved[-1].path


def read_checkpoint(
    path: str | os.PathLike[str],
    layout: train_state.StateLayout,
    surgery: Callable[[Any, Any], Any] | None = None,
) -> tuple[Any, dict[str, Any]]:
    """`(state, meta)` of the checkpoint folder `path`, laid out as `layout`.

    Reads only the folder (never the store), through `surgery` when the trainer has
    one; on one process it may run on a background thread while the live state is
    used (`BaseTrainer.restore_node` then takes what it read).
    """
    return train_state.restore(path, layout, surgery)


def cursors(meta: dict[str, Any], mode: Mode, seq: int) -> tuple[int, int]:
    """`(cursor_offset, next_cursor)` of a live node at `seq` restored from a checkpoint's `meta`.

    The checkpointed update consumed the batch at `meta["cursor"]`. Resume continues
    the checkpoint's own node (its batch is spent); a branch starts a new lineage whose
    first node reads the batch after it. Either way the next update reads that one.
    """
    spent = int(meta["cursor"])
    live = spent if mode is Mode.RESUME else spent + 1
    return live - seq, spent + 1


def no_checkpoint_message(store: Store, base: Node, mode: Mode) -> str:
    """Name the closest checkpointed node of `base`'s lineage, in both spellings."""
    found = [
        c.node
        for c in store.query().nonce(base.nonce).checkpoints()
        if c.node.name == base.name and c.node.seq <= base.seq
    ]
    message = f"node {base.serialize()} has no checkpoint to {mode.value} from"
    if not found:
        return (
            f"{message}, and neither has any node of its lineage before it. Start a "
            "fresh run, or pick a checkpointed node (`theseus-store runs ROOT/store` "
            "lists lineages with their checkpoints; in Python "
            "q.find().spec(run=...).checkpoint().latest())"
        )
    closest = max(found, key=lambda n: n.seq)
    flag = "--resume" if mode is Mode.RESUME else "--branch"
    return (
        f"{message}; the closest checkpoint of its lineage is at {closest.serialize()}. "
        f"Use that node: theseus run ... {flag} {closest.serialize()}, or in Python "
        f"q.find().nonce({closest.nonce!r}).seq({closest.seq}).{mode.value}()"
    )


def refuse_later_checkpoints(store: Store, base: Node) -> None:
    """Raise if `base`'s lineage has checkpoints after it: resuming would train over them.

    Raises:
        TrainerError: naming the last of them, and how to branch or resume instead.
    """
    later = [
        c
        for c in store.query().nonce(base.nonce).checkpoints()
        if c.node.name == base.name and c.node.seq > base.seq
    ]
    if later:
        last = max(later, key=lambda c: c.node.seq)
        lineage = f"{base.name}~{base.nonce}"
        raise TrainerError(
            f"cannot resume training from {base.serialize()}: its lineage {lineage} already has "
            f"{len(later)} later checkpoint(s), the last at {last.node.serialize()} (step "
            f"{last.step}), and resuming would train over them. Branch from this node to "
            f"train a new lineage (q.find()...branch(), or theseus run --branch "
            f"{base.serialize()}), or resume the lineage's last checkpoint "
            f"(--resume {lineage})."
        )
