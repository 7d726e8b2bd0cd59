"""Checkpoints are registered as soon as they are committed, and no resume overwrites one."""

from __future__ import annotations

import shutil
from pathlib import Path

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from theseus.data.datasets import Synthetic
from theseus.job import store_root
from theseus.quick import quick
from theseus.registry import import_module_or_file
from theseus.store import CheckpointNotFoundError, FolderBusyError, FolderLock, Node, Store
from theseus.training.base import TrainerError
from theseus.training.checkpoints import (
    CheckpointKeeper,
    CheckpointMissingError,
    checkpoint_dir,
    restore,
)

jobs = import_module_or_file(str(Path(__file__).with_name("trainer_jobs.py")))


class Watched(jobs.SyntheticTrainer):
    """Records, at every tick, which checkpoint steps the store lists."""

    def tick(self):  # type: ignore[no-untyped-def]
        listed = sorted(c.step for c in self.store.query().nonce(self.node.nonce).checkpoints())
        self.seen.append((int(self.state.step), listed))
        return super().tick()


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("safety")
    Synthetic.prepare(path, tokens=40_000, val_tokens=6_000)
    return path


def _params(state: object) -> list[np.ndarray]:
    return [np.asarray(leaf) for leaf in jax.tree.leaves(state)]


def test_back_to_back_saves_are_registered_while_the_next_one_runs(root: Path) -> None:
    with quick(root) as q:
        q.build(Watched, "every-step")
        jobs.tiny(q.config, steps=6, **{"logging/checkpoint_interval": 1})
        trainer = q.create()
        trainer.seen = []
        trainer()
    # A tick comes after step n asked for its save; orbax finished n - 1 before starting n,
    # so n - 1 (and everything before it) must already be listed. Before the fix nothing
    # was registered until the run ended.
    assert [step for step, _ in trainer.seen] == [1, 2, 3, 4, 5]
    for step, listed in trainer.seen:
        assert listed[: step - 1] == list(range(1, step)), (step, listed)
    with Store(store_root(root)) as store:
        saved = store.query().nonce(trainer.node.nonce).checkpoints()
        assert [c.step for c in saved] == [1, 2, 3, 4, 5, 6]


def test_a_second_writer_of_one_lineage_is_refused(root: Path, tmp_path: Path) -> None:
    with Store(tmp_path / "store") as store:
        first = CheckpointKeeper(
            tmp_path / "checkpoints" / "general" / "default" / "r" / "lineage", store
        )
        try:
            with pytest.raises(
                FolderBusyError, match=r"An earlier run in this process.*branch\(\)"
            ):
                CheckpointKeeper(
                    tmp_path / "checkpoints" / "general" / "default" / "r" / "lineage", store
                )
        finally:
            first.close()
        CheckpointKeeper(
            tmp_path / "checkpoints" / "general" / "default" / "r" / "lineage", store
        ).close()  # free again once closed


class Probing(jobs.SyntheticTrainer):
    """Records, when it checks for later checkpoints, whether its lineage lock is held."""

    def _refuse_training_over_later_checkpoints(self) -> None:
        probe = FolderLock(checkpoint_dir(self.spec.root, self.node))
        free = probe.acquire()
        if free:
            probe.release()
        self.lock_free_during_check = free
        super()._refuse_training_over_later_checkpoints()


def test_the_check_for_later_checkpoints_runs_under_the_lineage_lock(root: Path) -> None:
    original = jobs.train_tiny(root, jobs.SyntheticTrainer, "probed", 8)
    directory = checkpoint_dir(root, original.node)
    with quick(root) as q:
        q.build(Probing, "probed")
        q.find().spec(run="probed").nonce(original.node.nonce).seq(3).resume()
        resumed = q.create()
        with pytest.raises(TrainerError, match=r"1 later checkpoint\(s\)"):
            resumed()
    # No other process could register a checkpoint between the check and the first save.
    assert resumed.lock_free_during_check is False
    again = FolderLock(directory)  # the refusal released it
    assert again.acquire()
    again.release()


