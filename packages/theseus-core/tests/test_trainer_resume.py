"""Killing a training run with SIGKILL and resuming it gives bit-identical parameters."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import jax
import numpy as np

from theseus.data.datasets import Synthetic
from theseus.job import store_root
from theseus.quick import quick
from theseus.registry import import_module_or_file
from theseus.store import Store

JOBS = str(Path(__file__).with_name("trainer_jobs.py"))
jobs = import_module_or_file(JOBS)
STEPS = 200
SETTINGS = {"logging/checkpoint_interval": 8, "logging/validation_interval": 1000}

CHILD = textwrap.dedent(
    f"""
    import sys
    from theseus.quick import quick
    from theseus.registry import import_module_or_file
    jobs = import_module_or_file({JOBS!r})
    with quick(sys.argv[1]) as q:
        q.build(jobs.SyntheticTrainer, "interrupted")
        jobs.tiny(q.config, steps={STEPS}, **{SETTINGS!r})
        q.create()()
    """
)


def _latest_checkpoint_step(root: Path) -> int:
    with Store(store_root(root)) as store:
        node = store.query().spec(run="interrupted").checkpoint().latest().first()
        return -1 if node is None else max(c.step for c in store.checkpoints(node))


def test_sigkill_then_resume_is_bit_exact(tmp_path: Path) -> None:
    Synthetic.prepare(tmp_path, tokens=60_000, val_tokens=8_000)
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(tmp_path)], stderr=subprocess.PIPE)
    deadline = time.monotonic() + 240
    try:
        while _latest_checkpoint_step(tmp_path) < 8:
            assert child.poll() is None, (
                child.stderr.read().decode()[-3000:] if child.stderr else ""
            )
            assert time.monotonic() < deadline, "the child never checkpointed step 8"
            time.sleep(0.05)
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.wait()
        if child.stderr is not None:
            child.stderr.close()
    killed_at = _latest_checkpoint_step(tmp_path)
    assert child.returncode == -signal.SIGKILL and 8 <= killed_at < STEPS

    with quick(tmp_path) as q:
        q.build(jobs.SyntheticTrainer, "interrupted")
        q.find().spec(run="interrupted").checkpoint().latest().resume()
        resumed = q.create()
        assert int(resumed.state.step) == killed_at
        resumed()
    with quick(tmp_path) as q:
        q.build(jobs.SyntheticTrainer, "uninterrupted")
        jobs.tiny(q.config, steps=STEPS, **SETTINGS)
        straight = q.create()
        straight()

    assert int(resumed.state.step) == int(straight.state.step) == STEPS
    assert resumed.node.seq == straight.node.seq == STEPS - 1
    for (path, a), b in zip(
        jax.tree_util.tree_flatten_with_path(resumed.state.params)[0],
        jax.tree.leaves(straight.state.params),
        strict=True,
    ):
        np.testing.assert_array_equal(
            np.asarray(a), np.asarray(b), err_msg=jax.tree_util.keystr(path)
        )
    for a, b in zip(
        jax.tree.leaves(resumed.state.opt_state),
        jax.tree.leaves(straight.state.opt_state),
        strict=True,
    ):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    final = resumed.store.values(resumed.node)
    assert final["job/status"] == "finished" and final["train/step"] == STEPS


def test_a_committed_but_unregistered_step_is_set_aside_on_resume(tmp_path: Path) -> None:
    """A crash between orbax's commit and the store's registration leaves a step folder
    the store does not know; resuming must write that step again, not crash."""
    import shutil

    from theseus.store._folders import SET_ASIDE
    from theseus.training.checkpoints import checkpoint_dir

    Synthetic.prepare(tmp_path, tokens=60_000, val_tokens=8_000)
    with quick(tmp_path) as q:
        q.build(jobs.SyntheticTrainer, "orphan")
        jobs.tiny(q.config, steps=4, **{"logging/checkpoint_interval": 4})
        first = q.create()
        first()
    directory = checkpoint_dir(tmp_path, first.node)
    assert sorted(p.name for p in directory.iterdir() if p.name.isdigit()) == ["4"]
    shutil.copytree(directory / "4", directory / "8")  # a committed, unregistered step 8

    with quick(tmp_path) as q:
        q.build(jobs.SyntheticTrainer, "orphan")
        q.find().spec(run="orphan").checkpoint().latest().resume()
        q.config["training/tokens"] = 8 * 8 * 32
        resumed = q.create()
        resumed()
    assert int(resumed.state.step) == 8
    assert (directory / SET_ASIDE / "8").is_dir()  # moved aside, not deleted
    with Store(store_root(tmp_path)) as store:
        saved = store.checkpoints(resumed.node)
        assert [c.step for c in saved] == [8] and Path(saved[0].path) == directory / "8"
