"""Tandem results publish off the training thread: plot, file and artifact in cadence order.

No timing is measured: a `plot()` that blocks until the trainer has gone past the
validation proves that the step did not wait for it (were publishing inline, the plot
would wait for itself and the test would fail at its timeout). References: the
trainer's own node sequence and the store's records.
"""

from __future__ import annotations

import functools
import threading
from pathlib import Path

import numpy as np
import pytest

from theseus.analysis import AnalysisBase
from theseus.data.datasets import Synthetic
from theseus.experiments.models.gpt import PretrainGPT
from theseus.model.attention.base import SelfAttention
from theseus.quick import quick
from theseus.registry import import_module_or_file

jobs = import_module_or_file(str(Path(__file__).with_name("analysis_jobs.py")))

WAIT = 60.0  # seconds a blocked plot waits before the test calls it a stall


class Gate(AnalysisBase, PretrainGPT):
    """Records each plot in order; each waits until the trainer says it went on."""

    TARGET = SelfAttention
    NAME = "gate"
    opened: threading.Event
    seen: list[tuple[str, int]]
    steps: list[int]
    fail_at: int | None = None

    def select(self, paths):
        return paths[0]

    def analyze(self, layer, inputs):
        return inputs.x[0, :2, :2]

    def plot(self, values):
        # The step this plot belongs to, as the training thread recorded it before the
        # validation (plots publish in cadence order). Reading `self.trainer.state` here
        # would race the next train step, which donates that state's buffers.
        step = type(self).steps.pop(0)
        if not type(self).opened.wait(WAIT):
            raise TimeoutError("the trainer never went past the validation")
        type(self).seen.append(("plot done", step))
        plots = sum(1 for what, _ in type(self).seen if what == "plot done")
        if plots == type(self).fail_at:
            raise ValueError("a bad plot")
        return {"first": float(np.asarray(values)[0, 0])}


class GatedTrainer(PretrainGPT):
    ANALYSIS = [Gate]
    crash_at: int | None = None  # the step after which the run dies
    inline = False  # training/analysis_errors = raise: the plot runs inside view.run()

    def on_setup(self, mode):  # type: ignore[no-untyped-def]
        super().on_setup(mode)
        [view] = self.loop.views
        view.run = functools.partial(self._gated, view.run)  # what the loop calls

    def _gated(self, run, **kwargs):  # type: ignore[no-untyped-def]
        Gate.steps.append(int(self.state.step))  # on the training thread, before the step goes on
        if self.inline:
            Gate.opened.set()  # inline, the plot runs inside run()
        result = run(**kwargs)
        Gate.seen.append(("validation returned", int(self.state.step)))
        Gate.opened.set()  # the plot may go on only now
        return result

    def tick(self):  # type: ignore[no-untyped-def]
        if self.node.seq + 1 == self.crash_at:  # step `crash_at` is done; the next begins
            raise RuntimeError("the run dies")
        return super().tick()


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("tandem-background")
    Synthetic.prepare(root, tokens=40_000, val_tokens=6_000)
    return root


def _train(root: Path, run: str, **extra: object):  # type: ignore[no-untyped-def]
    Gate.opened, Gate.seen, Gate.steps = threading.Event(), [], []
    with quick(root) as q:
        q.build(GatedTrainer, run)
        jobs.tiny(q.config, steps=4, **{"logging/checkpoint_interval": 4, **extra})
        trainer = q.create()
        trainer()
    return trainer


def test_validation_returns_before_the_plot_and_results_keep_cadence_order(root: Path) -> None:
    trainer = _train(root, "gated")
    # the first plot could finish only after the validation had returned: not inline
    assert Gate.seen[:2] == [("validation returned", 2), ("plot done", 2)]
    assert ("plot done", 4) in Gate.seen
    store = trainer.store
    nodes = sorted(
        store.query().nonce(trainer.node.nonce).artifact("gate").all(), key=lambda n: n.seq
    )
    assert [n.seq for n in nodes] == [1, 3]  # after steps 2 and 4, each on its own node
    firsts = [store.get(n)["gate"] for n in nodes]
    assert all(a.version == 1 for a in firsts)
    assert firsts[0].created <= firsts[1].created  # published in cadence order
    assert (root / "analyses/general/default/gated/gate.json").is_file()


def test_a_failed_publish_is_recorded_on_its_node(root: Path) -> None:
    Gate.fail_at = 1
    try:
        trainer = _train(root, "gated-failing")
    finally:
        Gate.fail_at = None
    store = trainer.store
    nodes = {n.seq: n for n in store.query().nonce(trainer.node.nonce).all()}
    assert store.values(nodes[1])["analysis/gate/error"] == "ValueError: a bad plot"
    assert "gate" not in store.get(nodes[1]) and "gate" in store.get(nodes[3])
    assert [(step, name) for step, name, _ in trainer.analysis_failures] == [(2, "gate")]
    assert store.values(trainer.node)["job/status"] == "finished"


def test_a_run_that_dies_still_publishes_what_it_computed(root: Path) -> None:
    Gate.opened, Gate.seen, Gate.steps = threading.Event(), [], []
    GatedTrainer.crash_at = 3
    try:
        with quick(root) as q, pytest.raises(RuntimeError, match="the run dies"):
            q.build(GatedTrainer, "gated-crash")
            jobs.tiny(q.config, steps=4)
            trainer = q.create()
            trainer()
    finally:
        GatedTrainer.crash_at = None
    with quick(root) as q:
        (node,) = q.store.query().spec(run="gated-crash").artifact("gate").all()
        assert node.seq == 1  # the validation after step 2, published as the run died


def test_analysis_errors_raise_publishes_inline(root: Path) -> None:
    class Inline(GatedTrainer):
        inline = True

    Gate.opened, Gate.seen, Gate.steps = threading.Event(), [], []
    with quick(root) as q:
        q.build(Inline, "gated-inline")
        jobs.tiny(q.config, steps=2, **{"training/analysis_errors": "raise"})
        q.create()()
    assert Gate.seen == [("plot done", 2), ("validation returned", 2)]
