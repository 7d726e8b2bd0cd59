"""Every `optimization/*` setting, declared once: the learning rate, AdamW's and WSD's.

This module is the one declaration table of the optimizer's and the schedule's keys:
each key's type, default, range, help and the rule across keys is written here and
nowhere else, and that declaration is the only check (a configuration checks it as
values arrive, `Optimizer.build` and `Schedule.build` check settings made in Python
with `theseus.config.check_settings`). The table is split by who reads it, so a
trainer composes only the keys its declarations use:

    LearningRate  optimization/lr                                   every trainer (a
                                                                    `BaseTrainerConfig`)
    AdamWConfig   optimization/{weight_decay,beta1,beta2,eps,clip_norm}  OPTIMIZER = AdamW
    WSDConfig     optimization/schedule/{warmup,stable,decay,final_ratio} SCHEDULE = WSD

The keys are the ones earlier versions declared (in `BaseTrainerConfig`,
`optimizers.py` and `schedules.py`), so files, saved configurations and checkpoints
load unchanged. `theseus.training.optimizers` and `theseus.training.schedules` pair
these schemas with their factories (and still export `AdamWConfig` and `WSDConfig`).

    >>> from theseus.config import Tree
    >>> tree = Tree.of(WSDConfig)
    >>> tree.update({"optimization/schedule/warmup": 0.9})
    >>> tree.check()
    Traceback (most recent call last):
    ...
    theseus.config._errors.ConfigRangeError: Configuration values for 'optimization/schedule/{warmup,stable,decay}' must sum to 1 (fractions of the run); got 0.9 + 0.75 + 0.2 = 1.85. Change them to sum to 1, e.g. `optimization.schedule.stable=0 optimization.schedule.decay=0.1`.
"""

from __future__ import annotations

from dataclasses import dataclass

from theseus.config import field, rule

__all__ = ["AdamWConfig", "LearningRate", "WSDConfig", "fractions"]

#: How far from 1 the schedule's three fractions may sum (floating-point slack).
TOLERANCE = 1e-6


@dataclass
class LearningRate:
    """The peak learning rate (constant when the trainer's `SCHEDULE` is None)."""

    lr: float = field("optimization/lr", default=1e-3, gt=0, help="peak learning rate")


@dataclass(frozen=True)
class AdamWConfig:
    """Settings of AdamW with decoupled weight decay and global-norm clipping."""

    weight_decay: float = field(
        "optimization/weight_decay", default=0.1, ge=0, help="decoupled weight decay"
    )
    beta1: float = field("optimization/beta1", default=0.9, ge=0, lt=1, help="first-moment decay")
    beta2: float = field("optimization/beta2", default=0.95, ge=0, lt=1, help="second-moment decay")
    eps: float = field("optimization/eps", default=1e-8, gt=0, help="denominator epsilon")
    clip_norm: float = field(
        "optimization/clip_norm",
        default=1.0,
        ge=0,
        help="clip gradients to this global norm (0: off)",
    )


def _fitted(warmup: float, decay: float) -> dict[str, float]:
    """Phases that sum to 1 and keep `warmup` (and `decay` where it still fits)."""
    if warmup + decay <= 1.0:
        return {"stable": 1.0 - warmup - decay}
    return {"stable": 0.0, "decay": 1.0 - warmup}


def _written(value: float) -> str:
    """A fraction as `key=value` takes it, rounded to 1e-9 (well inside the rule's slack)."""
    return f"{round(value, 9) + 0.0:.9g}"  # + 0.0: never "-0"


@rule("optimization/schedule/warmup", "optimization/schedule/stable", "optimization/schedule/decay")
def fractions(warmup: float, stable: float, decay: float) -> str | None:
    """The three phases of a warmup-stable-decay schedule cover the run: they sum to 1.

    The message suggests the closest phases that do (the warmup kept; the stable phase,
    and the decay where the warmup leaves too little room, made to fit), which the
    configuration then accepts.
    """
    total = warmup + stable + decay
    if abs(total - 1.0) <= TOLERANCE:
        return None
    suggestion = " ".join(
        f"optimization.schedule.{key}={_written(value)}"
        for key, value in _fitted(warmup, decay).items()
    )
    return (
        "Configuration values for 'optimization/schedule/{warmup,stable,decay}' must sum to 1 "
        f"(fractions of the run); got {warmup:g} + {stable:g} + {decay:g} = {total:g}. Change "
        f"them to sum to 1, e.g. `{suggestion}`."
    )


@dataclass(frozen=True)
class WSDConfig:
    """Warmup-stable-decay: fractions of the run spent in each phase (they sum to 1)."""

    warmup: float = field(
        "optimization/schedule/warmup",
        default=0.05,
        ge=0,
        le=1,
        rules=[fractions],
        help="fraction warming up",
    )
    stable: float = field(
        "optimization/schedule/stable", default=0.75, ge=0, le=1, help="fraction at peak"
    )
    decay: float = field(
        "optimization/schedule/decay", default=0.2, ge=0, le=1, help="fraction decaying"
    )
    final_ratio: float = field(
        "optimization/schedule/final_ratio", default=0.0, ge=0, le=1, help="final lr / peak lr"
    )
