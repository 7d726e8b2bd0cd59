"""How a trainer's `DATASET` declaration becomes a batch plan.

`DATASET` is a dataset class, a `Sampling(dataset, rate, style)`, or a list of either
(rates must sum to 1); `[]` means the trainer overrides `batch()` itself.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from theseus.config import ConfigError, ConfigTypeError
from theseus.data.batches import MixturePlan, Style
from theseus.data.datasets import Dataset

__all__ = ["DatasetDeclaration", "Sampling", "plan"]


@dataclass(frozen=True)
class Sampling:
    """Draw a share `rate` of each batch's rows from `dataset`, in `style`.

    Args:
        dataset: a prepared dataset class (`Synthetic`, `FineWeb`, ...).
        rate: its share of rows, between 0 and 1.
        style: `"pmd"` samples contiguous windows of the token stream; `"padded"`
            takes one document per row, padded after its end.
    """

    dataset: type[Dataset]
    rate: float = 1.0
    style: Style = "pmd"

    def __post_init__(self) -> None:
        if not (isinstance(self.dataset, type) and issubclass(self.dataset, Dataset)):
            raise ConfigTypeError(
                f"Sampling needs a dataset class such as Synthetic or FineWeb, got {self.dataset!r}"
            )
        if not 0.0 <= self.rate <= 1.0:
            raise ConfigError(f"Sampling rate must be between 0 and 1, got {self.rate}")
        if self.style not in ("pmd", "padded"):
            raise ConfigError(f"unknown sampling style {self.style!r}; use 'pmd' or 'padded'")


DatasetDeclaration = type[Dataset] | Sampling | Sequence[Any]


def normalize(declaration: DatasetDeclaration) -> list[Sampling]:
    """The declaration as a list of `Sampling` (a bare class samples at rate 1 in `pmd`)."""
    items: list[Any] = list(declaration) if isinstance(declaration, list | tuple) else [declaration]
    out = [item if isinstance(item, Sampling) else Sampling(item) for item in items]
    if out:
        total = sum(s.rate for s in out)
        if abs(total - 1.0) > 1e-6:
            listing = ", ".join(f"{s.dataset.__name__}={s.rate:g}" for s in out)
            raise ConfigError(
                f"DATASET sampling rates must sum to 1, got {listing} (sum {total:g})"
            )
    return out


def plan(
    declaration: DatasetDeclaration,
    root: str | os.PathLike[str],
    seed: int,
    tokenizer: str | None = None,
) -> MixturePlan | None:
    """Open every declared dataset under `root` and return the batch plan (None for `[]`).

    `tokenizer` is the model's (`architecture/tokenizer`): the command that prepares a
    missing dataset names it (see `Dataset.open`).

    Raises:
        DataNotPreparedError: a declared dataset has not been prepared under `root`.
        ValueError: the rates do not sum to 1.
    """
    samplings = normalize(declaration)
    if not samplings:
        return None
    return MixturePlan(
        [s.dataset.open(root, tokenizer=tokenizer) for s in samplings],
        [s.rate for s in samplings],
        [s.style for s in samplings],
        seed=seed,
    )
