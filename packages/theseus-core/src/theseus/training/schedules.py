"""Learning-rate schedules as data: a settings dataclass paired with a factory.

`Schedule.build(settings, peak_lr, total_steps)` returns an optax schedule (step ->
learning rate). A trainer with `SCHEDULE = None` trains at the constant `optimization/lr`.
The settings' declaration is their only check (`build` holds settings made in Python to
it); WSD's are declared in `theseus.training.optimization` with every other
`optimization/*` key.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

import jax.numpy as jnp
import optax

from theseus.config import ConfigError, check_settings
from theseus.training.optimization import WSDConfig

__all__ = ["WSD", "Schedule", "WSDConfig", "constant"]

C = TypeVar("C")


@dataclass(frozen=True)
class Schedule(Generic[C]):
    """A named schedule: its settings schema and `factory(settings, peak_lr, total_steps)`."""

    name: str
    config: type[C]
    factory: Callable[[C, float, int], optax.Schedule]

    def build(self, settings: C, peak_lr: float, total_steps: int) -> optax.Schedule:
        """The schedule for `settings`, the peak rate and the run's length in steps.

        Raises:
            ConfigError: `total_steps` < 1.
            ConfigRangeError: a value the settings' declaration does not admit (the
                message a configuration gives).
        """
        if total_steps < 1:
            raise ConfigError(f"a schedule needs at least one step, got total_steps={total_steps}")
        check_settings(settings)
        return self.factory(settings, peak_lr, total_steps)


def constant(peak_lr: float) -> optax.Schedule:
    """The schedule of `SCHEDULE = None`: `peak_lr` at every step."""
    return optax.constant_schedule(peak_lr)


def _wsd(cfg: WSDConfig, peak_lr: float, total_steps: int) -> optax.Schedule:
    warmup = round(cfg.warmup * total_steps)
    decay = round(cfg.decay * total_steps)
    decay_start = total_steps - decay
    final = cfg.final_ratio * peak_lr

    def schedule(step: jnp.ndarray | int) -> jnp.ndarray:
        # Step s is the s-th update (s = 1 first): warmup reaches peak at s = warmup.
        s = jnp.asarray(step, jnp.float32) + 1.0
        rising = peak_lr * jnp.minimum(s / max(warmup, 1), 1.0)
        falling = peak_lr + (final - peak_lr) * jnp.clip(
            (s - decay_start) / max(decay, 1), 0.0, 1.0
        )
        return jnp.where(s <= decay_start, rising, jnp.minimum(rising, falling))

    return schedule


WSD: Schedule[WSDConfig] = Schedule("wsd", WSDConfig, _wsd)
