"""A tandem view holds its trainer: every attribute it documents works, none is half-built.

The view's lists of attributes (`FORWARDED`, `OWN`, `REFUSED`, also in its docstring)
drive the tests, and every name a trainer has is checked to be in one of them. References:
the trainer itself, read directly (its cursor, keys, batches, validation loss), RNG keys
written out by hand from `jax.random` (`fold_in(fold_in(key(seed), cursor), micro_step)`),
and the eager debugger for the analysis's values. Tolerance: float32 on CPU, 1e-6
relative and absolute where values are recomputed; everything else is exact or identity.
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import jax
import numpy as np
import pytest

import theseus.analysis as analysis
from theseus.analysis import AnalysisError
from theseus.data.datasets import Synthetic
from theseus.job import BasicJob, Mode
from theseus.model.attention.base import SelfAttention
from theseus.quick import quick
from theseus.registry import import_module_or_file
from theseus.training.base import BaseTrainer, BaseTrainerConfig

jobs = import_module_or_file(str(Path(__file__).with_name("analysis_jobs.py")))
TOL = {"rtol": 1e-6, "atol": 1e-6}
SEED = 5


@pytest.fixture(scope="module")
def trainer(tmp_path_factory: pytest.TempPathFactory):
    """`TrainWithStats` branched from a 2-step checkpoint, with two micro-steps per update.

    A branch gives the view a base, a mode and a cursor that differ from the node's seq;
    gradient accumulation makes the inspection batch and key differ from the step's.
    """
    root = tmp_path_factory.mktemp("tandem-view")
    Synthetic.prepare(root, tokens=20_000, val_tokens=4_000)
    settings = {"training/seed": SEED, "training/per_device_batch_size": 1}
    with quick(root) as q:
        q.build(jobs.TrainWithStats, "source")
        jobs.tiny(q.config, steps=2, **settings)
        q.create()()
    with quick(root) as q:
        q.build(jobs.TrainWithStats, "view")
        q.find().spec(run="source").checkpoint().latest().branch()
        jobs.tiny(q.config, steps=4, **settings)
        trainer = q.create()  # set up: the tandem views are attached
    return trainer


@pytest.fixture
def view(trainer):
    view = trainer.loop.views[0]
    assert isinstance(view, jobs.Stats)
    return view


def _keys_equal(a, b) -> bool:
    return bool(np.array_equal(jax.random.key_data(a), jax.random.key_data(b)))


def _token_digests(root) -> dict[str, str]:
    """The sha256 of each prepared dataset's token files under `root`, hashed here."""
    import hashlib

    return {
        folder.name: "sha256:"
        + hashlib.sha256(
            (folder / "train.bin").read_bytes() + (folder / "val.bin").read_bytes()
        ).hexdigest()
        for folder in (Path(root) / "data").iterdir()
        if (folder / "header.json").is_file()
    }


def _trees_equal(a, b) -> bool:
    flat_a, tree_a = jax.tree.flatten(a)
    flat_b, tree_b = jax.tree.flatten(b)
    return tree_a == tree_b and all(
        np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(flat_a, flat_b, strict=True)
    )


def test_a_view_reads_the_trainers_cursor_keys_and_validation(trainer, view) -> None:
    # what a half-built view (copied fields, no __init__) did not have: AttributeError
    assert trainer.cursor == 2 and trainer.node.seq == 0  # the branch reads the next batch
    assert view.cursor == trainer.cursor
    assert _keys_equal(view.step_key(), trainer.step_key())
    assert view.validate() == trainer.validate()
    assert view.mode is trainer.mode is Mode.BRANCH


def test_the_documented_lists_are_the_docstring(view) -> None:
    cls = analysis.TrainerView
    assert type(view).__mro__[:3] == (type(view), cls, jobs.Stats)
    doc = " ".join(cls.__doc__.split())
    lists = (cls.FORWARDED, cls.OWN, cls.REFUSED)
    names = [name for names in lists for name in names]
    assert len(names) == len(set(names))  # each attribute in one list
    for name in names:
        assert f"`{name}`" in doc or f"`{name}(" in doc, name