def test_a_keeper_that_fails_to_open_releases_the_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse() -> None:
        raise TrainerError("refused under the lock")

    def broken_manager(*args: object, **kwargs: object) -> None:
        raise OSError("orbax cannot open the folder")

    with Store(tmp_path / "store") as store:
        with pytest.raises(TrainerError, match="refused under the lock"):
            CheckpointKeeper(
                tmp_path / "checkpoints" / "general" / "default" / "r" / "lineage",
                store,
                check=refuse,
            )
        monkeypatch.setattr(ocp, "CheckpointManager", broken_manager)
        with pytest.raises(OSError, match="orbax cannot open"):
            CheckpointKeeper(
                tmp_path / "checkpoints" / "general" / "default" / "r" / "lineage", store
            )
        monkeypatch.undo()
        CheckpointKeeper(
            tmp_path / "checkpoints" / "general" / "default" / "r" / "lineage", store
        ).close()  # free after each failure


def test_resuming_before_a_later_checkpoint_refuses_and_branching_reproduces_it(
    root: Path,
) -> None:
    original = jobs.train_tiny(root, jobs.SyntheticTrainer, "history", 8)
    directory = checkpoint_dir(root, original.node)
    with Store(store_root(root)) as store:
        before = [(c.node, c.path) for c in store.query().nonce(original.node.nonce).checkpoints()]
    assert [n.seq for n, _ in before] == [3, 7]

    with quick(root) as q:
        q.build(jobs.SyntheticTrainer, "history")
        q.find().spec(run="history").nonce(original.node.nonce).seq(3).resume()
        resumed = q.create()  # setting up at a past node is fine (analysis, debug)
        assert int(resumed.state.step) == 4
        with pytest.raises(TrainerError, match=r"1 later checkpoint\(s\).*step 8.*--branch"):
            resumed()
    with Store(store_root(root)) as store:
        after = [(c.node, c.path) for c in store.query().nonce(original.node.nonce).checkpoints()]
        untouched = store.values(Node(original.node.name, original.node.nonce, 3))
    assert after == before and (directory / "8").is_dir()
    assert "job/status" not in untouched  # the refusal recorded nothing on the old node
    state, _ = restore(directory / "8", jax.tree.map(_abstract, _saved(original)))
    for a, b in zip(_params(state["params"]), _params(original.state.params), strict=True):
        np.testing.assert_array_equal(a, b)

    # The way the message points: a new lineage from the same node trains to the same place.
    with quick(root) as q:
        q.build(jobs.SyntheticTrainer, "history")
        q.find().spec(run="history").nonce(original.node.nonce).seq(3).branch()
        branched = q.create()
        branched()
    assert branched.node.nonce != original.node.nonce and int(branched.state.step) == 8
    for a, b in zip(_params(branched.state.params), _params(original.state.params), strict=True):
        np.testing.assert_array_equal(a, b)


def _saved(trainer: object) -> dict[str, object]:
    state = trainer.state  # type: ignore[attr-defined]
    return {"step": state.step, "params": state.params, "opt_state": state.opt_state}


def _abstract(leaf: jax.Array) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=leaf.sharding)


def test_resuming_a_node_without_a_checkpoint_names_the_closest_one(root: Path) -> None:
    trainer = jobs.train_tiny(root, jobs.SyntheticTrainer, "sparse", 6)
    nonce = trainer.node.nonce
    with quick(root) as q:
        q.build(jobs.SyntheticTrainer, "sparse")
        q.find().spec(run="sparse").nonce(nonce).seq(4).resume()
        with pytest.raises(TrainerError) as caught:
            q.create()
    message = str(caught.value)
    assert f"closest checkpoint of its lineage is at general.default.sparse~{nonce}~3" in message
    assert f"--resume general.default.sparse~{nonce}~3" in message
    assert f"q.find().nonce({nonce!r}).seq(3).resume()" in message


def test_resuming_a_checkpoint_whose_folder_is_gone_says_so_in_one_line(root: Path) -> None:
    trainer = jobs.train_tiny(root, jobs.SyntheticTrainer, "vanished", 4)
    folder = checkpoint_dir(root, trainer.node) / "4"
    shutil.rmtree(folder)
    with quick(root) as q:
        q.build(jobs.SyntheticTrainer, "vanished")
        q.find().nonce(trainer.node.nonce).checkpoint().latest().resume()
        with pytest.raises(CheckpointMissingError) as caught:
            q.create()
    message = str(caught.value)
    assert message.startswith(f"The checkpoint folder {folder} is missing.") and "\n" not in message
    assert "theseus-store fsck ROOT/store" in message


