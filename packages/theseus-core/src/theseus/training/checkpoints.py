"""Checkpoints: asynchronous orbax saves, registered in the store as soon as committed.

A lineage's checkpoints live in `ROOT/checkpoints/<project>/<group>/<run>/<nonce>/<step>/`
with two items: `state` (parameters, optimizer state and step) and `meta` (JSON: data
cursor, seed, the saved configuration, the tokens it trained on: each dataset's sha256
and settings). Saving returns at once. Orbax writes a step into a temporary folder and
renames it when complete; the keeper registers each step
on its node once its folder carries the final name (checked at every `poll()`, at the
next `save()` and at `wait()`), so the store never lists a checkpoint that is still
being written, and never lags more than one step behind the disk.

Even orbax's asynchronous save holds its caller for tens of milliseconds (it gathers the
arrays' slices, copies them to host memory, starts its write threads). In a
single-process run the keeper takes all of that off the training loop: `save()` only
starts a copy of the state's arrays into fresh device buffers (asynchronous, so the
loop does not wait for it; the train step donates its state, and these copies are the
keeper's own, which no step can donate or overwrite) and hands them to the keeper's
thread, which calls orbax's save. The cost is a second copy of the state in device
memory from the save until orbax has written it, for one save at a time; a device that
reports its memory (GPUs, TPUs) and has no room for that copy's share (with a quarter
to spare) saves on the caller's thread instead, as orbax alone would. With several
processes orbax's save synchronizes them with collectives, which must not run beside the
training step's, so there the save stays on the caller's thread as before.

While it writes, the keeper holds the folder's writer lock (`theseus.store.FolderLock`):
a second process that tries to continue the same lineage gets `FolderBusyError`, and
`theseus-store fsck --repair` leaves the folder alone. When it opens the folder, it sets
aside (moves to `unregistered/`, never deletes) what a crash left there: step folders
orbax committed but the store never registered, and temporary folders of saves that
never finished, so a resumed run can write those steps anew. Before that, the store
decides whether the folder is this root's at all (`Store.folders`, which leaves a claim
there): a lineage folder that another root holds, through a `checkpoints/` both reach,
is refused with nothing in it changed.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from theseus.errors import TheseusError
from theseus.job import from_host_zero, store_root, sync_hosts
from theseus.store import (
    COMMIT_MARKER,
    FolderBusyError,
    FolderLock,
    Node,
    RootFolders,
    Store,
    canonical_path,
    open_lineage_folder,
)
from theseus.training._errors import TrainerError
from theseus.training.sharding import state_bytes

__all__ = [
    "CheckpointKeeper",
    "CheckpointMismatchError",
    "CheckpointMissingError",
    "checkpoint_dir",
    "restore",
    "room_for_copy",
    "set_aside_strays",
]

logger = logging.getLogger(__name__)


class CheckpointMissingError(TheseusError, FileNotFoundError):
    """A registered checkpoint's folder is gone or was never committed."""


#: The earlier name of TrainerError (a checkpoint's parameter shapes differ from the model
#: being restored into), kept for old imports: no caller told the two apart.
CheckpointMismatchError = TrainerError


def checkpoint_dir(root: str | os.PathLike[str], node: Node) -> Path:
    """The folder that holds every checkpoint of `node`'s lineage, as the root's owner of
    folders (`theseus.store.RootFolders`) places it: canonical, so any spelling of `root`
    (or of a symlinked `checkpoints/`) gives the same folder."""
    project, group, run = node.name.split(".", 2)
    folders = RootFolders(canonical_path(store_root(root)))
    folder = folders.lineage_folder((project, group, run, node.nonce))
    assert folder is not None, "a Theseus root's store folder is named store"
    return folder


