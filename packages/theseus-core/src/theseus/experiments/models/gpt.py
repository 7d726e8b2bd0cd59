"""GPT pretraining on the offline synthetic language (`gpt/train/pretrain`)."""

from __future__ import annotations

from theseus.data.datasets import Synthetic
from theseus.model.models import GPT
from theseus.registry import job
from theseus.training.base import BaseTrainer, BaseTrainerConfig
from theseus.training.flywheel.strategy import Sampling
from theseus.training.optimizers import AdamW
from theseus.training.schedules import WSD

__all__ = ["PretrainGPT"]


@job("gpt/train/pretrain")
class PretrainGPT(BaseTrainer):
    """Pretrain a GPT on prepared data (default: `synthetic`; prepare it first)."""

    CONFIG = BaseTrainerConfig
    MODEL = GPT
    DATASET = Sampling(Synthetic, 1.0, "pmd")
    OPTIMIZER = AdamW
    SCHEDULE = WSD
    EVALUATION = []
    ANALYSIS = []
