"""Learning-rate schedules as data: a settings dataclass paired with a factory.

`Schedule.build(settings, peak_lr, total_steps)` returns an optax schedule (step ->
learning rate). A trainer with `SCHEDULE = None` trains at the constant `optimization/lr`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

import jax.numpy as jnp
import optax

from theseus.config import ConfigError, field, rule

__all__ = ["WSD", "Schedule", "WSDConfig", "constant"]

C = TypeVar("C")


@dataclass(frozen=True)
class Schedule(Generic[C]):
    """A named schedule: its settings schema and `factory(settings, peak_lr, total_steps)`."""

    name: str
    config: type[C]
    factory: Callable[[C, float, int], optax.Schedule]

    def build(self, settings: C, peak_lr: float, total_steps: int) -> optax.Schedule:
        """The schedule for hydrated `settings`, the peak rate and the run's length in steps."""
        if total_steps < 1:
            raise ConfigError(f"a schedule needs at least one step, got total_steps={total_steps}")
        return self.factory(settings, peak_lr, total_steps)


def constant(peak_lr: float) -> optax.Schedule:
    """The schedule of `SCHEDULE = None`: `peak_lr` at every step."""
    return optax.constant_schedule(peak_lr)


@rule("optimization/schedule/warmup", "optimization/schedule/stable", "optimization/schedule/decay")
def fractions(warmup: float, stable: float, decay: float) -> str | None:
    """The three phases of a warmup-stable-decay schedule cover the run: they sum to 1."""
    total = warmup + stable + decay
    if abs(total - 1.0) <= 1e-6:
        return None
    return (
        "Configuration values for 'optimization/schedule/{warmup,stable,decay}' must sum to 1 "
        f"(fractions of the run); got {warmup:g} + {stable:g} + {decay:g} = {total:g}. Change "
        "them to sum to 1, e.g. `optimization.schedule.stable="
        f"{max(0.0, 1.0 - warmup - decay):g}`."
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


def _wsd(cfg: WSDConfig, peak_lr: float, total_steps: int) -> optax.Schedule:
    parts = (cfg.warmup, cfg.stable, cfg.decay)
    if min(parts) < 0 or abs(sum(parts) - 1.0) > 1e-6:
        raise ConfigError(
            "optimization/schedule/{warmup,stable,decay} must be non-negative fractions summing "
            f"to 1, got {parts} (sum {sum(parts):g})"
        )
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
