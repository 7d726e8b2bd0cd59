"""Validation and the evaluations that run at its cadence, on the live state.

`validate` averages `val_step` over the first `training/validation_steps` batches of
the `val` split (the same batches every time); `evaluate` runs each `EVALUATION` class
and logs its value under `eval/NAME`. Both read batches through the trainer's `batch`,
so a trainer with custom batching validates on its own data.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from theseus.data.batches import Batch
from theseus.training._steps import scalar_keys

if TYPE_CHECKING:
    from theseus.training.base import BaseTrainer

__all__ = ["evaluate", "validate", "validation_batch"]


def validate(trainer: BaseTrainer) -> dict[str, float]:
    """`val/loss` (and `val/KEY` for each scalar of `val_step`'s metadata), averaged."""
    total, count, metas = 0.0, 0, []
    for index in range(trainer.args.validation_steps):
        placed = trainer.sharding.place_batch(validation_batch(trainer, index))
        loss_sum, n, meta = trainer._compiled_val()(trainer.state, placed)
        total, count = total + float(loss_sum), count + int(n)
        metas.append(meta)
    values = {"val/loss": total / max(count, 1)}
    for key in scalar_keys(metas[0] if metas else {}):
        values[f"val/{key}"] = float(np.mean([float(m[key]) for m in metas]))
    return values


def validation_batch(trainer: BaseTrainer, index: int) -> Batch:
    """`trainer.batch("val")` for validation batch `index`.

    A trainer's `batch(slice)` override is public API with that one argument, so the
    index reaches the base method through `_val_index` for the length of this call.
    """
    trainer._val_index = index
    try:
        return trainer.batch("val")
    finally:
        trainer._val_index = 0


def evaluate(trainer: BaseTrainer) -> None:
    """Run each of `trainer.EVALUATION` and log its value(s) under `eval/NAME`."""
    for evaluation in trainer.EVALUATION:
        result = evaluation().evaluate(trainer)
        if isinstance(result, dict):
            trainer.log({f"eval/{evaluation.NAME}/{k}": float(v) for k, v in result.items()})
        else:
            trainer.log({f"eval/{evaluation.NAME}": float(result)})
