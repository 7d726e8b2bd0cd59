"""The analysis engine on the accelerator: the debugger against the compiled engine, and a
head-ablation sweep against an eager computation.

Debugger: `layer, inputs = trainer.debug(path)` replays the batch eagerly, and
`layer(inputs.x)` is compared with the same expression in `analyze()` through the
compiled engine, at every attention and MLP call (as `benchmarks/analysis.py --checks
debugger` does), both under `precise()`. Tolerance: `recompiled`.

Sweep: `intervention_jobs.HeadAblationTokens` zero-ablates each head of each layer of
the shared run's last checkpoint (grouped-query heads); every target's loss change is
compared with `test_interventions.Reference`, the model applied eagerly with the head's
slice of `c_proj`'s input set to zero by hand and the losses taken in float64 from its
logits (the sweep's are float32 on the platform). Tolerance: `reference` of the losses'
size, and the changes must exceed ten times that.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import _run
import numpy as np
import pytest
from _tolerances import assert_close, precise, tolerance

from theseus.analysis import AnalysisBase
from theseus.experiments.models.gpt import PretrainGPT
from theseus.model.attention.base import SelfAttention
from theseus.model.mlp import MLP
from theseus.registry import import_module_or_file

pytestmark = pytest.mark.accelerator


class Replay(AnalysisBase, PretrainGPT):
    """Every attention and MLP call replayed on its own input."""

    TARGET = (SelfAttention, MLP)
    NAME = "replay"

    def select(self, paths: list[str]) -> list[str]:
        return paths

    def analyze(self, layers: Any, inputs: Any) -> Any:
        return [layer(given.x) for layer, given in zip(layers, inputs, strict=True)]

    def plot(self, values: Any) -> Any:
        return None


def test_the_debugger_agrees_with_the_compiled_engine(trained: tuple[Path, Any]) -> None:
    _, trainer = trained
    paths = trainer.find((SelfAttention, MLP))
    assert len(paths) == 2 * _run.SETTINGS["architecture/n_layers"]
    with precise():
        compiled = Replay.from_trainer(trainer).compute()
        assert len(compiled) == len(paths)
        for path, jitted in zip(paths, compiled, strict=True):
            with trainer.debug(path) as (layer, inputs):
                eager = np.asarray(layer(inputs.x))
            assert_close(eager, np.asarray(jitted), "recompiled", what=f"layer(inputs.x) at {path}")


def test_a_head_ablation_sweep_matches_the_eager_losses(trained: tuple[Path, Any]) -> None:
    root, _ = trained
    sweeps = import_module_or_file(str(_run.ANALYSIS_TESTS / "intervention_jobs.py"))
    eager = import_module_or_file(str(_run.ANALYSIS_TESTS / "test_interventions.py"))
    job = _run.open_at(root, sweeps.HeadAblationTokens, "sweep")
    with precise():
        got = np.asarray(job().values)
        ref = eager.Reference(job)
        clean = ref.losses()
        want = np.zeros((ref.n_layers, ref.n_head, *clean.shape))
        for layer in range(ref.n_layers):
            for head in range(ref.n_head):
                want[layer, head] = ref.losses(ref.with_head(layer, head, 0.0)) - clean
    assert got.shape == want.shape == (2, 4, *clean.shape)
    scale = float(np.abs(clean).max())
    assert_close(got, want, "reference", what="per-head loss changes", scale=scale)
    assert np.abs(want).max() > 4 * tolerance("reference") * scale, "nothing changed"
    assert job.traces == 1