class CheckpointKeeper:
    """Saves a lineage's checkpoints and registers each as soon as orbax has committed it.

    Args:
        directory: the lineage's checkpoint folder (`checkpoint_dir(root, node)`).
        store: where finished checkpoints are registered (None on hosts other than zero,
            which neither lock the folder nor register).
        check: run on host zero once the lock is held, before anything in the folder
            changes (the trainer refuses there to train over later checkpoints); what it
            raises releases the lock and is raised on every host.
        background: start orbax's save on the keeper's thread (from a device copy of the
            state) instead of the caller's; default: when this is the only process.

    Raises:
        FolderBusyError: another live process writes checkpoints in `directory`.
    """

    def __init__(
        self,
        directory: Path,
        store: Store | None,
        *,
        check: Callable[[], None] | None = None,
        background: bool | None = None,
    ) -> None:
        self.directory = directory
        self.store = store
        self._lock: FolderLock | None = None
        self._background = jax.process_count() == 1 if background is None else background
        self._thread: ThreadPoolExecutor | None = None  # started at the first save
        # The save handed to the keeper's thread and not yet collected: its orbax call
        # (which returns once the host copy is taken and the write threads run).
        self._starting: tuple[Future[None], tuple[int, Node, dict[str, Any]]] | None = None
        # Host zero takes the lock; what it raises (busy, refused) every host raises.
        from_host_zero(lambda: self._take(check) if store is not None else None)
        try:
            sync_hosts(f"theseus/checkpoints/open/{directory.name}")
            options = ocp.CheckpointManagerOptions(enable_async_checkpointing=True, create=True)
            self.manager = ocp.CheckpointManager(directory, options=options)
        except BaseException:
            self._release()
            raise
        self._pending: list[tuple[int, Node, dict[str, Any]]] = []

    def _take(self, check: Callable[[], None] | None) -> None:
        """Lock the folder, run `check` under the lock, set aside strays (host zero).

        Anything that fails here releases the lock again.
        """
        assert self.store is not None, "only host zero, which holds the store, locks"
        # another root's folder (a shared checkpoints/) is refused before its lock file
        # is opened: nothing of it is written, not even the lock's holder
        self.store.folders.refuse_foreign(self.directory)
        lock = FolderLock(self.directory)
        if not lock.acquire():
            holder = lock.holder()
            who = (
                "An earlier run in this process, not yet finished or closed,"
                if holder.startswith(f"pid {os.getpid()} ")
                else f"Another process ({holder})"
            )
            raise FolderBusyError(
                f"{who} is writing checkpoints in {self.directory}. Two runs cannot continue "
                "one lineage at once: wait for that run to end, or branch() from the node "
                "to train a new lineage."
            )
        self._lock = lock
        try:
            if check is not None:
                check()
            moved = set_aside_strays(self.directory, self.store)
        except BaseException:
            self._release()
            raise
        if moved:
            logger.warning(
                "Set aside %d checkpoint folder(s) that a crash left unregistered in %s: %s",
                len(moved),
                self.directory,
                ", ".join(str(p.relative_to(self.directory)) for p in moved),
            )

    def _release(self) -> None:
        lock, self._lock = self._lock, None
        if lock is not None:
            lock.release()

    def save(
        self, step: int, node: Node, state: Any, meta: dict[str, Any], *, copy: bool = True
    ) -> None:
        """Start saving `state` as `step`; it is registered on `node` once committed.

        The previous save is finished (committed and registered) before this one starts,
        as orbax does, so every earlier step is registered by the time this returns. In
        the background (see the module's notes) this returns once the state's device copy
        is dispatched: a train step that donates `state` right after waits for the copy.
        `copy=False` (an import, which changes `state` no more) starts orbax's save on the
        caller's thread from `state` itself, without that copy.
        """
        if not (copy and self._background and room_for_copy(state)):
            self._collect(block=True)  # a save started on the thread comes first
            self._orbax_save(step, state, meta)
            self._register(committed_only=True)
            self._pending.append((step, node, meta))
            return
        self._collect(block=True)  # raises what the previous save raised on the thread
        self.manager.wait_until_finished()  # the keeper's thread is idle: no orbax call runs
        self.manager.check_for_errors()
        self._register(committed_only=True)
        copy = _device_copy(state)
        if self._thread is None:
            self._thread = ThreadPoolExecutor(1, thread_name_prefix="theseus-checkpoint")
        future = self._thread.submit(self._orbax_save, step, copy, dict(meta))
        self._starting = (future, (step, node, meta))

    def _orbax_save(self, step: int, state: Any, meta: dict[str, Any]) -> None:
        held = {**meta, HELD: {key: list(shape) for key, shape in _shapes(state).items()}}
        self.manager.save(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(held)
            ),
            force=True,
        )

    def _collect(self, block: bool) -> None:
        """Take the save started on the keeper's thread into `_pending` once orbax's call
        returned (`block`: wait for it); raise what that call raised (nothing is pending)."""
        if self._starting is None:
            return
        future, entry = self._starting
        if not block and not future.done():
            return
        self._starting = None
        future.result()
        self._pending.append(entry)

    def poll(self) -> None:
        """Register the saves whose folders orbax has committed (cheap; call it every step)."""
        self._collect(block=False)
        if self._pending:
            self._register(committed_only=True)

    def wait(self) -> None:
        """Block until every save is committed, then register them."""
        self._collect(block=True)
        self.manager.wait_until_finished()
        self.manager.check_for_errors()
        self._register(committed_only=False)

    def _register(self, committed_only: bool) -> None:
        """Register the pending saves (only those under their final name if `committed_only`).

        Each entry leaves `_pending` as soon as it is registered, so when one registration
        fails, the next call (at `close()`) does not register the earlier ones again.
        """
        for entry in list(self._pending):
            step, node, meta = entry
            folder = self.directory / str(step)
            if committed_only and not folder.is_dir():  # still under its temporary name
                continue
            if self.store is not None:
                self.store.checkpoint(node, folder, meta=meta, step=step)
            self._pending.remove(entry)

    def close(self) -> None:
        """Wait for pending saves, register them, release orbax's threads and the lock."""
        try:
            self.wait()
            self.manager.close()
        finally:
            thread, self._thread = self._thread, None
            try:
                if thread is not None:
                    thread.shutdown(wait=True)
            finally:
                self._release()


