"""`LossByPosition` (`library/loss-by-position`): the validation loss at each token position.

The mean loss over the validation batches' counted targets at each position of the
block. Values on the node, one per power-of-two span of positions (`P0`: position 0,
`P1`: 1, `P2`: 2-3, `P4`: 4-7, ...; each the mean over the span's targets):
`dynamics/loss_by_position/P{first}`. The figure: the loss at every position.
Settings: `library/dataset`, `library/batches`.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import numpy as np

from theseus.analysis.library._base import LibraryAnalysis
from theseus.analysis.library._recording import Recording
from theseus.analysis.library._settings import ValidationSettings
from theseus.analysis.library.icl import position_means, position_sums
from theseus.experiments.models.gpt import PretrainGPT

__all__ = ["LossByPosition", "spans"]


def spans(seq: int) -> list[tuple[int, int]]:
    """`[(first, end), ...]`: position 0, then the spans `[2^k, 2^(k+1))` cut at `seq`."""
    out, first = [(0, 1)], 1
    while first < seq:
        out.append((first, min(2 * first, seq)))
        first *= 2
    return [(a, b) for a, b in out if a < seq]


class LossByPosition(LibraryAnalysis, PretrainGPT):
    """The mean validation loss at each token position of the block."""

    NAME = "loss-by-position"
    DATA = "validation"
    SETTINGS = (ValidationSettings,)

    @classmethod
    def measure(cls, aux: Any, recording: Recording) -> dict[str, jax.Array]:
        return position_sums(recording)

    @classmethod
    def summarize(cls, aux: Any, sums: Any) -> dict[str, Any]:
        """`loss [seq]` per position and `spans`: `{first: mean over the span}`."""
        total = np.asarray(sums["loss"], np.float64)
        count = np.asarray(sums["count"], np.float64)
        spanned = {}
        for first, end in spans(total.size):
            n = count[first:end].sum()
            spanned[first] = float(total[first:end].sum() / n) if n else math.nan
        return {"loss": position_means(sums), "spans": spanned}

    @classmethod
    def values(cls, results: Any) -> dict[str, float]:
        return {
            f"dynamics/loss_by_position/P{first}": value
            for first, value in results["spans"].items()
            if math.isfinite(value)
        }

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
            title="Validation loss by position",
        )
        figure.axes[0].set_xscale("symlog", linthresh=1)
        return figure
