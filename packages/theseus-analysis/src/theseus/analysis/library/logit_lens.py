"""`LogitLens` (`library/logit-lens`): what each layer's residual stream predicts.

Each residual stream (the embeddings, then each block's output) goes through the
model's own final norm and unembedding (`GPT.unembed`); over the validation batches'
counted targets, the analysis averages the next-token loss of those logits and the KL
divergence `KL(final || layer)` from the model's final distribution to theirs. The last
block's stream is the model's own output: its loss is the model's loss, its KL 0.

Each layer's logits `[seq, vocab]` are made one row at a time (`lax.map` over layers
and rows), so a large vocabulary never holds more than one row's logits per layer.

Values on the node: `dynamics/logit_lens/embed/loss` and `.../kl` (before any block),
`dynamics/logit_lens/L{l}/loss` and `.../kl` (after block `l`, from 0). The figure:
both against the layer, on an axis from 0 to at least the loss of uniform guessing
(`ln vocab_size`, drawn as a dotted line) with the legend beside it, so that the time
slider's frames of one lineage share their scale while they step through training.
Settings: `library/dataset`, `library/batches`.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from theseus.analysis.library._base import LibraryAnalysis
from theseus.analysis.library._recording import Recording
from theseus.analysis.library._settings import ValidationSettings
from theseus.experiments.models.gpt import PretrainGPT

__all__ = ["LogitLens", "layer_names"]


def layer_names(layers: int) -> list[str]:
    """The residual streams' names: `embed`, then `L0 .. L{layers - 1}`."""
    return ["embed", *(f"L{i}" for i in range(layers))]


class LogitLens(LibraryAnalysis, PretrainGPT):
    """Each layer's residual stream through the final norm and unembedding: loss and KL."""

    NAME = "logit-lens"
    DATA = "validation"
    READS = frozenset({"residual"})
    SETTINGS = (ValidationSettings,)

    @classmethod
    def prepare(cls, job: Any) -> dict[str, float]:
        """`uniform`: the loss of uniform guessing over the model's outputs, `ln vocab_size`."""
        return {"uniform": math.log(int(job.configuration["architecture/vocab_size"]))}

    @classmethod
    def measure(cls, aux: Any, recording: Recording) -> dict[str, jax.Array]:
        counted = recording.counted()
        targets = jnp.where(counted, recording.batch["y"], 0)

        def row(args: tuple[jax.Array, ...]) -> tuple[jax.Array, jax.Array]:
            h, final, y, keep = args  # [seq, n_embd], [seq, vocab], [seq], [seq]
            logp = jax.nn.log_softmax(recording.unembed(h[None])[0].astype(jnp.float32))
            final = jax.nn.log_softmax(final.astype(jnp.float32))
            nll = -jnp.take_along_axis(logp, y[:, None], axis=-1)[:, 0]
            kl = jnp.sum(jnp.exp(final) * (final - logp), axis=-1)
            return jnp.where(keep, nll, 0.0).sum(), jnp.where(keep, kl, 0.0).sum()

        def layer(h: jax.Array) -> tuple[jax.Array, jax.Array]:
            loss, kl = jax.lax.map(row, (h, recording.logits, targets, counted))
            return loss.sum(), kl.sum()

        loss, kl = jax.lax.map(layer, recording.residuals())  # [layers + 1] each
        count = counted.sum()
        return {"loss": loss, "kl": kl, "count": count, "model_loss": recording.loss * count}

    @classmethod
    def summarize(cls, aux: Any, sums: Any) -> dict[str, Any]:
        """`layers` (names), `loss` and `kl` `[layers + 1]`, `model_loss` (the model's
        own mean loss over the same targets) and `uniform` (`ln vocab_size`)."""
        count = float(sums["count"])
        per = max(count, 1.0)
        loss = np.asarray(sums["loss"], np.float64) / per
        return {
            "layers": layer_names(loss.size - 1),
            "loss": loss if count else np.full_like(loss, np.nan),
            "kl": np.asarray(sums["kl"], np.float64) / per,
            "model_loss": float(sums["model_loss"]) / per if count else math.nan,
            "uniform": float(aux["uniform"]),
        }

    @classmethod
    def values(cls, results: Any) -> dict[str, float]:
        out = {}
        for name, loss, kl in zip(results["layers"], results["loss"], results["kl"], strict=True):
            if math.isfinite(loss):
                out[f"dynamics/logit_lens/{name}/loss"] = float(loss)
                out[f"dynamics/logit_lens/{name}/kl"] = float(kl)
        return out

    @classmethod
    def figure(cls, results: Any) -> Any:
        from theseus.plot import line, theme

        layers = results["layers"]
        index = list(range(len(layers)))
        with theme():  # the legend and the line below drawn in the theme too
            figure = line(
                {
                    "layer": index * 2,
                    "nats": [*results["loss"], *results["kl"]],
                    "measure": ["loss"] * len(index) + ["KL(final || layer)"] * len(index),
                },
                x="layer",
                y="nats",
                hue="measure",
                marker="o",
                xlabel="Residual stream",
                ylabel="Nats",
                title="Logit lens",
            )
            ax = figure.axes[0]
            ax.set_xticks(index, layers)
            uniform = results["uniform"]
            ax.axhline(
                uniform, color="0.45", linestyle=":", linewidth=1.2, label="uniform guessing"
            )
            # One scale at every node: 0 to uniform guessing, unless a value lies above it.
            drawn = np.concatenate([results["loss"], results["kl"]])
            top = max(uniform, float(np.nanmax(drawn, initial=0.0))) * 1.05
            ax.set_ylim(-0.03 * top, top)
            ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), title=None)
        return figure
