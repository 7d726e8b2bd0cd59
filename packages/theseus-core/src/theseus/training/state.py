"""The train state: its layout (shapes and device placement), a fresh one, a restored one.

A trainer builds a `StateLayout` once per setup, from the model, the optimizer and the
parameter sharding; everything else follows from it without touching real memory until
asked: `initialize` compiles the initializer straight into the layout's shardings (no
parameter is ever whole on one device), and `restore` reads a checkpoint into the same
abstract shapes, so a checkpoint written on four devices restores onto one, or the
reverse.

A checkpoint holds `checkpoint_arrays(state)`: the step, the parameters and the
optimizer state (an import's, `weights_state`, the step and parameters alone; restoring
it starts the optimizer fresh). The apply function and the optimizer are code, rebuilt from the
configuration.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax.training.train_state import TrainState

from theseus.training import checkpoints
from theseus.training.sharding import ParameterShardingContext

__all__ = [
    "StateLayout",
    "checkpoint_arrays",
    "from_params",
    "initialize",
    "layout",
    "restore",
    "weights_state",
]


@dataclass(frozen=True)
class StateLayout:
    """Where every part of a train state lives, before any of it exists.

    Attributes:
        abstract: the `TrainState` as `jax.ShapeDtypeStruct`s carrying their shardings.
        shardings: the `TrainState`'s `NamedSharding`s (the train step's `out_shardings`).
        init: `init(key) -> params`, compiled into the parameters' shardings (shared by
            the layouts of equal models; `initialize` adds the optimizer state).
        apply_fn: the model's `apply`.
        tx: the optimizer.
        fresh_opt_state: `tx.init` compiled into the optimizer state's shardings (what a
            checkpoint of weights alone restores with; compiled once for a walk's nodes).
    """

    abstract: Any
    shardings: Any
    init: Callable[[jax.Array], Any]
    apply_fn: Callable[..., Any]
    tx: optax.GradientTransformation
    fresh_opt_state: Callable[[Any], Any]


def layout(
    model: nn.Module,
    tx: optax.GradientTransformation,
    block_size: int,
    sharding: ParameterShardingContext,
) -> StateLayout:
    """Trace `model.init` abstractly and place each leaf by its logical axes.

    The model's part (its abstract parameters, and their compiled initializer) is kept
    for the next layout of an equal model, context and sharding in this process (a sweep,
    a walk, a test suite): only the optimizer's part is traced again.
    """
    params = _model_part(model, block_size, sharding)
    boxed = jax.eval_shape(
        lambda p: TrainState.create(apply_fn=model.apply, params=p, tx=tx), params.boxed
    )
    shardings = nn.unbox(sharding.state_shardings(boxed))
    abstract = jax.tree_util.tree_map(
        lambda leaf, s: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=s),
        nn.unbox(boxed),
        shardings,
    )
    return StateLayout(
        abstract=abstract,
        shardings=shardings,
        init=params.initializer(shardings.params),
        apply_fn=model.apply,
        tx=tx,
        fresh_opt_state=jax.jit(tx.init, out_shardings=shardings.opt_state),
    )


@dataclass
class _ModelPart:
    """A model's abstract parameters (logically partitioned) and their initializer.

    `initializer(shardings)` is `init(key) -> params`, compiled into `shardings`: the
    parameters' shardings follow from the boxed parameters and the sharding context
    alone, so every layout of the same key asks for the same ones, and the first
    compiled initializer serves them all.
    """

    model: nn.Module
    example: jax.Array
    sharding: ParameterShardingContext
    boxed: Any
    _init: Any = None

    def initializer(self, shardings: Any) -> Callable[[jax.Array], Any]:
        if self._init is None:

            def init(key: jax.Array) -> Any:
                with self.sharding.rules():
                    return nn.unbox(self.model.init(key, self.example)["params"])

            self._init = jax.jit(init, out_shardings=shardings)
        return self._init


_MODEL_PARTS: collections.OrderedDict[Any, _ModelPart] = collections.OrderedDict()
_KEPT = 16  # model parts kept (the least recently used goes first)
_MODEL_PARTS_LOCK = threading.Lock()


def _model_part(
    model: nn.Module, block_size: int, sharding: ParameterShardingContext
) -> _ModelPart:
    """The `_ModelPart` of `model` at `block_size` under `sharding`, traced once per key.

    The key is the model itself (a Flax module compares and hashes by its class and
    fields), the block size, the sharding context (mesh, rules, strategy) and whether
    64-bit types are on; a model that cannot be hashed (a field holding an array) is
    traced every time.
    """
    example = jnp.zeros((1, block_size), jnp.int32)

    def trace() -> _ModelPart:
        def boxed_init(key: jax.Array) -> Any:
            with sharding.rules():
                return model.init(key, example)["params"]

        return _ModelPart(model, example, sharding, jax.eval_shape(boxed_init, jax.random.key(0)))

    x64 = jax.dtypes.canonicalize_dtype(np.float64) == np.float64  # 64-bit types on
    key = (model, block_size, sharding, x64)
    try:
        hash(key)
    except TypeError:  # a field that cannot be hashed
        return trace()
    with _MODEL_PARTS_LOCK:
        part = _MODEL_PARTS.get(key)
        if part is not None:
            _MODEL_PARTS.move_to_end(key)
            return part
    part = trace()
    with _MODEL_PARTS_LOCK:
        part = _MODEL_PARTS.setdefault(key, part)  # another thread's, where it was first
        while len(_MODEL_PARTS) > _KEPT:
            _MODEL_PARTS.popitem(last=False)
    return part


def initialize(target: StateLayout, seed: int) -> TrainState:
    """A fresh state from `seed`, each leaf created directly in its sharding."""
    return _with_optimizer(target, target.init(jax.random.key(seed)))


def _with_optimizer(target: StateLayout, params: Any) -> TrainState:
    """A state at step 0 holding placed `params` (taken: donated) and a fresh optimizer state."""

    def create(params: Any) -> TrainState:
        return TrainState.create(apply_fn=target.apply_fn, params=params, tx=target.tx)

    return jax.jit(create, out_shardings=target.shardings, donate_argnums=0)(params)


def from_params(target: StateLayout, params: Any) -> TrainState:
    """A state at step 0 holding given parameters (host arrays), with a fresh optimizer.

    Each parameter goes straight to its sharding; the optimizer state is initialized
    from them inside one compiled function, in its own shardings.

    Raises:
        ValueError: `params` does not have the layout's tree, shapes and dtypes (the
            message names the first parameter that differs).
    """
    wanted = target.abstract.params
    given = {
        jax.tree_util.keystr(path): value
        for path, value in jax.tree_util.tree_flatten_with_path(params)[0]
    }
    expected, treedef = jax.tree_util.tree_flatten_with_path(wanted)
    leaves = []
    for path, leaf in expected:
        name = jax.tree_util.keystr(path)
        found = given.pop(name, None)
        if found is None or tuple(found.shape) != tuple(leaf.shape):
            has = "is missing" if found is None else f"has shape {tuple(found.shape)}"
            raise ValueError(f"parameter {name} {has}; the model needs {tuple(leaf.shape)}")
        leaves.append(jax.device_put(np.asarray(found, leaf.dtype), leaf.sharding))
    if given:
        raise ValueError(f"parameter {next(iter(given))} is not one of the model's")
    return _with_optimizer(target, jax.tree_util.tree_unflatten(treedef, leaves))


def restore(
    path: Any,
    target: StateLayout,
    surgery: Callable[[Any, Any], Any] | None = None,
) -> tuple[TrainState, dict[str, Any]]:
    """The state saved in checkpoint folder `path`, laid out as `target`, and its metadata.

    Raises:
        TrainerError: the checkpoint's shapes differ from the model's and
            there is no `surgery` (the message names the first mismatching parameter).
    """
    arrays, meta = checkpoints.restore(
        path, checkpoint_arrays(target.abstract), surgery, optional=("opt_state",)
    )
    opt_state = arrays.get("opt_state")
    if opt_state is None:  # weights only (an import): the optimizer starts fresh
        opt_state = target.fresh_opt_state(arrays["params"])
    state = TrainState(
        step=arrays["step"],
        apply_fn=target.apply_fn,
        params=arrays["params"],
        tx=target.tx,
        opt_state=opt_state,
    )
    return state, meta


def checkpoint_arrays(state: Any) -> dict[str, Any]:
    """The parts of a train state a checkpoint holds: step, parameters, optimizer state.

    A state without an optimizer state (`weights_state`: imported weights) gives step and
    parameters only; `restore` then starts the optimizer fresh, as a fine-tuning run of
    those weights would.
    """
    arrays = {"step": state.step, "params": state.params}
    if state.opt_state is not None:
        arrays["opt_state"] = state.opt_state
    return arrays


def weights_state(target: StateLayout, params: Any) -> TrainState:
    """A state at step 0 holding placed `params` and no optimizer state.

    What an import saves: its checkpoint holds the weights alone (a third of a state
    with Adam's two moments, which are zeros before any training), and restoring it
    gives a fresh optimizer.
    """
    step = jax.device_put(jnp.zeros((), jnp.int32), target.shardings.step)
    return TrainState(
        step=step, apply_fn=target.apply_fn, params=params, tx=target.tx, opt_state=None
    )
