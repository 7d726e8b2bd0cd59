"""The library's settings: configuration keys under `library/`, one schema per analysis.

A path is one global setting, so the keys two analyses share are declared once:
`library/dataset` in `DataSettings`, which every schema that reads the training data
extends (`ValidationSettings`, and `InductionSettings`, whose `tokens = data` draws from
it), and `library/batches` in `ValidationSettings`, which the analyses that read
validation data extend. `theseus configure` writes each with its default and help;
`library.icl.late=256` overrides one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from theseus.config import field

__all__ = [
    "FIRST",
    "DataSettings",
    "FrequencySettings",
    "ICLSettings",
    "InductionSettings",
    "SetSettings",
    "ValidationSettings",
]


@dataclass(frozen=True)
class DataSettings:
    """The data the library reads: validation batches, and the ids the training data uses."""

    dataset: str = field(
        "library/dataset",
        default="",
        help="a prepared dataset (synthetic, text, fineweb, ...) the validation analyses "
        "read (and library/induction/tokens = data draws from); empty: the trainer's own "
        "data. Set it for an imported model (text prepared with its tokenizer)",
    )


@dataclass(frozen=True)
class ValidationSettings(DataSettings):
    """Where the analyses that read validation data read it, and how much of it."""

    batches: int = field(
        "library/batches",
        default=4,
        help="validation batches the validation analyses read at each node (the batches "
        "validate() reads first, the same at every node)",
        ge=1,
    )


@dataclass(frozen=True)
class InductionSettings(DataSettings):
    """The batch of random tokens repeated twice that the head scores read (`dataset`:
    where `tokens = data` finds the ids the training data uses)."""

    length: int = field(
        "library/induction/length",
        default=64,
        help="random tokens per half (the row is twice as long; clipped to half of "
        "architecture/block_size)",
        ge=2,
    )
    rows: int = field(
        "library/induction/rows",
        default=8,
        help="rows of repeated random tokens (rounded up to a multiple of the "
        "data-parallel devices)",
        ge=1,
    )
    seed: int = field(
        "library/induction/seed",
        default=0,
        help="the random tokens' seed (the same tokens at every node)",
        unbounded=True,
    )
    tokens: Literal["vocabulary", "data"] = field(
        "library/induction/tokens",
        default="vocabulary",
        help="draw the random tokens from the whole vocabulary, or from the ids the "
        "training data uses (a model trained on a few of its ids, like the demo's)",
    )


@dataclass(frozen=True)
class ICLSettings(ValidationSettings):
    """The two positions whose losses the in-context learning score compares."""

    early: int = field(
        "library/icl/early",
        default=50,
        help="the early token position (0-based; clipped to architecture/block_size - 1)",
        ge=0,
    )
    late: int = field(
        "library/icl/late",
        default=500,
        help="the late token position (0-based; clipped to architecture/block_size - 1)",
        ge=0,
    )


@dataclass(frozen=True)
class FrequencySettings(ValidationSettings):
    """How the vocabulary is split by how often each token occurs in the training data."""

    buckets: int = field(
        "library/frequency/buckets",
        default=4,
        help="frequency buckets, each holding an equal share of the training tokens "
        "(F0: the most frequent token types)",
        ge=1,
    )


#: The analyses `FirstAnalyses` runs by default (their `NAME`s).
FIRST = ("induction", "icl", "logit-lens", "loss-by-position", "loss-by-frequency")


@dataclass(frozen=True)
class SetSettings:
    """Which of the library's analyses `FirstAnalyses` runs in its one program."""

    analyses: list[str] = field(
        "library/analyses",
        default_factory=lambda: list(FIRST),
        help="the analyses run together, one forward per batch kind at each node (their "
        "names: " + ", ".join(FIRST) + "), and beside them, on the same checkpoint, drift "
        "and memorization",
    )
