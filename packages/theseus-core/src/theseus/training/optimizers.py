"""Optimizers as data: a settings dataclass paired with a factory.

A trainer declares `OPTIMIZER = AdamW`; the trainer composes `AdamW.config` into its
configuration and calls `AdamW.build(settings, learning_rate)` to get an optax
transformation. The settings' declaration is their only check (`build` holds settings
made in Python to it); AdamW's are declared in `theseus.training.optimization` with
every other `optimization/*` key. A new optimizer is a dataclass and a function, no
subclass:

    >>> from dataclasses import dataclass
    >>> import optax
    >>> from theseus.config import field
    >>> @dataclass(frozen=True)
    ... class SGDConfig:
    ...     momentum: float = field("optimization/momentum", default=0.9)
    >>> SGD = Optimizer("sgd", SGDConfig, lambda cfg, lr: optax.sgd(lr, momentum=cfg.momentum))
    >>> SGD.config is SGDConfig
    True
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import optax

from theseus.config import ConfigTypeError, check_settings
from theseus.training.optimization import AdamWConfig

__all__ = ["AdamW", "AdamWConfig", "Optimizer"]

C = TypeVar("C")


@dataclass(frozen=True)
class Optimizer(Generic[C]):
    """A named optimizer: its settings schema and `factory(settings, learning_rate)`."""

    name: str
    config: type[C]
    factory: Callable[[C, optax.ScalarOrSchedule], optax.GradientTransformation]

    def build(
        self, settings: C, learning_rate: optax.ScalarOrSchedule
    ) -> optax.GradientTransformation:
        """The optax transformation for `settings` and a learning rate or schedule.

        Raises:
            ConfigTypeError: `settings` is not an instance of `config`.
            ConfigRangeError: a value its declaration does not admit (the message a
                configuration gives).
        """
        if not isinstance(settings, self.config):
            raise ConfigTypeError(
                f"optimizer {self.name!r} expects settings of type {self.config.__name__}, "
                f"got {type(settings).__name__}"
            )
        check_settings(settings)
        return self.factory(settings, learning_rate)


def _decay_mask(params: Any) -> Any:
    """Decay matrices only: biases, norm scales (rank < 2) are left alone."""
    import jax

    return jax.tree_util.tree_map(lambda p: getattr(p, "ndim", 0) >= 2, params)


def _adamw(cfg: AdamWConfig, learning_rate: optax.ScalarOrSchedule) -> optax.GradientTransformation:
    adamw = optax.adamw(
        learning_rate,
        b1=cfg.beta1,
        b2=cfg.beta2,
        eps=cfg.eps,
        weight_decay=cfg.weight_decay,
        mask=_decay_mask,
    )
    if cfg.clip_norm == 0:
        return adamw
    return optax.chain(optax.clip_by_global_norm(cfg.clip_norm), adamw)


AdamW: Optimizer[AdamWConfig] = Optimizer("adamw", AdamWConfig, _adamw)
