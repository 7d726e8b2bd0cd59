"""Evaluations and tandem analyses: what a trainer runs at validation cadence.

An evaluation is a class with a `NAME`, an optional settings `CONFIG`, and
`evaluate(trainer) -> float | dict[str, float]`; its results are recorded on the
trainer's node as `eval/<NAME>` (or `eval/<NAME>/<key>`). A tandem analysis is anything
that satisfies `TandemAnalysis` (theseus-analysis implements it; core never imports it).
"""

from __future__ import annotations

import abc
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, runtime_checkable

from theseus.config import field
from theseus.data.batches import MixturePlan
from theseus.registry import DATASETS

__all__ = ["Evaluation", "Perplexity", "PerplexityConfig", "TandemAnalysis", "TandemView"]


@runtime_checkable
class TandemView(Protocol):
    """A borrowed view of an analysis that runs on the trainer's node and state."""

    def run(self, background: bool = False) -> Any:
        """Inspect the trainer's current state and record the result on its node.

        With `background`, only the computation happens before it returns; plotting,
        writing and recording run on a thread of the view's, in call order.
        """
        ...

    def drain(self) -> None:
        """Wait until everything `run(background=True)` started is recorded."""
        ...

    def close(self) -> None:
        """Record what is pending and release what the view holds (the trainer calls
        it when it finishes)."""
        ...


@runtime_checkable
class TandemAnalysis(Protocol):
    """An analysis class a trainer lists in `ANALYSIS`."""

    NAME: ClassVar[str]

    @classmethod
    def analysis_config(cls) -> Sequence[type]:
        """The configuration classes the analysis reads beyond its trainer's; the trainer
        composes them into its own configuration (`BaseTrainer.config()`)."""
        ...

    @classmethod
    def from_trainer(cls, trainer: Any) -> TandemView:
        """A view that shares `trainer`'s node and state and never sets up or ticks."""
        ...


class Evaluation(abc.ABC):
    """Interface of evaluations: set `NAME` (and `CONFIG`), implement `evaluate`."""

    NAME: ClassVar[str]
    CONFIG: ClassVar[type | None] = None

    @abc.abstractmethod
    def evaluate(self, trainer: Any) -> float | dict[str, float]:
        """Measure `trainer`'s current state; called on every host at validation cadence.

        `trainer` is the `BaseTrainer` that validates (this module does not import it:
        the trainer imports its evaluations). Its public methods serve an evaluation:
        `evaluate_batch(rows)`, `batch_geometry()`, `configure(...)`, `model`, `state`,
        `tokenizer`.
        """


@dataclass(frozen=True)
class PerplexityConfig:
    """Settings of the built-in perplexity evaluation."""

    dataset: str = field(
        "evaluation/perplexity/dataset", default="synthetic", help="prepared dataset to score"
    )
    batches: int = field("evaluation/perplexity/batches", default=4, ge=1, help="held-out batches")


class Perplexity(Evaluation):
    """`exp(mean loss)` on a prepared dataset's held-out (`val`) split.

    The batches are the first `evaluation/perplexity/batches` of the held-out plan, the
    same at every evaluation, so values are comparable across a run.
    """

    NAME = "perplexity"
    CONFIG = PerplexityConfig

    def evaluate(self, trainer: Any) -> float:
        cfg = trainer.configure(PerplexityConfig)
        data = DATASETS[cfg.dataset].open(trainer.spec.root)  # type: ignore[attr-defined]
        plan = MixturePlan([data], [1.0], ["pmd"], seed=trainer.args.data_seed)
        total, count = 0.0, 0
        for index in range(cfg.batches):
            rows = plan.batch(index, "val", **trainer.batch_geometry())
            loss_sum, n = trainer.evaluate_batch(rows)
            total, count = total + loss_sum, count + n
        return math.exp(total / max(count, 1))
