"""`InContextLearning` (`library/icl`): the in-context learning score on validation data.

The mean loss at a late token position minus the mean loss at an early one (Olsson et
al., 2022: positions 500 and 50), over the validation batches' counted targets. Both
positions are 0-based and clipped to `architecture/block_size - 1`; a negative score
means later tokens are predicted better, which is what in-context learning looks like.

Values on the node: `dynamics/icl/score`, `dynamics/icl/early_loss`,
`dynamics/icl/late_loss`. The figure: the mean loss at every position with both marked.
Settings: `library/icl/early`, `library/icl/late`, `library/dataset`, `library/batches`.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import numpy as np

from theseus.analysis.library._base import LibraryAnalysis
from theseus.analysis.library._recording import Recording
from theseus.analysis.library._settings import ICLSettings
from theseus.experiments.models.gpt import PretrainGPT

__all__ = ["InContextLearning", "position_sums"]


def position_sums(recording: Recording) -> dict[str, jax.Array]:
    """The loss summed over rows at each position and how many targets counted, `[seq]`."""
    return {
        "loss": recording.token_losses().sum(axis=0),
        "count": recording.counted().sum(axis=0),
    }


def position_means(sums: Any) -> np.ndarray:
    """`[seq]` mean loss per position (NaN where no target counted)."""
    count = np.asarray(sums["count"], np.float64)
    total = np.asarray(sums["loss"], np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(count > 0, total / np.maximum(count, 1), np.nan)


class InContextLearning(LibraryAnalysis, PretrainGPT):
    """The in-context learning score: the loss at a late position minus at an early one."""

    NAME = "icl"
    DATA = "validation"
    SETTINGS = (ICLSettings,)

    @classmethod
    def prepare(cls, job: Any) -> tuple[int, int]:
        """The `(early, late)` positions, clipped to the block."""
        st = job.configure(ICLSettings)
        last = job.block_size - 1
        return min(st.early, last), min(st.late, last)

    @classmethod
    def measure(cls, aux: Any, recording: Recording) -> dict[str, jax.Array]:
        return position_sums(recording)

    @classmethod
    def summarize(cls, aux: Any, sums: Any) -> dict[str, Any]:
        """`loss [seq]` per position, `early`/`late` (positions), their losses, `score`."""
        early, late = aux
        loss = position_means(sums)
        return {
            "loss": loss,
            "early": early,
            "late": late,
            "early_loss": float(loss[early]),
            "late_loss": float(loss[late]),
            "score": float(loss[late] - loss[early]),
        }

    @classmethod
    def values(cls, results: Any) -> dict[str, float]:
        named = {
            "dynamics/icl/score": results["score"],
            "dynamics/icl/early_loss": results["early_loss"],
            "dynamics/icl/late_loss": results["late_loss"],
        }
        return {key: value for key, value in named.items() if math.isfinite(value)}

    @classmethod
    def figure(cls, results: Any) -> Any:
        from theseus.plot import line

        loss = results["loss"]
        figure = line(
            {"position": np.arange(loss.size), "loss": loss},
            x="position",
            y="loss",
            xlabel="Token position",
            ylabel="Mean loss (nats)",
            title=f"In-context learning score {results['score']:.3f} "
            f"(loss at {results['late']} - at {results['early']})",
        )
        ax = figure.axes[0]
        for position in (results["early"], results["late"]):
            ax.axvline(position, color="0.4", linestyle=":", linewidth=1)
        return figure