def test_every_public_attribute_of_a_trainer_is_forwarded_own_or_refused(trainer) -> None:
    """Independent of the view's lists: what a trainer and a job have, by introspection."""
    cls = analysis.TrainerView
    documented = {*cls.FORWARDED, *cls.OWN, *cls.REFUSED}
    public = {n for n in dir(BaseTrainer) if not n.startswith("_")} | {"__call__"}
    public |= {n for n in vars(trainer) if not n.startswith("_")}  # set by __init__
    declarations = {n for n in public if n.isupper()}  # CONFIG, MODEL, ANALYSIS, ...
    pure = {  # classmethods and staticmethods: the class's own, no instance to share
        n
        for n in public
        if isinstance(inspect.getattr_static(BaseTrainer, n, None), classmethod | staticmethod)
    }
    assert pure == {"config", "schema", "forward", "train_step", "val_step", "trace"}
    assert public - declarations - pure <= documented, sorted(
        public - declarations - pure - documented
    )
    assert {n for n in dir(BasicJob) if not n.startswith("_")} - declarations - pure <= documented


def test_forwarded_attributes_are_the_trainers(trainer, view) -> None:
    rows = trainer.batch("val")
    every = trainer.accumulate_steps
    assert every == 2
    step = jax.random.fold_in(jax.random.key(SEED), np.uint32(trainer.cursor))  # by hand
    checks = {
        "spec": lambda got: got is trainer.spec,
        "base": lambda got: got == trainer.base and got.name.endswith(".source"),
        "mode": lambda got: got is trainer.mode is Mode.BRANCH,
        "configuration": lambda got: got is trainer.configuration,
        "model": lambda got: got is trainer.model,
        "store": lambda got: got is trainer.store,
        "sharding": lambda got: got is trainer.sharding,
        "node": lambda got: got == trainer.node,
        "state": lambda got: got is trainer.state,
        "cursor": lambda got: got == trainer.cursor == trainer.node.seq + 2,
        "block_size": lambda got: got == trainer.block_size == 32,
        "total_steps": lambda got: got == trainer.total_steps == 4,
        "accumulate_steps": lambda got: got == every,
        "analysis_failures": lambda got: got is trainer.analysis_failures,
        "scheduled": lambda got: got is trainer.scheduled,
        "layout": lambda got: got is trainer.layout,
        "learning_rate": lambda got: (
            [got(s) for s in (1, 4)] == [trainer.learning_rate(s) for s in (1, 4)]
        ),
        "batch_geometry": lambda got: got() == trainer.batch_geometry(),
        "batch": lambda got: got() is trainer.batch("train") and got("val") is trainer.batch("val"),
        "read_batch": lambda got: (
            _trees_equal(got(trainer.cursor), trainer.batch("train"))
            and not _trees_equal(got(trainer.cursor + 1), trainer.batch("train"))
        ),
        "inspection_batch": lambda got: (
            _trees_equal(got(), {k: v[::every] for k, v in trainer.batch("train").items()})
            and _trees_equal(got(), trainer.inspection_batch())
        ),
        "step_key": lambda got: _keys_equal(got(), trainer.step_key()) and _keys_equal(got(), step),
        "inspection_key": lambda got: (
            _keys_equal(got(), trainer.inspection_key())
            and _keys_equal(got(), jax.random.fold_in(step, 0))
        ),
        "validate": lambda got: got() == trainer.validate(),
        "evaluate_batch": lambda got: got(rows) == trainer.evaluate_batch(rows),
        "generate": lambda got: (
            got("ab", 4, temperature=0) == trainer.generate("ab", 4, temperature=0)
        ),
        "tokenizer": lambda got: got == trainer.tokenizer and got.encode("ab").tolist() == [97, 98],
        "prompt_batch": lambda got: (
            got("ab")["x"][0].tolist() == [97, 98]  # the byte tokenizer's ids, by hand
            and all(np.array_equal(v, trainer.prompt_batch("ab")[k]) for k, v in got("ab").items())
        ),
        "data_record": lambda got: (
            got() == trainer.data_record() != {}
            and {k: v["digest"] for k, v in got().items()} == _token_digests(trainer.spec.root)
        ),
        "log": lambda got: (
            got({"view/check": 1.5}) is None
            and trainer.store.values(trainer.node)["view/check"] == 1.5
        ),
    }
    assert set(checks) == set(analysis.TrainerView.FORWARDED)
    failed = [name for name, check in checks.items() if not check(getattr(view, name))]
    assert failed == []


