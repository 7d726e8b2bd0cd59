"""Every RNG key a run derives, in one place, so training and inspection agree.

A run's randomness is a pure function of `training/seed` and the data cursor:

* `step_key(seed, cursor)`: the key of the update that consumes batch `cursor`;
* `micro_key(key, index, accumulate_steps)`: the key micro-step `index` of that
  update uses (the step key itself when there is no gradient accumulation);
* `layer_rngs(key)`: the RNG streams a replayed layer is bound with, so that
  calling `layer(inputs.x)` in the debugger or an analysis draws dropout masks of
  its own rather than repeating the masks of the traced forward pass.

`BaseTrainer.train_step` draws its dropout from `micro_key`, and the debugger and
the analysis engine replay the first micro-step with `micro_key(step_key, 0, ...)`,
so a stochastic analysis sees exactly the dropout training used.
"""

from __future__ import annotations

from typing import Any

import jax

__all__ = ["LAYER_STREAM", "layer_rngs", "micro_key", "step_key"]

# The fold that separates a bound layer's own dropout stream from the trace's.
LAYER_STREAM = 1


def step_key(seed: int, cursor: Any) -> jax.Array:
    """`fold_in(key(seed), cursor)`: the same key inside or outside a compiled program."""
    return jax.random.fold_in(jax.random.key(seed), cursor)


def micro_key(key: jax.Array, index: Any, accumulate_steps: int) -> jax.Array:
    """The dropout key of micro-step `index` of an update over `accumulate_steps` micro-batches."""
    return key if accumulate_steps == 1 else jax.random.fold_in(key, index)


def layer_rngs(key: jax.Array | None) -> dict[str, jax.Array] | None:
    """RNG streams for a bound layer replayed under `key` (None: deterministic use)."""
    return None if key is None else {"dropout": jax.random.fold_in(key, LAYER_STREAM)}
