"""Validation and the evaluations that run at its cadence, on the live state.

`validate` averages the compiled `val_step` over the first `training/validation_steps`
batches of the `val` split (the same batches every time); `evaluate` runs each
`EVALUATION` class and logs its value under `eval/NAME`. The loop hands them what they
use: how to read a validation batch (the trainer's `batch("val")`, so a trainer with
custom batching validates on its own data), how to run `val_step` on it, and where to
log.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from theseus.data.batches import Batch
from theseus.training._steps import scalar_keys

__all__ = ["evaluate", "validate"]

#: `run(rows) -> (loss_sum, count, meta)`: the compiled `val_step` on host rows, placed.
ValStep = Callable[[Batch], tuple[Any, Any, dict[str, Any]]]


def validate(read: Callable[[int], Batch], steps: int, run: ValStep) -> dict[str, float]:
    """`val/loss` (and `val/KEY` for each scalar of `val_step`'s metadata), averaged.

    Args:
        read: the host rows of validation batch `index` (`[rows, block_size]` arrays).
        steps: how many batches (`training/validation_steps`).
        run: `val_step` on those rows: the loss summed over counted targets, their
            count, and the metadata.

    Returns:
        `val/loss` = the summed losses over the summed counts (0 targets count as 1);
        each scalar `KEY` of the metadata, the mean over the batches, as `val/KEY`.
    """
    total, count, metas = 0.0, 0, []
    for index in range(steps):
        loss_sum, n, meta = run(read(index))
        total, count = total + float(loss_sum), count + int(n)
        metas.append(meta)
    values = {"val/loss": total / max(count, 1)}
    for key in scalar_keys(metas[0] if metas else {}):
        values[f"val/{key}"] = float(np.mean([float(m[key]) for m in metas]))
    return values


def evaluate(
    evaluations: Sequence[Any], trainer: Any, log: Callable[[dict[str, Any]], None]
) -> None:
    """Run each of `evaluations` (classes) on `trainer` and `log` its value(s) under `eval/NAME`."""
    for evaluation in evaluations:
        result = evaluation().evaluate(trainer)
        if isinstance(result, dict):
            log({f"eval/{evaluation.NAME}/{k}": float(v) for k, v in result.items()})
        else:
            log({f"eval/{evaluation.NAME}": float(result)})
