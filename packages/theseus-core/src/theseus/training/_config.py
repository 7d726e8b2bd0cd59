"""`BaseTrainerConfig`: the settings every trainer reads, as data.

Each field declares its configuration path, default and help; a trainer's `CONFIG`
extends this class with its own `field(...)`s, and `BaseTrainer.config()` composes it
with the model's, optimizer's, schedule's, evaluations' and analyses' schemas. The peak
learning rate (`optimization/lr`, `args.lr`) comes from `LearningRate`, declared with
every other `optimization/*` key in `theseus.training.optimization`.
`inspection/prompt` and `logging/comet` are the analyses' settings (theseus-analysis
declares them for analysis jobs and for trainers that run `ANALYSIS`); a file written
when every trainer declared them still loads (`RETIRED`).
`theseus.training.base` re-exports it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from theseus.config import Retired, field
from theseus.training._rules import MAX_SEED, micro_batches, one_batch
from theseus.training.optimization import LearningRate

#: Where the settings every trainer declared before they became the analyses' live now.
_ANALYSES = (
    "it is an analysis setting now, declared by theseus-analysis for analysis jobs and for "
    "trainers that run ANALYSIS in tandem"
)

__all__ = ["BaseTrainerConfig"]


@dataclass
class BaseTrainerConfig(LearningRate):
    """Settings every trainer reads (extend it with your own `field(...)`s)."""

    RETIRED: ClassVar[tuple[Retired, ...]] = (
        Retired("inspection/prompt", "", _ANALYSES),
        Retired("logging/comet", "", _ANALYSES),
    )

    batch_size: int = field(
        "training/batch_size", default=16, ge=1, help="global batch, in sequences"
    )
    per_device_batch_size: int = field(
        "training/per_device_batch_size",
        default=0,
        ge=0,
        rules=[micro_batches],
        help="sequences per device per micro-step; gradient accumulation fills the rest (0: no accumulation)",
    )
    tokens: int = field(
        "training/tokens",
        default=1_048_576,
        ge=1,
        rules=[one_batch],
        help="total training tokens (at least one batch: batch_size x block_size)",
    )
    analyze: bool = field("training/analyze", default=True, help="run ANALYSIS in tandem")
    analysis_errors: Literal["log", "raise"] = field(
        "training/analysis_errors",
        default="log",
        help="a failing tandem analysis: 'log' it and train on, or 'raise' and stop the run",
    )
    validation_steps: int = field(
        "training/validation_steps", default=4, ge=1, help="validation batches"
    )
    seed: int = field(
        "training/seed", default=0, ge=0, le=MAX_SEED, help="parameter init and dropout seed"
    )
    shard: int = field(
        "training/shard", default=1, ge=1, help="devices each parameter is split over"
    )
    strategy: Literal["dp", "zero1", "fsdp"] = field(
        "training/strategy",
        default="dp",
        help="where the state is kept: 'dp' whole on every device, 'zero1' the optimizer "
        "state split over the data-parallel devices, 'fsdp' parameters, gradients and "
        "optimizer state split",
    )
    report_interval: int = field(
        "logging/report_interval", default=10, ge=1, help="steps per report"
    )
    checkpoint_interval: int = field(
        "logging/checkpoint_interval",
        default=1000,
        ge=1,
        help="steps per checkpoint (and the last step)",
    )
    validation_interval: int = field(
        "logging/validation_interval", default=100, ge=1, help="steps per validation"
    )
    data_seed: int = field("data/seed", default=0, ge=0, le=MAX_SEED, help="seed of the batch plan")
