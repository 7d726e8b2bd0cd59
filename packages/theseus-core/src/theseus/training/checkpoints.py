"""Checkpoints: asynchronous orbax saves, registered in the store only once committed.

A lineage's checkpoints live in `ROOT/checkpoints/<project>/<group>/<run>/<nonce>/<step>/`
with two items: `state` (parameters, optimizer state and step) and `meta` (JSON: data
cursor, seed, the saved configuration). Saving returns at once; `poll()` (called every
step) and `wait()` register finished saves on their nodes, so the store never lists a
checkpoint that is still being written. A step folder that was committed but never
registered (the process died in between) is moved to `unregistered/` when the lineage
saves again, so a resumed run can write that step anew.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from theseus.job import sync_hosts
from theseus.store import Node, Store

__all__ = [
    "CheckpointKeeper",
    "CheckpointMismatchError",
    "checkpoint_dir",
    "restore",
    "set_aside_unregistered",
]


class CheckpointMismatchError(ValueError):
    """A checkpoint's parameter shapes differ from the model being restored into."""


def checkpoint_dir(root: str | os.PathLike[str], node: Node) -> Path:
    """The folder that holds every checkpoint of `node`'s lineage."""
    project, group, run = node.name.split(".", 2)
    return Path(root).absolute() / "checkpoints" / project / group / run / node.nonce


class CheckpointKeeper:
    """Saves a lineage's checkpoints and registers each once orbax has committed it.

    Args:
        directory: the lineage's checkpoint folder (`checkpoint_dir(root, node)`).
        store: where finished checkpoints are registered (None on hosts other than zero).
    """

    def __init__(self, directory: Path, store: Store | None) -> None:
        self.directory = directory
        self.store = store
        if store is not None:
            set_aside_unregistered(directory, store)
        sync_hosts(f"theseus/checkpoints/open/{directory.name}")
        options = ocp.CheckpointManagerOptions(enable_async_checkpointing=True, create=True)
        self.manager = ocp.CheckpointManager(directory, options=options)
        self._pending: list[tuple[int, Node, dict[str, Any]]] = []

    def save(self, step: int, node: Node, state: Any, meta: dict[str, Any]) -> None:
        """Start saving `state` as `step`; it is registered on `node` once committed."""
        self.manager.save(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)
            ),
            force=True,
        )
        self._pending.append((step, node, meta))

    def poll(self) -> None:
        """Register saves that have finished (cheap; call it every step)."""
        if self._pending and not self.manager.is_saving_in_progress():
            self._register()

    def wait(self) -> None:
        """Block until every save is committed, then register them."""
        self.manager.wait_until_finished()
        self._register()

    def _register(self) -> None:
        self.manager.check_for_errors()
        for step, node, meta in self._pending:
            if self.store is not None:
                self.store.checkpoint(node, self.directory / str(step), meta=meta, step=step)
        self._pending.clear()

    def close(self) -> None:
        """Wait for pending saves, register them, and release orbax's threads."""
        self.wait()
        self.manager.close()


SET_ASIDE = "unregistered"


def set_aside_unregistered(directory: Path, store: Store) -> list[Path]:
    """Move step folders the store never registered into `directory/unregistered/`.

    A process killed after orbax committed a step but before the store registered it
    leaves such a folder. The run resumes from the last registered checkpoint and
    saves that step again, which orbax refuses while the old folder is there. The
    folder is moved aside (never deleted): `unregistered/<step>` (or `<step>-<n>`).

    Returns:
        The new paths of the folders moved.
    """
    if not directory.is_dir():
        return []
    nonce = directory.name
    registered = {
        Path(c.path).name
        for c in store.query().nonce(nonce).checkpoints()
        if Path(c.path).parent == directory
    }
    moved = []
    for entry in sorted(directory.iterdir()):
        if entry.is_dir() and entry.name.isdigit() and entry.name not in registered:
            aside = directory / SET_ASIDE
            aside.mkdir(exist_ok=True)
            target, n = aside / entry.name, 0
            while target.exists():
                n += 1
                target = aside / f"{entry.name}-{n}"
            entry.rename(target)
            moved.append(target)
    return moved


def _key_name(entry: Any) -> str:
    for attribute in ("key", "name", "idx"):
        if hasattr(entry, attribute):
            return str(getattr(entry, attribute))
    return str(entry)


def _shapes(tree: Any) -> dict[str, tuple[int, ...]]:
    """`{"params/blocks_0/attn/c_attn/kernel": shape}`; named tuples and dicts spell alike."""
    flat = jax.tree_util.tree_flatten_with_path(tree)[0]
    return {
        "/".join(_key_name(k) for k in path): tuple(getattr(leaf, "shape", ()))
        for path, leaf in flat
    }


def _manager(directory: Path) -> ocp.CheckpointManager:
    handlers = {"state": ocp.StandardCheckpointHandler(), "meta": ocp.JsonCheckpointHandler()}
    return ocp.CheckpointManager(directory, item_handlers=handlers)


def restore(
    path: str | os.PathLike[str],
    abstract_state: Any,
    surgery: Callable[[Any, Any], Any] | None = None,
) -> tuple[Any, dict[str, Any]]:
    """Restore a checkpoint directory into the shapes and shardings of `abstract_state`.

    Args:
        path: a checkpoint step directory (`.../<nonce>/<step>`).
        abstract_state: a pytree of `jax.ShapeDtypeStruct` with shardings (the target).
        surgery: when shapes differ, `surgery(saved, abstract_state)` receives the saved
            state as host arrays and returns a state matching `abstract_state`.

    Returns:
        `(state, meta)`.

    Raises:
        CheckpointMismatchError: shapes differ and there is no surgery; the message names
            the first mismatching parameter path and both shapes.
    """
    step_dir = Path(path)
    with _manager(step_dir.parent) as manager:
        step = int(step_dir.name)
        saved_meta = manager.item_metadata(step)
        saved_shapes = _shapes(saved_meta["state"])
        wanted_shapes = _shapes(abstract_state)
        mismatch = [
            (key, saved_shapes.get(key), shape)
            for key, shape in wanted_shapes.items()
            if saved_shapes.get(key) != shape
        ] + [(key, shape, None) for key, shape in saved_shapes.items() if key not in wanted_shapes]
        mismatch.sort(key=lambda item: not item[0].startswith("params/"))  # parameters first
        if mismatch and surgery is None:
            key, saved, wanted = mismatch[0]
            raise CheckpointMismatchError(
                f"checkpoint {step_dir} does not match the model: at {key} the checkpoint has "
                f"{'no such entry' if saved is None else f'shape {saved}'} and the model expects "
                f"{'no such entry' if wanted is None else f'shape {wanted}'} "
                f"({len(mismatch)} mismatching entries). Restore with the configuration the "
                "checkpoint was trained with, or define surgery(saved, target) on the trainer."
            )
        if mismatch:
            assert surgery is not None
            raw = manager.restore(
                step,
                args=ocp.args.Composite(
                    state=ocp.args.StandardRestore(), meta=ocp.args.JsonRestore()
                ),
            )
            host = jax.tree_util.tree_map(np.asarray, raw["state"])
            fixed = surgery(host, abstract_state)
            state = jax.tree_util.tree_map(
                lambda value, target: jax.device_put(
                    np.asarray(value, target.dtype), target.sharding
                ),
                fixed,
                abstract_state,
            )
            return state, dict(raw["meta"])
        restored = manager.restore(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardRestore(abstract_state), meta=ocp.args.JsonRestore()
            ),
        )
        return restored["state"], dict(restored["meta"])
