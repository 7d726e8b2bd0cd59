"""`InductionHeads` (`library/induction`): each head's induction and previous-token score.

On rows of random tokens repeated twice (`t_0 .. t_{n-1} t_0 .. t_{n-1}`), each head's
attention probabilities (`SelfAttention.weights`, the reference computation) give:

- the **induction score**: the mean, over rows and the second half's queries
  `q = n .. 2n-1`, of the attention from `q` to `q - n + 1`, the token after the
  previous occurrence of the current token (a head that copies what came next last
  time scores near 1);
- the **previous-token score**: the mean, over rows and queries `q = 1 .. 2n-1`, of the
  attention from `q` to `q - 1`.

Values on the node: `dynamics/induction/L{l}H{h}` and `dynamics/previous_token/L{l}H{h}`
(layer `l`, head `h`, from 0), their maxima `dynamics/induction/max` and
`dynamics/previous_token/max`, and the model's loss on the first and the second half
(`dynamics/induction/first_half_loss`, `dynamics/induction/second_half_loss`: a model
with induction heads predicts the repeat). The figure: both scores as layer x head
heatmaps. Settings: `library/induction/length`, `rows`, `seed`, `tokens` (with `data`,
the ids of `library/dataset` or the trainer's data).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from theseus.analysis.library._base import LibraryAnalysis
from theseus.analysis.library._recording import Recording
from theseus.analysis.library._settings import InductionSettings, ValidationSettings
from theseus.experiments.models.gpt import PretrainGPT

__all__ = ["InductionHeads", "head_scores"]


def head_scores(weights: jax.Array) -> tuple[jax.Array, jax.Array]:
    """`(induction, previous_token)` scores `[heads]` of one layer's probabilities
    `weights [batch, heads, 2n, 2n]` on rows repeated twice (see the module docstring)."""
    seq = weights.shape[-1]
    n = seq // 2
    later = jnp.arange(n, seq)
    after = jnp.arange(1, seq)
    induction = weights[:, :, later, later - n + 1].mean(axis=(0, 2))
    previous = weights[:, :, after, after - 1].mean(axis=(0, 2))
    return induction, previous


class InductionHeads(LibraryAnalysis, PretrainGPT):
    """Each head's induction and previous-token score on random tokens repeated twice."""

    NAME = "induction"
    DATA = "repeated"
    READS = frozenset({"attention"})
    # ValidationSettings: with library/induction/tokens=data, the ids of the data it names
    SETTINGS = (InductionSettings, ValidationSettings)

    @classmethod
    def measure(cls, aux: Any, recording: Recording) -> dict[str, jax.Array]:
        scores = [head_scores(recording.weights(i)) for i in range(len(recording.attentions))]
        losses, counted = recording.token_losses(), recording.counted()
        n = losses.shape[1] // 2
        first = (losses[:, : n - 1].sum(), counted[:, : n - 1].sum())
        second = (losses[:, n:].sum(), counted[:, n:].sum())
        return {
            "induction": jnp.stack([s[0] for s in scores]),
            "previous_token": jnp.stack([s[1] for s in scores]),
            "first_half_loss": first[0] / jnp.maximum(first[1], 1),
            "second_half_loss": second[0] / jnp.maximum(second[1], 1),
        }

    @classmethod
    def summarize(cls, aux: Any, sums: Any) -> dict[str, Any]:
        """`induction`, `previous_token` `[layers, heads]`; the two halves' losses."""
        return {
            "induction": np.asarray(sums["induction"], np.float64),
            "previous_token": np.asarray(sums["previous_token"], np.float64),
            "first_half_loss": float(sums["first_half_loss"]),
            "second_half_loss": float(sums["second_half_loss"]),
        }

    @classmethod
    def values(cls, results: Any) -> dict[str, float]:
        out: dict[str, float] = {}
        for kind in ("induction", "previous_token"):
            scores = results[kind]
            for (layer, head), score in np.ndenumerate(scores):
                out[f"dynamics/{kind}/L{layer}H{head}"] = float(score)
            out[f"dynamics/{kind}/max"] = float(scores.max())
        for half in ("first_half_loss", "second_half_loss"):
            out[f"dynamics/induction/{half}"] = results[half]
        return out

    @classmethod
    def figure(cls, results: Any) -> Any:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        from theseus.plot import heatmap, theme

        layers, heads = results["induction"].shape
        with theme():
            figure = Figure(figsize=(4.0 + 0.9 * heads, 1.2 + 0.45 * layers), layout="constrained")
            FigureCanvasAgg(figure)
            left, right = figure.subplots(1, 2)
            for ax, kind, title in (
                (left, "induction", "Induction score"),
                (right, "previous_token", "Previous-token score"),
            ):
                heatmap(
                    results[kind],
                    ax=ax,
                    vmin=0,
                    vmax=1,
                    cmap="rocket_r",
                    annot=heads * layers <= 64,
                    fmt=".2f",
                    xlabel="Head",
                    ylabel="Layer",
                    title=title,
                )
        return figure