def _memory_stats(device: jax.Device) -> dict[str, Any] | None:
    return device.memory_stats()


def room_for_copy(tree: Any, spare: float = 0.25) -> bool:
    """Whether each local device holding `tree` has room for a second copy of its share.

    A device's room is `bytes_limit - bytes_in_use` from its `memory_stats()`; a device
    that reports none (the CPU) always has room (host memory). The copy needs the most
    any one device keeps of `tree` (`state_bytes(tree).device`), plus `spare` of it.
    """
    arrays = [leaf for leaf in jax.tree.leaves(tree) if isinstance(leaf, jax.Array)]
    need = state_bytes(arrays).device * (1 + spare)
    devices = {d for a in arrays for d in a.sharding.addressable_devices}
    for device in devices:
        stats = _memory_stats(device)
        if not stats or "bytes_limit" not in stats:
            continue
        if stats["bytes_limit"] - stats.get("bytes_in_use", 0) < need:
            return False
    return True


def _device_copy(tree: Any) -> Any:
    """`tree` with its arrays copied into fresh buffers of the same shardings.

    The copy is dispatched, not waited for: JAX orders a later computation that donates
    (and so overwrites) a source buffer after the copy's read of it. NumPy leaves are
    copied on the host; other leaves are kept.
    """
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    where = [i for i, leaf in enumerate(leaves) if isinstance(leaf, jax.Array)]
    arrays = [leaves[i] for i in where]
    copies = jax.device_put(arrays, [a.sharding for a in arrays], may_alias=False)
    for i, copied in zip(where, copies, strict=True):
        leaves[i] = copied
    leaves = [np.array(leaf) if isinstance(leaf, np.ndarray) else leaf for leaf in leaves]
    return jax.tree_util.tree_unflatten(treedef, leaves)


def set_aside_strays(directory: Path, store: Store) -> list[Path]:
    """Take a lineage's checkpoint folder for this root and move what a crash left there
    into `directory/unregistered/`.

    A process killed after orbax committed a step but before the store registered it
    leaves a complete step folder no row names; one killed mid-save leaves orbax's
    temporary folder. The run resumes from the last registered checkpoint and saves
    those steps again, which orbax refuses while the old folders are there. They are
    moved aside (never deleted): `unregistered/<name>` (or `<name>-<n>`). The store
    decides whether the folder is this root's (`theseus.store.open_lineage_folder`):
    one that another root holds (a shared `checkpoints/`) is refused, untouched.

    Returns:
        The new paths of the folders moved.

    Raises:
        StorePermissionError: another root holds the folder.
    """
    return open_lineage_folder(store, directory)


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


#: The `meta` item's record of every array's shape (`{"params/wte/embedding": [v, d],
#: ...}`, `_shapes`): `restore` compares the target with it before reading any array,
#: instead of opening every array's metadata first (a third of a small model's restore),
#: and then reads the `state` item alone. Taken out of the meta `restore` returns; a
#: checkpoint of an earlier version, without it, is compared through orbax's metadata.
HELD = "theseus/shapes"


def _meta(step_dir: Path) -> dict[str, Any]:
    """The `meta` item of a step folder: the JSON file orbax's `JsonCheckpointHandler`
    writes (`meta/metadata`), read directly (through the handler where it is not there)."""
    try:
        return dict(json.loads((step_dir / "meta" / "metadata").read_text()))
    except (OSError, ValueError):
        with ocp.Checkpointer(ocp.JsonCheckpointHandler()) as reader:
            return dict(reader.restore(step_dir / "meta", args=ocp.args.JsonRestore()))


def _reader() -> ocp.Checkpointer:
    """Reads one step folder as the manager wrote it (items `state` and `meta`): here the
    metadata of a checkpoint that records no shapes.

    Restoring goes straight to the step folder (its items): a `CheckpointManager` would
    first list and read every step of the lineage, which made each restore of a long
    lineage slower (about half of a small model's restore time at 20 steps).
    """
    handler = ocp.CompositeCheckpointHandler(
        state=ocp.StandardCheckpointHandler(), meta=ocp.JsonCheckpointHandler()
    )
    return ocp.Checkpointer(handler)


