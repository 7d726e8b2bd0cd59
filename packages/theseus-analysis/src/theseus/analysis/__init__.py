"""theseus.analysis: compiled analyses of a trainer's model, and the forward recorder.

An analysis is a trainer whose `run()` inspects instead of training::

    @analysis("my/gpt/activations")
    class Activations(AnalysisBase, PretrainGPT):
        TARGET = SelfAttention
        NAME = "activations"

        def select(self, paths): return paths[0]
        def analyze(self, layer, inputs): return inputs.x[0, :64, :128]
        def plot(self, values): return self.heatmap(values, xlabel="Feature", ylabel="Token")

Run it as a job (on fresh weights, on a checkpoint with `base=`, or over every checkpoint
of a lineage with `q.find()...over()`), or list it in a trainer's `ANALYSIS` to run it
at validation cadence. `inspector` records whole forward passes to safetensors files;
`magnifier` shows them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from theseus.analysis._base import AnalysisBase
    from theseus.analysis._engine import Selection
    from theseus.analysis._errors import AnalysisError, AnalysisSelectionError
    from theseus.analysis._intervention_base import InterventionBase
    from theseus.analysis._over import OverResult
    from theseus.analysis._result import AnalysisResult
    from theseus.analysis._sites import Call, Effect, InterventionError, Outcome, Site
    from theseus.analysis._view import TrainerView
    from theseus.model.debug import DebugInputs, DebugLayer

__all__ = [
    "AnalysisBase",
    "AnalysisError",
    "AnalysisResult",
    "AnalysisSelectionError",
    "Call",
    "DebugInputs",
    "DebugLayer",
    "Effect",
    "InterventionBase",
    "InterventionError",
    "Outcome",
    "OverResult",
    "Selection",
    "Site",
    "TrainerView",
]

# The engine needs JAX and Flax; the recorder (`theseus.analysis.inspector`) must not
# pay for them when it records a PyTorch model, so the engine's names load on first use.
_LAZY = {
    "AnalysisBase": "theseus.analysis._base",
    "AnalysisResult": "theseus.analysis._result",
    "OverResult": "theseus.analysis._over",
    "InterventionBase": "theseus.analysis._intervention_base",
    "Call": "theseus.analysis._sites",
    "Effect": "theseus.analysis._sites",
    "InterventionError": "theseus.analysis._sites",
    "Outcome": "theseus.analysis._sites",
    "Site": "theseus.analysis._sites",
    "Selection": "theseus.analysis._engine",
    "AnalysisError": "theseus.analysis._errors",
    "AnalysisSelectionError": "theseus.analysis._errors",
    "TrainerView": "theseus.analysis._view",
    "DebugInputs": "theseus.model.debug",
    "DebugLayer": "theseus.model.debug",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'theseus.analysis' has no attribute {name!r}")
