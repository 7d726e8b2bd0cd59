"""The keeper starts orbax's save on its own thread from a device copy of the state.

References: host copies of the state taken (with `np.array`) before the save, and the
folder orbax renames when it commits; the train steps after a save donate the state.
"""

from __future__ import annotations

import inspect
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from theseus.data.datasets import Synthetic
from theseus.job import store_root
from theseus.quick import quick
from theseus.registry import import_module_or_file
from theseus.store import COMMIT_MARKER, Node, Store
from theseus.training import checkpoints
from theseus.training import state as train_state
from theseus.training.checkpoints import CheckpointKeeper, restore, room_for_copy

jobs = import_module_or_file(str(Path(__file__).with_name("trainer_jobs.py")))


def _state(seed: int) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    return {
        "step": jnp.int32(seed),
        "params": {"w": jnp.asarray(rng.normal(size=(256, 512)), jnp.float32)},
        "opt_state": [jnp.asarray(rng.normal(size=(512,)), jnp.float32), jnp.zeros((3,))],
    }


def _host(tree: Any) -> list[np.ndarray]:
    return [np.array(leaf, copy=True) for leaf in jax.tree.leaves(tree)]


def _abstract(tree: Any) -> Any:
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), tree)


def _same(saved: Any, reference: list[np.ndarray]) -> None:
    leaves = jax.tree.leaves(saved)
    assert len(leaves) == len(reference)
    for got, want in zip(leaves, reference, strict=True):
        np.testing.assert_array_equal(np.asarray(got), want)


_gates: list[threading.Event] = []


def _node(store: Store) -> Node:
    node = Node.new("r")
    store.touch(node)
    return node


@pytest.fixture
def keeper(tmp_path: Path) -> Iterator[tuple[CheckpointKeeper, Store]]:
    with Store(tmp_path / "store") as store:
        keeper = CheckpointKeeper(
            tmp_path / "checkpoints" / "general" / "default" / "r" / "lineage", store
        )
        try:
            yield keeper, store
        finally:
            for gate in _gates:  # a failed test must not leave orbax waiting on a gate
                gate.set()
            _gates.clear()
            keeper.close()


def _hold_orbax(keeper: CheckpointKeeper) -> threading.Event:
    """Hold orbax's save (on the keeper's thread) until the returned event is set."""
    release = threading.Event()
    _gates.append(release)
    real_save = keeper.manager.save

    def held(*args: Any, **kwargs: Any) -> Any:
        assert release.wait(60), "the test never released orbax's save"
        return real_save(*args, **kwargs)

    keeper.manager.save = held  # type: ignore[method-assign]
    return release


def test_a_save_holds_the_arrays_of_its_step_although_the_next_steps_donate_them(
    keeper: tuple[CheckpointKeeper, Store],
) -> None:
    keeper_, store = keeper
    assert keeper_._background  # one process: orbax's save runs on the keeper's thread
    release = _hold_orbax(keeper_)  # orbax reads the arrays only after the steps below
    node = _node(store)
    bump = jax.jit(lambda s: jax.tree.map(lambda x: x * 3 + 1, s), donate_argnums=0)
    state = _state(5)
    abstract = _abstract(state)
    reference = _host(state)
    pointers = [leaf.unsafe_buffer_pointer() for leaf in jax.tree.leaves(state)]
    keeper_.save(5, node, state, {"step": 5})
    first = state
    for _ in range(2):  # overwrite the saved buffers at once, before orbax reads anything
        state = bump(state)
    jax.block_until_ready(state)
    assert all(leaf.is_deleted() for leaf in jax.tree.leaves(first))  # really donated
    reused = [leaf.unsafe_buffer_pointer() for leaf in jax.tree.leaves(state)]
    assert set(pointers) & set(reused)  # and its buffers hold the later steps' values
    release.set()
    keeper_.wait()
    saved, meta = restore(keeper_.directory / "5", abstract)
    _same(saved, reference)
    assert meta == {"step": 5}
    assert [c.step for c in store.checkpoints(node)] == [5]