def test_an_interrupted_save_is_set_aside_when_the_lineage_resumes(root: Path) -> None:
    first = jobs.train_tiny(root, jobs.SyntheticTrainer, "interrupted-save", 4)
    directory = checkpoint_dir(root, first.node)
    temp = directory / "8.orbax-checkpoint-tmp-1733000000"
    temp.mkdir()  # what SIGKILL during orbax's write leaves behind
    (temp / "partial").write_bytes(b"\0" * 16)
    with quick(root) as q:
        q.build(jobs.SyntheticTrainer, "interrupted-save")
        q.find().spec(run="interrupted-save").checkpoint().latest().resume()
        q.config["training/tokens"] = 8 * 8 * 32
        resumed = q.create()
        resumed()
    assert int(resumed.state.step) == 8 and (directory / "8").is_dir() and not temp.exists()
    assert (directory / "unregistered" / temp.name / "partial").read_bytes() == b"\0" * 16


class Interrupted(jobs.SyntheticTrainer):
    """Fails like a KeyboardInterrupt would, when it is about to start step 4."""

    def tick(self):  # type: ignore[no-untyped-def]
        if self.node.seq == 2:
            raise KeyboardInterrupt
        return super().tick()


def test_a_failed_run_frees_its_lineage_for_a_resume_in_the_same_process(root: Path) -> None:
    with quick(root) as q:
        q.build(Interrupted, "notebook")
        jobs.tiny(q.config, steps=6, **{"logging/checkpoint_interval": 1})
        first = q.create()
        with pytest.raises(KeyboardInterrupt):
            first()
    with Store(store_root(root)) as store:  # the saves it started were finished and listed
        listed = [c.step for c in store.query().nonce(first.node.nonce).checkpoints()]
        assert listed == [1, 2, 3]
        # the record says what stopped it (a bare KeyboardInterrupt has no message)
        error = store.values(first.node)["job/error"]
        assert error == "KeyboardInterrupt: stopped by Ctrl-C (SIGINT)"
    with quick(root) as q:  # same process, e.g. the next notebook cell
        q.build(jobs.SyntheticTrainer, "notebook")
        q.find().spec(run="notebook").checkpoint().latest().resume()
        again = q.create()
        again()
    assert int(again.state.step) == 6


def test_a_failed_registration_does_not_repeat_the_earlier_ones_of_its_batch(
    tmp_path: Path,
) -> None:
    # Steps 2, 4 and 6 wait to be registered in one batch; 4's registration fails (its
    # folder is not there), after 2 was registered. By close() step 2's folder is gone
    # (moved away after it was indexed): registering it again would fail close() and
    # leave 4 and 6 unregistered. Before the fix the whole batch stayed pending.
    directory = tmp_path / "checkpoints" / "general" / "default" / "r" / "lineage"
    node = Node.new("r")
    with Store(tmp_path / "store") as store:
        keeper = CheckpointKeeper(directory, store)
        try:
            for step in (2, 6):
                (directory / str(step)).mkdir()
            keeper._pending = [(step, node, {"step": step}) for step in (2, 4, 6)]
            with pytest.raises(CheckpointNotFoundError, match=str(directory / "4")):
                keeper.wait()
            (directory / "4").mkdir()
            shutil.move(directory / "2", tmp_path / "kept-2")
        finally:
            keeper.close()
        assert [(c.step, c.meta) for c in store.checkpoints(node)] == [
            (step, {"step": step}) for step in (2, 4, 6)
        ]


def test_every_spelling_of_a_root_is_one_checkpoint_folder(tmp_path: Path) -> None:
    real = tmp_path / "real"
    (real / "sub").mkdir(parents=True)
    (tmp_path / "link").symlink_to(real, target_is_directory=True)
    node = Node("general.default.2024", "12345678", 0)
    expected = real.resolve() / "checkpoints" / "general" / "default" / "2024" / "12345678"
    for root in (tmp_path / "link", f"{real}/", real / "sub" / "..", real / "." / "sub" / ".."):
        assert checkpoint_dir(root, node) == expected, root
