"""Killing a training run with SIGKILL and resuming it gives bit-identical parameters."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import jax
import numpy as np
import pytest

from theseus.data.datasets import Synthetic
from theseus.job import store_root
from theseus.quick import quick
from theseus.registry import import_module_or_file
from theseus.store import Store, registered_checkpoints, strays
from theseus.training.checkpoints import checkpoint_dir, restore

JOBS = str(Path(__file__).with_name("trainer_jobs.py"))
jobs = import_module_or_file(JOBS)
SETTINGS = {"logging/checkpoint_interval": 3, "logging/validation_interval": 1000}

# One attempt of the run: resume the latest checkpoint of run "crash" if there is one,
# otherwise start it fresh; print each tick so the parent can aim its SIGKILL.
CHILD = textwrap.dedent(
    """
    import sys
    from theseus.quick import quick
    from theseus.registry import import_module_or_file
    jobs = import_module_or_file(sys.argv[2])
    steps, settings = int(sys.argv[3]), eval(sys.argv[4])

    class Loud(jobs.SyntheticTrainer):
        def tick(self):
            node = super().tick()
            print("tick", node.seq, flush=True)
            return node

    with quick(sys.argv[1]) as q:
        q.build(Loud, "crash")
        if q.find().spec(run="crash").checkpoint().count():
            q.find().spec(run="crash").checkpoint().latest().resume()
        else:
            jobs.tiny(q.config, steps=steps, **settings)
        print("setup", flush=True)
        q.create()()
    print("done", flush=True)
    """
)


def _registered(root: Path) -> dict[str, int]:
    """Every registered checkpoint of run "crash": path -> step."""
    with Store(store_root(root)) as store:
        return {c.path: c.step for c in store.query().spec(run="crash").checkpoints()}


def _attempt(root: Path, steps: int, rng: random.Random, log: Path) -> str:
    """Start one attempt and SIGKILL it at a random moment; returns where it was.

    The child's stderr goes to `log` (a pipe nobody reads could fill and stall it).
    """
    # No shared compilation cache: a kill in the middle of writing an entry would leave
    # a broken one behind for the next process.
    env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
    with open(log, "a") as errors:
        child = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(root), JOBS, str(steps), repr(SETTINGS)],
            stdout=subprocess.PIPE,
            stderr=errors,
            text=True,
            env=env,
        )
    try:
        assert child.stdout is not None
        if rng.random() < 0.2:  # during start-up: imports, set-aside, restore, compile
            time.sleep(rng.uniform(0.0, 4.0))
            where = "start-up"
        else:  # a few steps in, at a random point inside a step (saves are every 3 steps)
            ticks, target = 0, rng.randint(1, 6)
            for line in child.stdout:
                if line.startswith("tick"):
                    ticks += 1
                if ticks >= target or line.startswith("done"):
                    break
            time.sleep(rng.uniform(0.0, 0.08))
            where = f"after {ticks} ticks"
        child.kill()
        child.wait(timeout=60)
        return where
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        if child.stdout is not None:
            child.stdout.close()


def _crash_trials(root: Path, trials: int, steps: int, seed: int) -> None:
    """SIGKILL the run `trials` times at random moments, resuming each time, then finish it
    in this process: it must end bit-identical to an uninterrupted run, and every checkpoint
    the store ever listed must still be listed, on disk and restorable."""
    Synthetic.prepare(root, tokens=60_000, val_tokens=8_000)
    rng = random.Random(seed)
    ever: dict[str, int] = {}
    for trial in range(trials):
        where = _attempt(root, steps, rng, root / "attempts.log")
        now = _registered(root)
        lost = {path: step for path, step in ever.items() if now.get(path) != step}
        assert not lost, f"seed {seed}, trial {trial} ({where}): registrations lost: {lost}"
        assert all(Path(path).is_dir() for path in now), f"seed {seed}, trial {trial} ({where})"
        ever = now

    with quick(root) as q:
        q.build(jobs.SyntheticTrainer, "crash")
        if q.find().spec(run="crash").checkpoint().count():
            q.find().spec(run="crash").checkpoint().latest().resume()
        else:
            jobs.tiny(q.config, steps=steps, **SETTINGS)
        resumed = q.create()
        resumed()
    with quick(root) as q:
        q.build(jobs.SyntheticTrainer, "uninterrupted")
        jobs.tiny(q.config, steps=steps, **SETTINGS)
        straight = q.create()
        straight()

    assert int(resumed.state.step) == int(straight.state.step) == steps
    assert resumed.node.seq == straight.node.seq == steps - 1
    for (path, a), b in zip(
        jax.tree_util.tree_flatten_with_path(resumed.state.params)[0],
        jax.tree.leaves(straight.state.params),
        strict=True,
    ):
        np.testing.assert_array_equal(
            np.asarray(a), np.asarray(b), err_msg=f"seed {seed}: {jax.tree_util.keystr(path)}"
        )
    for a, b in zip(
        jax.tree.leaves(resumed.state.opt_state),
        jax.tree.leaves(straight.state.opt_state),
        strict=True,
    ):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=f"seed {seed}")
    final = _registered(root)
    assert all(final.get(path) == step for path, step in ever.items()), f"seed {seed}"
    with Store(store_root(root)) as store:
        values = store.values(resumed.node)
        assert values["job/status"] == "finished" and values["train/step"] == steps
        assert store.fsck().clean
        # the finished lineage's folder holds only listed steps: strays were set aside
        unregistered, interrupted = strays(
            checkpoint_dir(root, resumed.node), registered_checkpoints(store)
        )
        assert not unregistered and not interrupted, (unregistered, interrupted)
    abstract = jax.tree.map(
        lambda leaf: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=leaf.sharding),
        {
            "step": straight.state.step,
            "params": straight.state.params,
            "opt_state": straight.state.opt_state,
        },
    )
    for path in final:
        restore(path, abstract)  # every registered checkpoint is complete


@pytest.mark.slow  # the default suite's budget: nox -s slow runs it
def test_sigkill_at_random_moments_then_resume_is_bit_exact(tmp_path: Path) -> None:
    # One random kill here; the slow set kills twenty times over a longer run.
    _crash_trials(tmp_path, trials=1, steps=40, seed=int(time.time()) % 10_000)


@pytest.mark.slow
def test_sigkill_twenty_times_then_resume_is_bit_exact(tmp_path: Path) -> None:
    _crash_trials(tmp_path, trials=20, steps=100, seed=int(time.time()) % 10_000)


def test_a_committed_but_unregistered_step_is_set_aside_on_resume(tmp_path: Path) -> None:
    """A crash between orbax's commit and the store's registration leaves a step folder
    the store does not know; resuming must write that step again, not crash."""
    import shutil

    from theseus.store._folders import SET_ASIDE

    Synthetic.prepare(tmp_path, tokens=60_000, val_tokens=8_000)
    first = jobs.train_tiny(tmp_path, jobs.SyntheticTrainer, "orphan", 4)
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
