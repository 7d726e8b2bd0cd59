"""The train state: its layout (shapes and device placement), a fresh one, a restored one.

A trainer builds a `StateLayout` once per setup, from the model, the optimizer and the
parameter sharding; everything else follows from it without touching real memory until
asked: `initialize` compiles the initializer straight into the layout's shardings (no
parameter is ever whole on one device), and `restore` reads a checkpoint into the same
abstract shapes, so a checkpoint written on four devices restores onto one, or the
reverse.

A checkpoint holds `checkpoint_arrays(state)`: the step, the parameters and the
optimizer state. The apply function and the optimizer are code, rebuilt from the
configuration.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from flax.training.train_state import TrainState

from theseus.training import checkpoints
from theseus.training.sharding import ParameterShardingContext

__all__ = ["StateLayout", "checkpoint_arrays", "initialize", "layout", "restore"]


@dataclass(frozen=True)
class StateLayout:
    """Where every part of a train state lives, before any of it exists.

    Attributes:
        abstract: the `TrainState` as `jax.ShapeDtypeStruct`s carrying their shardings.
        shardings: the `TrainState`'s `NamedSharding`s (the train step's `out_shardings`).
        init: `init(key) -> TrainState`, traceable; `initialize` compiles it.
        apply_fn: the model's `apply`.
        tx: the optimizer.
    """

    abstract: Any
    shardings: Any
    init: Callable[[jax.Array], TrainState]
    apply_fn: Callable[..., Any]
    tx: optax.GradientTransformation


def layout(
    model: nn.Module,
    tx: optax.GradientTransformation,
    block_size: int,
    sharding: ParameterShardingContext,
) -> StateLayout:
    """Trace `model.init` abstractly and place each leaf by its logical axes."""
    example = jnp.zeros((1, block_size), jnp.int32)

    def boxed_init(key: jax.Array) -> TrainState:
        with sharding.rules():
            variables = model.init(key, example)
        return TrainState.create(apply_fn=model.apply, params=variables["params"], tx=tx)

    boxed = jax.eval_shape(boxed_init, jax.random.key(0))
    shardings = nn.unbox(sharding.shardings_of(boxed))
    abstract = jax.tree_util.tree_map(
        lambda leaf, s: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=s),
        nn.unbox(boxed),
        shardings,
    )
    return StateLayout(
        abstract=abstract,
        shardings=shardings,
        init=lambda key: nn.unbox(boxed_init(key)),
        apply_fn=model.apply,
        tx=tx,
    )


def initialize(target: StateLayout, seed: int) -> TrainState:
    """A fresh state from `seed`, each leaf created directly in its sharding."""
    return jax.jit(target.init, out_shardings=target.shardings)(jax.random.key(seed))


def restore(
    path: Any,
    target: StateLayout,
    surgery: Callable[[Any, Any], Any] | None = None,
) -> tuple[TrainState, dict[str, Any]]:
    """The state saved in checkpoint folder `path`, laid out as `target`, and its metadata.

    Raises:
        CheckpointMismatchError: the checkpoint's shapes differ from the model's and
            there is no `surgery` (the message names the first mismatching parameter).
    """
    arrays, meta = checkpoints.restore(path, checkpoint_arrays(target.abstract), surgery)
    state = TrainState(
        step=arrays["step"],
        apply_fn=target.apply_fn,
        params=arrays["params"],
        tx=target.tx,
        opt_state=arrays["opt_state"],
    )
    return state, meta


def checkpoint_arrays(state: Any) -> dict[str, Any]:
    """The parts of a train state a checkpoint holds: step, parameters, optimizer state."""
    return {"step": state.step, "params": state.params, "opt_state": state.opt_state}
