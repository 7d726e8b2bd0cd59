"""A failing tandem analysis is logged and recorded, and training goes on.

A typo in an analysis's `plot()` must not cost a multi-day run. References: the
trainer's own step counter and the store's values at each validation node, written
by the trainer (not by the analysis under test); a plain PretrainGPT trained with
the same settings gives the reference losses.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from theseus.analysis import AnalysisBase
from theseus.data.datasets import Synthetic
from theseus.experiments.models.gpt import PretrainGPT
from theseus.model.attention.base import SelfAttention
from theseus.quick import quick
from theseus.registry import import_module_or_file

jobs = import_module_or_file(str(Path(__file__).with_name("analysis_jobs.py")))


class TypoInPlot(AnalysisBase, PretrainGPT):
    """Analyzes fine, then fails in `plot()` as a typo would."""

    TARGET = SelfAttention
    NAME = "typo"

    def select(self, paths):
        return paths[0]

    def analyze(self, layer, inputs):
        return inputs.x[0, :4, :4]

    def plot(self, values):
        return self.heatmapp(values)  # the typo: no such method


class WithTypo(PretrainGPT):
    ANALYSIS = [TypoInPlot, jobs.Activations]


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("tandem-errors")
    Synthetic.prepare(root, tokens=40_000, val_tokens=6_000)
    return root


def _train(root: Path, cls: type, run: str, **extra: object):
    with quick(root) as q:
        q.build(cls, run)
        jobs.tiny(q.config, steps=4, **{"logging/checkpoint_interval": 4, **extra})
        trainer = q.create()
        trainer()
    return trainer


def test_a_failing_plot_is_logged_recorded_and_retried_while_training_goes_on(
    root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="theseus.training.base"):
        trainer = _train(root, WithTypo, "typo")
    reference = _train(root, PretrainGPT, "no-analysis")
    store = trainer.store
    assert int(trainer.state.step) == 4 and store.values(trainer.node)["job/status"] == "finished"
    # validation runs after steps 2 and 4 (nodes 1 and 3): the analysis was tried at both
    nodes = {n.seq: n for n in store.query().nonce(trainer.node.nonce).all()}
    for seq in (1, 3):
        error = store.values(nodes[seq])["analysis/typo/error"]
        assert error.startswith("AttributeError: ") and "heatmapp" in error
        # the other analysis of the same validation still ran and was kept
        assert [a["name"] for a in store.query().node(nodes[seq]).artifact().select()] == [
            "activations"
        ]
    assert "analysis/typo/error" not in store.values(nodes[0])
    assert [(step, name) for step, name, _ in trainer.analysis_failures] == [
        (2, "typo"),
        (4, "typo"),
    ]
    # training itself was not disturbed: the same losses as without any analysis
    for seq in (1, 3):
        assert store.values(nodes[seq])["val/loss"] == pytest.approx(
            reference.store.values(
                next(
                    n
                    for n in reference.store.query().nonce(reference.node.nonce).all()
                    if n.seq == seq
                )
            )["val/loss"],
            rel=1e-6,
        )
    failures = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(failures) == 2 and "Traceback" in failures[0].getMessage()
    assert "heatmapp" in failures[0].getMessage() and "typo" in failures[0].getMessage()
    [summary] = [
        r.getMessage() for r in caplog.records if "failed tandem analysis" in r.getMessage()
    ]
    assert "2 failed tandem analysis run(s)" in summary and "typo at step 4" in summary


def test_analysis_errors_raise_restores_fail_fast(root: Path) -> None:
    with pytest.raises(AttributeError, match="heatmapp"):
        _train(root, WithTypo, "typo-raise", **{"training/analysis_errors": "raise"})
    with quick(root) as q:
        [node] = [n for n in q.store.query().spec(run="typo-raise").all() if n.seq == 1]
        assert q.store.values(node)["job/status"] == "failed"
