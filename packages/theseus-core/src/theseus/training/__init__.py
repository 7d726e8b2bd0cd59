"""Training: the trainer, its optimizers, schedules, evaluations, data strategy, checkpoints.

Subclass ``BaseTrainer`` and declare ``MODEL``, ``DATASET``, ``OPTIMIZER``,
``SCHEDULE``, ``EVALUATION`` and ``ANALYSIS``; override ``batch``, ``forward``,
``train_step``, ``val_step`` or ``trace`` where the defaults do not fit. The
lifecycle (setup, the step loop, validation, checkpoints, ticks) is fixed.
"""

from theseus.training.base import BaseTrainer, BaseTrainerConfig, TrainerError
from theseus.training.checkpoints import (
    CheckpointKeeper,
    CheckpointMismatchError,
    checkpoint_dir,
    restore,
)
from theseus.training.evaluation import (
    Evaluation,
    Perplexity,
    PerplexityConfig,
    TandemAnalysis,
    TandemView,
)
from theseus.training.flywheel.strategy import DatasetDeclaration, Sampling
from theseus.training.local_evaluations import (
    BitsPerByte,
    BitsPerByteConfig,
    MultipleChoice,
    MultipleChoiceConfig,
)
from theseus.training.optimizers import AdamW, AdamWConfig, Optimizer
from theseus.training.schedules import WSD, Schedule, WSDConfig, constant
from theseus.training.sharding import DEFAULT_RULES, ParameterShardingContext, make_mesh

__all__ = [
    "DEFAULT_RULES",
    "WSD",
    "AdamW",
    "AdamWConfig",
    "BaseTrainer",
    "BaseTrainerConfig",
    "BitsPerByte",
    "BitsPerByteConfig",
    "CheckpointKeeper",
    "CheckpointMismatchError",
    "DatasetDeclaration",
    "Evaluation",
    "MultipleChoice",
    "MultipleChoiceConfig",
    "Optimizer",
    "ParameterShardingContext",
    "Perplexity",
    "PerplexityConfig",
    "Sampling",
    "Schedule",
    "TandemAnalysis",
    "TandemView",
    "TrainerError",
    "WSDConfig",
    "checkpoint_dir",
    "constant",
    "make_mesh",
    "restore",
]
