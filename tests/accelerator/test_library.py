"""The library's first analyses on the accelerator: a walk over the shared run's
checkpoints (grouped-query heads) against NumPy, and the planted heads.

Walk: `FirstAnalyses` (all five, one program) over run `trained`'s three checkpoints
under `precise()`, compiled once; on the last, the logit lens against
`library_reference` (float64 NumPy of the residuals Flax records on the platform, through
the model's `ln_f` and unembedding weights) and the loss by position against NumPy from
the platform's logits. Tolerance: `reference` of the losses' size.

Planted heads: the default suite's hand-set two-layer model (`test_planted_heads.py`)
scores its previous-token and induction heads as the patterns its weights imply, on the
platform. Tolerance: `reference` (the scores are at most 1).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import _run
import jax
import numpy as np
import pytest
from _tolerances import assert_close, precise

from theseus.analysis.library import FirstAnalyses, InductionHeads
from theseus.quick import quick
from theseus.registry import import_module_or_file

pytestmark = pytest.mark.accelerator

LIBRARY = _run.ANALYSIS_TESTS / "library"


def test_a_walk_over_the_checkpoints_agrees_with_numpy(trained: tuple[Path, Any]) -> None:
    ref = import_module_or_file(str(LIBRARY / "library_reference.py"))
    root, _ = trained
    with quick(root) as q:
        q.build(FirstAnalyses, "first")
        q.config["library/batches"] = 2
        q.config["library/icl/early"] = 4
        q.find().spec(run=_run.RUN).over()
        job = q.create()
        with precise():
            walk = job()
            got = walk.results[-1].values
            batches = job.validation_batches()
            ran = ref.forwards(job.state, batches)
            lens = ref.lens(job.state, job.configuration, batches, ran)
            total, count = ref.position_sums(batches, ran)
    assert [r.node.seq for r in walk.results] == [c - 1 for c in _run.CHECKPOINTS]
    assert job.traces == 1
    scale = float(np.abs(lens["loss"]).max())
    assert_close(
        got["logit-lens"]["loss"], lens["loss"], "reference", what="lens loss", scale=scale
    )
    assert_close(got["logit-lens"]["kl"], lens["kl"], "reference", what="lens KL", scale=scale)
    assert_close(
        got["loss-by-position"]["loss"], total / count, "reference", what="loss by position"
    )
    scores = got["induction"]["induction"]
    assert scores.shape == (2, 4) and np.all((scores >= 0) & (scores <= 1))


def test_planted_heads_on_the_platform(tmp_path: Path) -> None:
    planted = import_module_or_file(str(LIBRARY / "test_planted_heads.py"))
    with quick(tmp_path) as q:
        q.build(InductionHeads, "planted")
        for key, value in planted.SETTINGS.items():
            q.config[key] = value
        job = q.create()
        job.setup()
        hand = planted.planted(jax.tree.map(np.asarray, job.state.params))
        placed = jax.tree.map(lambda h, p: jax.device_put(h, p.sharding), hand, job.state.params)
        job.state = job.state.replace(params=placed)
        with precise():
            got = job.compute()
    induction, previous = planted.reference(np.asarray(job.repeated_batch()["x"]))
    assert_close(got["induction"], induction, "reference", what="induction scores", scale=1.0)
    assert_close(got["previous_token"], previous, "reference", what="previous-token", scale=1.0)
