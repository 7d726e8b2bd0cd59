"""A stochastic analysis sees the dropout of training's first micro-step.

Reference: Flax's own `capture_intermediates` on the first micro-batch, with the
dropout key written out by hand from `jax.random` (`fold_in(fold_in(key(seed),
cursor), micro_step)`), not through Theseus's key helper. Tolerance: float32 on CPU,
1e-6 relative and absolute.
"""

from __future__ import annotations

from pathlib import Path

import jax
import numpy as np
import pytest

from theseus.analysis import AnalysisBase
from theseus.data.datasets import Synthetic
from theseus.experiments.models.gpt import PretrainGPT
from theseus.model.attention.base import SelfAttention
from theseus.quick import quick
from theseus.registry import import_module_or_file

jobs = import_module_or_file(str(Path(__file__).with_name("analysis_jobs.py")))
TOL = {"rtol": 1e-6, "atol": 1e-6}


class SecondAttentionInput(AnalysisBase, PretrainGPT):
    """The input of `blocks_1/attn`, which block 0's dropout has already touched."""

    TARGET = SelfAttention
    NAME = "second-input"
    STOCHASTIC = True

    def select(self, paths):
        return "blocks_1/attn"

    def analyze(self, layer, inputs):
        return inputs.x

    def plot(self, values):
        return None


# Two micro-steps here; without accumulation (the simpler case) in the slow set.
@pytest.mark.parametrize("per_device", [pytest.param(0, marks=pytest.mark.slow), 1])
def test_a_stochastic_analysis_sees_the_first_micro_steps_dropout(
    tmp_path: Path, per_device: int
) -> None:
    Synthetic.prepare(tmp_path, tokens=20_000, val_tokens=4_000)
    with quick(tmp_path) as q:
        q.build(SecondAttentionInput, "stochastic")
        jobs.tiny(
            q.config,
            **{
                "architecture/dropout": 0.5,
                "training/per_device_batch_size": per_device,
                "training/seed": 3,
            },
        )
        job = q.create()
    result = job()
    every = job.accumulate_steps
    assert every == (1 if per_device == 0 else 2)
    x, y, mask = (job.batch("train")[k][::every] for k in ("x", "y", "padding_mask"))
    step = jax.random.fold_in(jax.random.key(3), np.uint32(job.cursor))
    first = step if every == 1 else jax.random.fold_in(step, 0)

    def reference(key):
        _, state = job.model.apply(
            {"params": job.state.params},
            x,
            y,
            mask,
            deterministic=False,
            rngs={"dropout": key},
            capture_intermediates=True,
            mutable=["intermediates"],
        )
        return np.asarray(state["intermediates"]["blocks_1"]["ln_1"]["__call__"][0])

    np.testing.assert_allclose(result.values, reference(first), **TOL)
    if every > 1:  # the unfolded step key draws other masks: the test can tell them apart
        assert np.abs(result.values - reference(step)).max() > 1e-3
