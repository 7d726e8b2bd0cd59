"""`LossByFrequency` (`library/loss-by-frequency`): the validation loss by how frequent the
target token is in the training data.

The training data's token counts (each dataset's `train` split, weighted by its
sampling rate) order the vocabulary from the most to the least frequent type; it is cut
into `library/frequency/buckets` buckets that each hold an equal share of the training
tokens (`F0`: the few most frequent types, the last: the long tail and the types the
data never uses). The loss over the validation batches' counted targets is averaged
per bucket of the target token.

Values on the node: `dynamics/loss_by_frequency/F{b}`. The figure: a bar per bucket,
labelled with how many types it holds. Settings: `library/frequency/buckets`,
`library/dataset`, `library/batches`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from theseus.analysis.library._base import LibraryAnalysis
from theseus.analysis.library._data import frequency_buckets
from theseus.analysis.library._recording import Recording
from theseus.analysis.library._settings import FrequencySettings
from theseus.experiments.models.gpt import PretrainGPT

__all__ = ["Buckets", "LossByFrequency"]


@dataclass(frozen=True)
class Buckets:
    """The vocabulary's frequency buckets.

    Attributes:
        of: each token id's bucket `[vocab]` int32 (0: the most frequent).
        types: how many token types each bucket holds `[buckets]`.
        share: each bucket's share of the training tokens `[buckets]`.
        unused: how many types the training data never uses (all in the last bucket).
    """

    of: np.ndarray
    types: np.ndarray
    share: np.ndarray
    unused: int


class LossByFrequency(LibraryAnalysis, PretrainGPT):
    """The mean validation loss per frequency bucket of the target token."""

    NAME = "loss-by-frequency"
    DATA = "validation"
    SETTINGS = (FrequencySettings,)

    @classmethod
    def prepare(cls, job: Any) -> Buckets:
        """The buckets from the training data's token counts (read once)."""
        st = job.configure(FrequencySettings)
        shares = job.token_shares()
        of = frequency_buckets(shares, st.buckets)
        types = np.bincount(of, minlength=st.buckets)
        share = np.bincount(of, weights=shares, minlength=st.buckets)
        return Buckets(of, types, share, int(np.sum(shares == 0)))

    @classmethod
    def measure(cls, aux: Any, recording: Recording) -> dict[str, jax.Array]:
        counted = recording.counted()
        bucket = jnp.asarray(aux.of)[jnp.where(counted, recording.batch["y"], 0)]
        buckets = aux.types.size
        losses = recording.token_losses()
        return {
            "loss": jnp.zeros(buckets, jnp.float32).at[bucket].add(losses),
            "count": jnp.zeros(buckets, jnp.int32).at[bucket].add(counted.astype(jnp.int32)),
        }

    @classmethod
    def summarize(cls, aux: Any, sums: Any) -> dict[str, Any]:
        """`loss [buckets]` (NaN for a bucket no target fell in), `count`, `types`, `share`,
        `unused`."""
        count = np.asarray(sums["count"], np.float64)
        with np.errstate(invalid="ignore", divide="ignore"):
            loss = np.where(count > 0, np.asarray(sums["loss"], np.float64) / count, np.nan)
        return {
            "loss": loss,
            "count": count,
            "types": aux.types,
            "share": aux.share,
            "unused": aux.unused,
        }

    @classmethod
    def values(cls, results: Any) -> dict[str, float]:
        return {
            f"dynamics/loss_by_frequency/F{b}": float(loss)
            for b, loss in enumerate(results["loss"])
            if math.isfinite(loss)
        }

    @classmethod
    def figure(cls, results: Any) -> Any:
        from theseus.plot import bar

        types = [int(t) for t in results["types"]]
        types[-1] -= int(results["unused"])  # the unused ones are said apart
        labels = [f"F{b}\n{t} types" for b, t in enumerate(types)]
        if results["unused"]:
            labels[-1] += f"\n(+{int(results['unused'])} unused)"
        return bar(
            {"bucket": labels, "loss": np.nan_to_num(results["loss"])},
            x="bucket",
            y="loss",
            errorbar=None,
            xlabel="Frequency bucket of the target token (F0: most frequent)",
            ylabel="Mean loss (nats)",
            title="Validation loss by token frequency",
        )
