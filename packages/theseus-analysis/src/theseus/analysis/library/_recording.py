"""One forward of the model, recorded for the library's measures: `record(...)` -> `Recording`.

The trainer's own `trace` runs once on a batch, listened to through the engine's
forward (`theseus.analysis._forward`, on `theseus.model.hooks`): the first call of each
block and of each attention layer is recorded (its module, variables, arguments and
output). What a measure reads comes from those calls and from the model itself, never
from a second copy of its arithmetic:

- `logits`, `loss`: what `trace` returned (the model's own);
- `residuals()`: the residual stream `[layers + 1, batch, seq, n_embd]`, the first
  block's input (the embeddings) and then each block's output;
- `weights(i)`: layer `i`'s attention probabilities `[batch, heads, query, key]`, its
  `SelfAttention.weights` (the reference computation) on the input it was called with;
- `unembed(h)`: the model's final norm and unembedding (`GPT.unembed`) of a residual
  stream `[..., seq, n_embd]`.

All of it runs under the analysis's `jax.jit`; values nobody reads are dropped by XLA.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from theseus.analysis._forward import Recorded, forward, unchanged
from theseus.analysis._sites import Outcome
from theseus.training.sharding import ParameterShardingContext

__all__ = ["Recording", "record"]


@dataclasses.dataclass(frozen=True)
class Recording:
    """One recorded forward (see the module docstring).

    Attributes:
        batch: the rows it ran on: `x`, `y` (`-1`: not counted), `padding_mask`
            `[batch, seq]`.
        logits: the model's logits `[batch, seq, vocab]`.
        loss: the model's own mean loss over the counted targets (a scalar).
        blocks: the blocks' paths, in call order.
        attentions: the attention layers' paths, in call order.
        calls: each recorded path's call.
    """

    batch: dict[str, jax.Array]
    logits: jax.Array
    loss: jax.Array
    blocks: tuple[str, ...]
    attentions: tuple[str, ...]
    calls: dict[str, Recorded]
    unembed_fn: Callable[[jax.Array], jax.Array]

    def counted(self) -> jax.Array:
        """`[batch, seq]` bool: the targets the loss counts (`y >= 0` and a real token)."""
        return (self.batch["y"] >= 0) & self.batch["padding_mask"].astype(bool)

    def token_losses(self) -> jax.Array:
        """`[batch, seq]` float32: each target's cross-entropy from the model's logits
        (0 where not counted)."""
        return _token_losses(self.logits, self.batch["y"], self.counted())

    def residuals(self) -> jax.Array:
        """`[layers + 1, batch, seq, n_embd]`: the embeddings, then each block's output."""
        first = self.calls[self.blocks[0]].arguments["x"]
        outputs = [self.calls[path].output for path in self.blocks]
        return jnp.stack([first, *outputs])

    def weights(self, layer: int) -> jax.Array:
        """Attention layer `layer`'s probabilities `[batch, heads, query, key]` (float32)."""
        call = self.calls[self.attentions[layer]]
        return call.module.bind(call.variables).weights(call.arguments["x"])

    def unembed(self, h: jax.Array) -> jax.Array:
        """The model's final norm and unembedding: `h [..., seq, n_embd]` -> logits."""
        return self.unembed_fn(h)


def _token_losses(logits: jax.Array, y: jax.Array, counted: jax.Array) -> jax.Array:
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    picked = jnp.take_along_axis(logp, jnp.where(counted, y, 0)[..., None], axis=-1)[..., 0]
    return jnp.where(counted, -picked, 0.0)


def record(
    trace: Callable[..., Any],
    state: Any,
    batch: dict[str, jax.Array],
    sharding: ParameterShardingContext,
    blocks: tuple[str, ...],
    attentions: tuple[str, ...],
    owner: str,
) -> Recording:
    """Run `trace` on `batch` (deterministically) recording the blocks' and attention
    layers' first calls.

    Args:
        trace: the trainer's `trace` classmethod (it must return `forward`'s
            `(logits, loss, metadata)`).
        state: the train state (`state.apply_fn`, `state.params`).
        batch: `x`, `y`, `padding_mask` `[batch, seq]`, placed.
        sharding: the trainer's mesh and rules.
        blocks, attentions: the paths to record.
        owner: the analysis class name, for messages.

    Raises:
        AnalysisError: `trace` returns something other than `(logits, loss, ...)`.
    """
    from theseus.analysis._errors import AnalysisError

    output, calls = forward(
        lambda: trace(state, batch, None, sharding=sharding),
        (*blocks, *attentions),
        unchanged,
        owner,
    )
    outcome = Outcome.of(output, batch)
    if outcome.logits is None or outcome.loss is None:
        raise AnalysisError(
            f"{owner}: the trainer's trace() returned {type(output).__name__}, not forward()'s "
            "(logits, loss, metadata); the library's analyses read the logits and the loss"
        )

    def unembed(h: jax.Array) -> jax.Array:
        with jax.sharding.use_abstract_mesh(sharding.mesh.abstract_mesh), sharding.rules():
            return state.apply_fn({"params": state.params}, h, method="unembed")

    return Recording(batch, outcome.logits, outcome.loss, blocks, attentions, calls, unembed)
