"""The analyses `theseus demo` runs: what the first attention layer reads, where it looks,
and which heads copy what followed a token's earlier occurrence.

- `AttentionInput` (`demo/analyze/attention-input`): the input of the first attention
  layer for the first sequence of the batch, as a heatmap (token x feature).
- `AttentionPattern` (`demo/analyze/attention-pattern`): the last attention layer's
  probabilities for the first sequence, averaged over heads (query x key), as a
  heatmap; a trained model's rows concentrate on the few previous tokens that
  predict the next one.
- `HeadAblation` (`demo/intervene/head-ablation`): an intervention sweep, the loss
  increase when each head of each layer is zero-ablated, as a layer x head heatmap.
- `Features` (`demo/analyze/features`): a top-k sparse autoencoder on the residual
  stream after each block (8 x its width, 8 active features per token); `--over` a
  lineage it chains them over its checkpoints (see "Features over training" in the
  README).
- `DemoTrainer` (`demo/train`): `PretrainGPT` with both analyses and the library's
  induction score (`theseus.analysis.library.InductionHeads`: values
  `dynamics/induction/L{l}H{h}`, a layer x head heatmap) in tandem; the demo sets
  `library/induction/tokens = data`, so the repeated random tokens are ids its
  synthetic language uses.

Import this module to register them (`theseus run --import theseus.analysis.demo ...`).
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from theseus.analysis import interventions as iv
from theseus.analysis._base import AnalysisBase
from theseus.analysis._intervention_base import InterventionBase
from theseus.analysis.library.induction import InductionHeads
from theseus.analysis.sae import SAEBase
from theseus.experiments.models.gpt import PretrainGPT
from theseus.model.attention.base import SelfAttention
from theseus.model.models import Block
from theseus.registry import analysis, job

__all__ = ["AttentionInput", "AttentionPattern", "DemoTrainer", "Features", "HeadAblation"]


@analysis("demo/analyze/attention-input")
class AttentionInput(AnalysisBase, PretrainGPT):
    """The first attention layer's input `x[0, :64, :64]` as a token x feature heatmap."""

    TARGET = SelfAttention
    NAME = "attention-input"

    def select(self, paths: list[str]) -> str:
        return paths[0]

    def analyze(self, layer: Any, inputs: Any) -> jax.Array:
        return inputs.x[0, :64, :64]

    def plot(self, results: Any) -> Any:
        return self.heatmap(
            results,
            cmap="vlag",
            center=0,
            xlabel="Feature",
            ylabel="Token",
            title="Input of the first attention layer",
        )


@analysis("demo/analyze/attention-pattern")
class AttentionPattern(AnalysisBase, PretrainGPT):
    """The last attention layer's head-averaged probabilities on the first sequence."""

    TARGET = SelfAttention
    NAME = "attention-pattern"

    def select(self, paths: list[str]) -> str:
        return paths[-1]

    def analyze(self, layer: Any, inputs: Any) -> jax.Array:
        weights = layer.weights(inputs.x[:1, :32])  # [1, heads, query, key]
        return weights[0].mean(axis=0)

    def plot(self, results: Any) -> Any:
        future = np.triu(np.ones(results.shape, dtype=bool), k=1)  # keys a query cannot see
        return self.heatmap(
            results,
            mask=future,
            cmap="rocket_r",
            vmin=0,
            square=True,
            xlabel="Key position",
            ylabel="Query position",
            title="Attention of the last layer (mean over heads)",
        )


@analysis("demo/intervene/head-ablation")
class HeadAblation(InterventionBase, PretrainGPT):
    """The validation loss increase from zero-ablating each head of each layer."""

    TARGET = SelfAttention
    NAME = "head-ablation"

    def select(self, paths: list[str]) -> list[str]:
        return paths  # every attention layer

    def variants(self, layer: Any) -> int:
        return int(layer.config.n_head)  # every head of each

    def intervene(self, site: Any) -> jax.Array:
        return iv.ablate_head(site, site.variant)

    def plot(self, change: Any) -> Any:
        return self.heatmap(
            change,
            annot=True,
            fmt=".3f",
            cmap="rocket_r",
            xlabel="Head",
            ylabel="Layer",
            title="Loss increase when one head is zero-ablated (nats)",
        )


@analysis("demo/analyze/features")
class Features(SAEBase, PretrainGPT):
    """A top-k SAE on the residual stream after each block, trained on 2^16 tokens a node."""

    TARGET = Block
    NAME = "features"
    EXPANSION = 8
    K = 8
    TOKENS = 1 << 16

    def select(self, paths: list[str]) -> list[str]:
        return paths  # every block: one SAE each, trained from one activation pass


@job("demo/train")
class DemoTrainer(PretrainGPT):
    """`PretrainGPT` that runs both demo analyses and the induction score at validation
    cadence."""

    ANALYSIS = [AttentionInput, AttentionPattern, InductionHeads]