def _gate_finalize(monkeypatch: pytest.MonkeyPatch, gate: threading.Event) -> None:
    """Hold orbax's commit (the rename of the temporary step folder) until `gate` is set."""
    atomicity = pytest.importorskip("orbax.checkpoint._src.path.atomicity")
    cls = getattr(atomicity, "AtomicRenameTemporaryPath", None)
    if cls is None:
        pytest.skip("this orbax has no AtomicRenameTemporaryPath to hold")
    original = cls.finalize
    if inspect.iscoroutinefunction(original):

        async def held(self: Any, *args: Any, **kwargs: Any) -> Any:
            assert gate.wait(60), "the test never opened the gate"
            return await original(self, *args, **kwargs)

    else:

        def held(self: Any, *args: Any, **kwargs: Any) -> Any:  # type: ignore[misc]
            assert gate.wait(60), "the test never opened the gate"
            return original(self, *args, **kwargs)

    monkeypatch.setattr(cls, "finalize", held)


def test_a_save_is_registered_only_once_orbax_has_committed_it(
    keeper: tuple[CheckpointKeeper, Store], monkeypatch: pytest.MonkeyPatch
) -> None:
    keeper_, store = keeper
    gate = threading.Event()
    _gates.append(gate)
    _gate_finalize(monkeypatch, gate)
    node = _node(store)
    keeper_.save(1, node, _state(1), {"step": 1})
    deadline = time.monotonic() + 30
    while keeper_._starting is not None and time.monotonic() < deadline:
        time.sleep(0.01)
        keeper_.poll()  # collects orbax's call once it returned; the commit is held
    assert keeper_._starting is None and keeper_._pending, "orbax's call never returned"
    for _ in range(5):
        keeper_.poll()
        assert store.checkpoints(node) == []
        assert not (keeper_.directory / "1").exists()
        time.sleep(0.02)
    assert any(p.name.startswith("1.") for p in keeper_.directory.iterdir())  # temporary
    gate.set()
    keeper_.wait()
    assert [c.step for c in store.checkpoints(node)] == [1]
    assert (keeper_.directory / "1" / COMMIT_MARKER).is_file()


def test_the_loop_is_free_while_orbax_starts_the_save(
    keeper: tuple[CheckpointKeeper, Store],
) -> None:
    keeper_, store = keeper
    entered, release = threading.Event(), threading.Event()
    _gates.append(release)
    real_save = keeper_.manager.save

    def slow_save(*args: Any, **kwargs: Any) -> Any:
        entered.set()
        assert release.wait(60)
        return real_save(*args, **kwargs)

    keeper_.manager.save = slow_save  # type: ignore[method-assign]
    node = _node(store)
    state = _state(2)
    reference = _host(state)
    keeper_.save(2, node, state, {"step": 2})  # returns although orbax's call is held
    assert entered.wait(30)
    keeper_.poll()
    assert store.checkpoints(node) == [] and keeper_._starting is not None
    release.set()
    keeper_.wait()
    assert [c.step for c in store.checkpoints(node)] == [2]
    _same(restore(keeper_.directory / "2", _abstract(state))[0], reference)


def test_an_error_of_orbax_on_the_thread_is_raised_and_registers_nothing(
    keeper: tuple[CheckpointKeeper, Store],
) -> None:
    keeper_, store = keeper

    def broken(*args: Any, **kwargs: Any) -> None:
        raise OSError("disk full")

    keeper_.manager.save = broken  # type: ignore[method-assign]
    node = _node(store)
    keeper_.save(3, node, _state(3), {"step": 3})
    with pytest.raises(OSError, match="disk full"):
        keeper_.wait()
    keeper_.wait()  # raised once; nothing is left pending
    assert store.checkpoints(node) == []
    assert not (keeper_.directory / "3").exists()


def test_on_the_callers_thread_the_keeper_saves_and_registers_as_before(tmp_path: Path) -> None:
    with Store(tmp_path / "store") as store:
        keeper = CheckpointKeeper(
            tmp_path / "checkpoints" / "general" / "default" / "r" / "lineage",
            store,
            background=False,
        )
        node = Node.new("r")
        try:
            for step in (1, 2):
                state = _state(step)
                keeper.save(step, node, state, {"step": step})
                assert keeper._thread is None
            keeper.wait()
            assert [c.step for c in store.checkpoints(node)] == [1, 2]
            _same(restore(keeper.directory / "2", _abstract(state))[0], _host(state))
        finally:
            keeper.close()


