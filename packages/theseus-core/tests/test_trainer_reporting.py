"""Evaluations at validation cadence, and what a run shows while it runs."""

from __future__ import annotations

import logging
import math
import subprocess
import sys
from pathlib import Path

import pytest

from theseus.data.datasets import Synthetic
from theseus.quick import quick
from theseus.registry import import_module_or_file
from theseus.store import Store
from theseus.training.base import BaseTrainer
from theseus.training.evaluation import Evaluation, Perplexity
from theseus.training.reporting import Reporter, format_duration

jobs = import_module_or_file(str(Path(__file__).with_name("trainer_jobs.py")))


class MeanParameter(Evaluation):
    """A user-written evaluation: two numbers about the parameters."""

    NAME = "params"

    def evaluate(self, trainer: BaseTrainer) -> dict[str, float]:
        import jax
        import jax.numpy as jnp

        leaves = jax.tree.leaves(trainer.state.params)
        return {
            "count": float(sum(x.size for x in leaves)),
            "mean_abs": float(sum(jnp.abs(x).sum() for x in leaves) / sum(x.size for x in leaves)),
        }


class Evaluated(BaseTrainer):
    DATASET = Synthetic
    EVALUATION = [Perplexity, MeanParameter]


def test_evaluations_record_values_at_validation_cadence(tmp_path: Path) -> None:
    Synthetic.prepare(tmp_path, tokens=40_000, val_tokens=6_000)
    with quick(tmp_path) as q:
        q.build(Evaluated, "evaluated")
        jobs.tiny(q.config, steps=4, **{"evaluation/perplexity/batches": 3})
        trainer = q.create()
        trainer()
    values = trainer.store.values(trainer.node)
    # perplexity is exp of the mean loss over the same held-out batches, recomputed here
    from theseus.data.batches import MixturePlan

    plan = MixturePlan([Synthetic.open(tmp_path)], [1.0], ["pmd"], seed=trainer.args.data_seed)
    total = count = 0
    for index in range(3):
        loss_sum, n = trainer.evaluate_batch(plan.batch(index, "val", **trainer.batch_geometry()))
        total, count = total + loss_sum, count + n
    assert values["eval/perplexity"] == pytest.approx(math.exp(total / count), rel=1e-6)
    assert 1.0 < values["eval/perplexity"] < 258
    n_params = sum(x.size for x in __import__("jax").tree.leaves(trainer.state.params))
    assert values["eval/params/count"] == n_params
    assert values["eval/params/mean_abs"] > 0
    assert "evaluation/perplexity/dataset" in trainer.configuration


def test_reporter_is_quiet_off_a_terminal_and_logs_each_report(
    caplog: pytest.LogCaptureFixture,
) -> None:
    reporter = Reporter(total=100, start=0, tokens_per_step=512, run="p.g.r")
    assert reporter._bar is None  # pytest's stderr is not a terminal
    with caplog.at_level(logging.INFO, logger="theseus.training"):
        reporter.report(10, 2.5, reporter.throughput(10))
        reporter.report(20, 2.25, reporter.throughput(20))
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2
    assert lines[0].startswith("p.g.r step 10/100 loss 2.5000") and "tok/s ETA" in lines[0]
    reporter.close()


def test_format_duration() -> None:
    assert [format_duration(s) for s in (0, 59.4, 75.2, 3725)] == ["0s", "59s", "1m15s", "1h02m"]


SCRIPT = """
import sys
from theseus.data.datasets import Synthetic
from theseus.quick import quick
from theseus.registry import import_module_or_file

jobs = import_module_or_file({jobs!r})
root, configure = sys.argv[1], sys.argv[2] == "configure"
if configure:  # the script's own logging: every theseus line goes there, none to stderr
    import logging
    logging.basicConfig(  # force: absl already gave the root logger a handler
        filename=root + "/own.log", level=logging.INFO, format="%(message)s", force=True
    )
Synthetic.prepare(root, tokens=20_000, val_tokens=4_000)
with quick(root) as q:
    q.build(jobs.SyntheticTrainer, "script")
    jobs.tiny(q.config, steps=6, **{{
        "logging/report_interval": 2,
        "logging/validation_interval": 3,
        "logging/checkpoint_interval": 6,
    }})
    q.create()()
"""


@pytest.mark.parametrize("logging_setup", ["none", "configure"])
def test_a_script_whose_output_is_a_file_says_what_training_does(
    tmp_path: Path, logging_setup: str
) -> None:
    """`python train.py > log.txt 2>&1` with no logging configured: every report,
    validation and checkpoint is a line of the file. A script that configures logging
    gets the same lines in its own log, and nothing on stderr."""
    script = tmp_path / "train.py"
    script.write_text(SCRIPT.format(jobs=str(Path(__file__).with_name("trainer_jobs.py"))))
    root = tmp_path / "root"
    root.mkdir()
    with open(tmp_path / "out.txt", "w") as out:
        done = subprocess.run(
            [sys.executable, str(script), str(root), logging_setup],
            stdout=out, stderr=subprocess.STDOUT, timeout=300,
        )  # fmt: skip
    output = (tmp_path / "out.txt").read_text()
    assert done.returncode == 0, output
    lines = (root / "own.log").read_text() if logging_setup == "configure" else output
    ours = [line for line in lines.splitlines() if line.startswith("general.default.script ")]
    nonce = next(p.name for p in (root / "checkpoints/general/default/script").iterdir())
    saved = root / "checkpoints/general/default/script" / nonce / "6"

    def kind(line: str) -> str:
        if " loss " in line and line.endswith(tuple("0123456789s")) and "tok/s ETA" in line:
            return "report"
        if " validation loss " in line:
            return "validation"
        return "checkpoint" if line.endswith(f"checkpoint saving to {saved}") else line

    # First, what the state costs each device; then one line per event.
    state, ours = ours[0], ours[1:]
    assert " state on " in state and "parameters " in state and "optimizer state " in state
    steps = [line.split(" step ")[1].split()[0] for line in ours]
    assert list(zip(steps, map(kind, ours), strict=True)) == [
        ("2/6", "report"),
        ("3/6", "validation"),
        ("4/6", "report"),
        ("6/6", "report"),
        ("6/6", "validation"),
        ("6/6", "checkpoint"),
    ]
    assert saved.is_dir()
    with Store(root / "store") as store:
        last = store.query().spec(run="script").latest().first()
        assert last is not None
        val = store.values(last)["val/loss"]
    assert ours[4].endswith(f"validation loss {val:.4f}")
    if logging_setup == "configure":
        assert "general.default.script" not in output


def test_calling_a_finished_run_says_there_is_nothing_to_train(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    Synthetic.prepare(tmp_path, tokens=20_000, val_tokens=4_000)
    trainer = jobs.train_tiny(tmp_path, jobs.SyntheticTrainer, "done", 2)
    with quick(tmp_path) as q:
        q.build(jobs.SyntheticTrainer, "done")
        q.find().nonce(trainer.node.nonce).checkpoint().latest().resume()
        again = q.create()
        caplog.clear()  # the first run's lines, when another test left logging on INFO
        with caplog.at_level(logging.INFO, logger="theseus.training"):
            again()
    (line,) = [r.getMessage() for r in caplog.records if r.name == "theseus.training"]
    assert line.startswith("general.default.done is at step 2 of 2 (training/tokens = ")
    assert line.endswith("nothing to train. Raise training/tokens to train on.")
    assert again.node == trainer.node  # nothing ticked