def restore(
    path: str | os.PathLike[str],
    abstract_state: Any,
    surgery: Callable[[Any, Any], Any] | None = None,
    optional: tuple[str, ...] = (),
) -> tuple[Any, dict[str, Any]]:
    """Restore a checkpoint directory into the shapes and shardings of `abstract_state`.

    Args:
        path: a checkpoint step directory (`.../<nonce>/<step>`).
        abstract_state: a dict pytree of `jax.ShapeDtypeStruct` with shardings (the target).
        surgery: when shapes differ, `surgery(saved, abstract_state)` receives the saved
            state as host arrays and returns a state matching `abstract_state`.
        optional: top-level keys of `abstract_state` a checkpoint may lack (an import
            saves no optimizer state); the returned state lacks them too.

    Returns:
        `(state, meta)`.

    Raises:
        CheckpointMissingError: the folder is gone, or is not a committed orbax step.
        TrainerError: shapes differ and there is no surgery; the message names
            the first mismatching parameter path and both shapes.
    """
    step_dir = Path(path)
    if not (step_dir / COMMIT_MARKER).is_file():
        state = "is missing" if not step_dir.exists() else "has no commit marker (never finished)"
        raise CheckpointMissingError(
            f"The checkpoint folder {step_dir} {state}. Put it back or restore it from a "
            "backup (`theseus-store fsck ROOT/store` lists every such checkpoint), or "
            "resume or branch from an earlier checkpoint of the lineage."
        )
    meta = _meta(step_dir)
    recorded = meta.pop(HELD, None)
    if isinstance(recorded, dict):
        saved_shapes = {key: tuple(shape) for key, shape in recorded.items()}
    else:  # written before the shapes were recorded
        with _reader() as reader:
            saved_shapes = _shapes(reader.metadata(step_dir).item_metadata["state"])
    absent = [
        key
        for key in optional
        if not any(saved == key or saved.startswith(f"{key}/") for saved in saved_shapes)
    ]
    abstract_state = {k: v for k, v in abstract_state.items() if k not in absent}
    wanted_shapes = _shapes(abstract_state)
    mismatch = [
        (key, saved_shapes.get(key), shape)
        for key, shape in wanted_shapes.items()
        if saved_shapes.get(key) != shape
    ] + [(key, shape, None) for key, shape in saved_shapes.items() if key not in wanted_shapes]
    mismatch.sort(key=lambda item: not item[0].startswith("params/"))  # parameters first
    if mismatch and surgery is None:
        key, saved, wanted = mismatch[0]
        raise TrainerError(
            f"checkpoint {step_dir} does not match the model: at {key} the checkpoint has "
            f"{'no such entry' if saved is None else f'shape {saved}'} and the model expects "
            f"{'no such entry' if wanted is None else f'shape {wanted}'} "
            f"({len(mismatch)} mismatching entries). Restore with the configuration the "
            "checkpoint was trained with, or define surgery(saved, target) on the trainer."
        )
    if mismatch:
        assert surgery is not None
        with ocp.Checkpointer(ocp.StandardCheckpointHandler()) as reader:
            raw = reader.restore(step_dir / "state", args=ocp.args.StandardRestore())
        host = jax.tree_util.tree_map(np.asarray, raw)
        fixed = surgery(host, abstract_state)
        state = jax.tree_util.tree_map(
            lambda value, target: jax.device_put(np.asarray(value, target.dtype), target.sharding),
            fixed,
            abstract_state,
        )
        return state, meta
    if jax.process_count() > 1:  # each process reads the shards its devices hold
        with ocp.Checkpointer(ocp.StandardCheckpointHandler()) as reader:
            state = reader.restore(
                step_dir / "state", args=ocp.args.StandardRestore(abstract_state)
            )
        return dict(state), meta
    # One process reads every array whole anyway: into host memory, then the tree placed
    # in one call (orbax placing array by array was half of a small state's restore).
    as_host = jax.tree_util.tree_map(
        lambda leaf: ocp.RestoreArgs(restore_type=np.ndarray, dtype=leaf.dtype), abstract_state
    )
    with ocp.Checkpointer(ocp.PyTreeCheckpointHandler()) as reader:
        host = reader.restore(
            step_dir / "state", args=ocp.args.PyTreeRestore(abstract_state, restore_args=as_host)
        )
    shardings = jax.tree_util.tree_map(lambda leaf: leaf.sharding, abstract_state)
    return dict(jax.device_put(host, shardings)), meta