def _reporting(free: int) -> Any:
    """`memory_stats` of a device with `free` bytes left of a 16 GB limit."""
    return lambda device: {"bytes_limit": 16 * 10**9, "bytes_in_use": 16 * 10**9 - free}


def test_room_for_a_copy_is_the_largest_share_of_one_device_and_a_quarter(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    state = _state(1)
    share = sum(leaf.nbytes for leaf in jax.tree.leaves(state))  # one device keeps it all
    assert room_for_copy(state)  # the CPU reports no limit: host memory
    monkeypatch.setattr(checkpoints, "_memory_stats", _reporting(int(share * 1.25) + 1))
    assert room_for_copy(state)
    monkeypatch.setattr(checkpoints, "_memory_stats", _reporting(int(share * 1.25) - 1))
    assert not room_for_copy(state)
    monkeypatch.setattr(checkpoints, "_memory_stats", lambda device: {})
    assert room_for_copy(state)  # a device that says nothing of its limit


def test_a_device_without_room_for_the_copy_saves_on_the_callers_thread(
    keeper: tuple[CheckpointKeeper, Store], monkeypatch: pytest.MonkeyPatch
) -> None:
    keeper_, store = keeper
    node = _node(store)
    keeper_.save(1, node, _state(1), {"step": 1})  # room (CPU): on the keeper's thread
    assert keeper_._starting is not None
    monkeypatch.setattr(checkpoints, "_memory_stats", _reporting(1000))
    calls: list[str] = []
    real = keeper_._orbax_save

    def traced(*args: Any, **kwargs: Any) -> None:
        calls.append(threading.current_thread().name)
        real(*args, **kwargs)

    keeper_._orbax_save = traced  # type: ignore[method-assign]
    state = _state(2)
    keeper_.save(2, node, state, {"step": 2})
    assert calls == [threading.current_thread().name]  # no copy: orbax on the caller's
    assert keeper_._starting is None
    keeper_.wait()
    assert [c.step for c in store.checkpoints(node)] == [1, 2]
    _same(restore(keeper_.directory / "2", _abstract(state))[0], _host(state))


class Recorded(jobs.SyntheticTrainer):
    """Keeps a host copy of what each save is given, and the arrays themselves."""

    def save_checkpoint(self):  # type: ignore[no-untyped-def]
        arrays = train_state.checkpoint_arrays(self.state)
        self.given.append((int(self.state.step), _host(arrays), jax.tree.leaves(arrays)))
        return super().save_checkpoint()


@pytest.mark.slow  # a trainer's compilation: about 8 s on the loaded 2-core machine
def test_a_trainers_checkpoints_are_the_states_it_saved_although_it_trained_on(
    tmp_path: Path,
) -> None:
    Synthetic.prepare(tmp_path, tokens=40_000, val_tokens=6_000)
    with quick(tmp_path) as q:
        q.build(Recorded, "donated")
        jobs.tiny(q.config, steps=5, **{"logging/checkpoint_interval": 2})
        trainer = q.create()
        trainer.given = []
        trainer()
    assert [step for step, _, _ in trainer.given] == [2, 4, 5]
    for step, _, arrays in trainer.given[:-1]:  # the next step donated these buffers
        assert all(a.is_deleted() for a in arrays if isinstance(a, jax.Array)), step
    abstract = train_state.checkpoint_arrays(trainer.layout.abstract)
    with Store(store_root(tmp_path)) as store:
        saved = store.query().nonce(trainer.node.nonce).checkpoints()
        assert [c.step for c in saved] == [2, 4, 5]
        for checkpoint, (_, reference, _) in zip(saved, trainer.given, strict=True):
            arrays, meta = restore(checkpoint.path, abstract)
            _same(arrays, reference)
            assert meta["step"] == checkpoint.step