def test_forwarded_values_cannot_be_assigned(trainer, view) -> None:
    for name in analysis.TrainerView.FORWARDED:
        if isinstance(inspect.getattr_static(type(view), name), property):
            with pytest.raises(AnalysisError, match=rf"^Stats is a view .* its {name} is the"):
                setattr(view, name, None)
    assert view.state is trainer.state and view.spec is trainer.spec


def test_the_views_own_attributes(trainer, view) -> None:
    path = "blocks_1/attn"  # what Stats selects: the last attention
    _, expected = trainer.debug(path)
    checks = {
        "trainer": lambda got: got is trainer,
        "borrowed": lambda got: got is True,
        "args": lambda got: got == trainer.args,  # Stats keeps PretrainGPT's CONFIG
        "traces": lambda got: isinstance(got, int),
        "find": lambda got: got(SelfAttention) == trainer.find(SelfAttention),
        "debug": lambda got: _debugged_x_is(got(path), expected.x),
        "configure": lambda got: got(BaseTrainerConfig) == trainer.configure(BaseTrainerConfig),
        "activated": lambda got: _activated_is(got, trainer.configuration),
        "status_key": lambda got: got("status") == trainer.status_key("status"),
        "compute": lambda got: np.allclose(got()["x"], np.asarray(expected.x)[:, :4, :8], **TOL),
        "run": lambda got: _ran_on(got(), trainer),
        "drain": lambda got: _drained(view, got, trainer),
        "outcome": lambda got: got(view.run())[0].startswith(f"{view.NAME}: wrote "),
        "close": lambda got: got() is None and trainer.store.get(trainer.node) is not None,
    }
    assert set(checks) == set(analysis.TrainerView.OWN)
    failed = [name for name, check in checks.items() if not check(getattr(view, name))]
    assert failed == []
    assert view.traces == 1  # compute and run shared one compilation
    # nothing of the trainer is copied onto the view: only the engine's own fields
    assert set(vars(view)) == {"_trainer", "_in_analyze", "_analysis_fn", "_selection"} | {
        "traces",
        "args",
    }


def _debugged_x_is(session, x) -> bool:
    _, inputs = session
    return bool(np.array_equal(np.asarray(inputs.x), np.asarray(x)))


def _activated_is(activated, tree) -> bool:
    with activated() as active:
        return active is tree


def _drained(view, drain, trainer) -> bool:
    """run(background=True) leaves the publishing to the thread; drain() waits for it."""
    versions = len(trainer.store.history(trainer.node, "stats"))
    later = view.run(background=True)
    drain()
    history = trainer.store.history(trainer.node, "stats")
    return (
        later.path is None
        and later.artifact is None
        and len(history) == versions + 1
        and json.loads(history[-1].content) == view.plot(later.values)
    )


def _ran_on(result, trainer) -> bool:
    saved = trainer.store.get(trainer.node)["stats"]
    return result.node == trainer.node and saved.content == result.artifact.content


def test_the_lifecycle_is_refused_in_one_line(trainer, view) -> None:
    node, arguments = trainer.node, {"on_setup": (Mode.BRANCH,), "setup": (True,)}
    # with the trainer's arguments, and with none (a method is refused, not mis-called)
    calls = [(n, arguments.get(n, ())) for n in analysis.TrainerView.REFUSED]
    for name, args in [*calls, *((n, ()) for n in arguments)]:
        with pytest.raises(AnalysisError) as caught:
            getattr(view, name)(*args)
        message = str(caught.value)
        assert message.startswith(
            "Stats is a view borrowed from TrainWithStats, and the trainer owns "
        ), name
        assert "\n" not in message, name
    assert trainer.node == node and view.node == node  # nothing moved


def test_from_trainer_makes_a_fresh_view_and_checks_its_selection(trainer) -> None:
    view = jobs.Several.from_trainer(trainer)
    assert view is not trainer.loop.views[1] and type(view) is type(trainer.loop.views[1])
    assert repr(view).startswith("<Several view of <TrainWithStats")
    assert view.traces == 0 and view.cursor == trainer.cursor
    bad = type("Bad", (jobs.Several,), {"NAME": "bad", "CHOICE": ["blocks_9/attn"]})
    with pytest.raises(analysis.AnalysisSelectionError, match="blocks_9/attn"):
        bad.from_trainer(trainer)
