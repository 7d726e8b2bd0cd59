"""The arithmetic of one step, as pure functions: what `train_step` and `val_step` compute.

`BaseTrainer.train_step` and `val_step` stay the documented override points; the work
they share with any override lives here, free of trainer state, so it can be read and
tested on its own:

* `accumulate_steps`: how many micro-batches one optimizer step sums (and the
  divisibility checks of the batch geometry);
* `gradients`: loss, metadata and gradients of a batch, summed over micro-batches with
  `lax.scan` (each micro-step with its own `keys.micro_key`) and averaged;
* `global_norm`: the gradient norm the loop reports;
* `counted_targets`: how many targets of a batch the loss counts;
* `compile_train`, `compile_val`: the jitted programs the loop calls (the step key is
  derived inside the program from the cursor, so the host never waits for it);
* `scalar_keys`: the metadata entries a step reports as `train/KEY` or `val/KEY`;
* `step_context`: what the train and validation steps are traced under.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp

from theseus.training import keys
from theseus.training._errors import TrainerError
from theseus.training.sharding import ParameterShardingContext

__all__ = [
    "accumulate_steps",
    "compile_train",
    "compile_val",
    "counted_targets",
    "global_norm",
    "gradients",
    "scalar_keys",
    "step_context",
]

#: `loss_fn(params, batch, key) -> (loss, meta)`: the forward pass `train_step` differentiates.
LossFn = Callable[[Any, dict[str, Any], jax.Array], Any]


def accumulate_steps(batch_size: int, per_device: int, parallel: int) -> int:
    """Micro-steps per optimizer step: `batch_size / (per_device * parallel)`, 1 without accumulation.

    Raises:
        TrainerError: `batch_size` does not split over the `parallel` data-parallel
            devices, or into micro-batches of `per_device` rows per device.
    """
    if batch_size % parallel:
        raise TrainerError(
            f"training/batch_size = {batch_size} must be divisible by the "
            f"{parallel} data-parallel devices; use a multiple of {parallel}"
        )
    if per_device <= 0:
        return 1
    micro = per_device * parallel
    if batch_size % micro:
        raise TrainerError(
            f"training/batch_size = {batch_size} is not divisible by "
            f"training/per_device_batch_size ({per_device}) x {parallel} devices = {micro}; "
            f"choose a batch size that is a multiple of {micro}"
        )
    return batch_size // micro


def gradients(
    loss_fn: LossFn, params: Any, batch: dict[str, Any], key: jax.Array, accumulate_steps: int
) -> tuple[jax.Array, dict[str, Any], Any]:
    """`(loss, meta, grads)` of `loss_fn` on `batch [rows, ...]`, averaged over micro-batches.

    With `accumulate_steps > 1` the rows are split into `[accumulate_steps, rows /
    accumulate_steps, ...]` (row `i` goes to micro-batch `i % accumulate_steps`), and
    `lax.scan` sums the gradients and losses, micro-step `index` drawing its dropout
    from `keys.micro_key(key, index, accumulate_steps)`; loss, gradients and each
    metadata entry are then divided by `accumulate_steps`.
    """
    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
    if accumulate_steps == 1:
        (loss, meta), grads = grad_fn(params, batch, key)
        return loss, meta, grads
    micro = jax.tree_util.tree_map(
        lambda a: a.reshape(
            a.shape[0] // accumulate_steps, accumulate_steps, *a.shape[1:]
        ).swapaxes(0, 1),
        batch,
    )

    def body(carry: Any, inputs: Any) -> Any:
        grads_sum, loss_sum = carry
        piece, index = inputs
        (loss, meta), grads = grad_fn(params, piece, keys.micro_key(key, index, accumulate_steps))
        grads_sum = jax.tree_util.tree_map(jnp.add, grads_sum, grads)
        return (grads_sum, loss_sum + loss), meta

    zeros = jax.tree_util.tree_map(jnp.zeros_like, params)
    (grads, loss), metas = jax.lax.scan(
        body, (zeros, jnp.zeros((), jnp.float32)), (micro, jnp.arange(accumulate_steps))
    )
    grads = jax.tree_util.tree_map(lambda g: g / accumulate_steps, grads)
    loss = loss / accumulate_steps
    meta = jax.tree_util.tree_map(lambda m: m.mean(0), metas)
    return loss, meta, grads


def global_norm(grads: Any) -> jax.Array:
    """The L2 norm of every gradient leaf together, computed in float32."""
    return jnp.sqrt(sum(jnp.sum(jnp.square(g.astype(jnp.float32))) for g in jax.tree.leaves(grads)))


def counted_targets(batch: dict[str, Any]) -> jax.Array:
    """How many targets of `batch` the loss counts: `y >= 0` and not padding."""
    return jnp.sum((batch["y"] >= 0) & batch["padding_mask"].astype(bool))


def compile_train(
    train_step: Callable[..., Any],
    seed: int,
    accumulate: int,
    sharding: ParameterShardingContext,
    state_shardings: Any,
) -> Any:
    """`fn(state, batch, cursor) -> (state, loss, meta, grad_norm)`, jitted with the state donated.

    The step's key is `keys.step_key(seed, cursor)`, derived inside the program from a
    uint32 cursor; the new state is laid out in `state_shardings` (the strategy's).
    """
    return jax.jit(
        lambda state, batch, cursor: train_step(
            state, batch, keys.step_key(seed, cursor), accumulate, sharding=sharding
        ),
        out_shardings=(state_shardings, None, None, None),
        donate_argnums=0,
    )


def compile_val(val_step: Callable[..., Any], sharding: ParameterShardingContext) -> Any:
    """`fn(state, batch) -> (loss_sum, count, meta)`, jitted."""
    return jax.jit(lambda state, batch: val_step(state, batch, sharding=sharding))


def scalar_keys(meta: dict[str, Any]) -> list[str]:
    """The keys of `meta` whose values are scalars (0-d arrays, ints, floats)."""
    return [
        k for k, v in meta.items() if getattr(v, "ndim", None) == 0 or isinstance(v, int | float)
    ]


@contextlib.contextmanager
def step_context(sharding: ParameterShardingContext) -> Iterator[None]:
    """The logical-axis rules, and on a TPU with several devices the mesh too.

    The Pallas attention kernels run per device through `shard_map`, which needs the
    mesh (`theseus.model.attention.kernels`); elsewhere the steps keep XLA's own
    partitioning, as they always had (under the mesh the model's logical constraints
    would apply and change the reduction order: 2.5e-5 relative after four FSDP + tensor
    parallel steps on CPU, against the 1e-5 that test_remat holds them to).
    """
    with contextlib.ExitStack() as stack:
        if jax.default_backend() == "tpu" and sharding.mesh.size > 1:
            stack.enter_context(jax.sharding.use_abstract_mesh(sharding.mesh.abstract_mesh))
        stack.enter_context(sharding.rules())
        yield
