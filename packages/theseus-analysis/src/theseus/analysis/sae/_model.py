"""A sparse autoencoder's parameters, forward, loss and training step, as pure functions.

The three architectures researchers train (the names SAELens uses):

- ``relu``: ``f = ReLU((x - b_dec) W_enc + b_enc)``, trained on the squared error plus
  ``l1`` times the sum of each feature's activation scaled by its decoder row's norm
  (so shrinking a decoder row cannot buy a smaller penalty);
- ``topk``: the ``k`` largest pre-activations kept (after a ReLU), the rest zero; the loss
  is the squared error alone, the sparsity fixed by ``k``;
- ``jumprelu``: ``f = z * H(z - theta)`` with a learned threshold ``theta`` per feature,
  trained on the squared error plus ``l0`` times the count of active features; the
  Heaviside step's gradient with respect to ``theta`` is the straight-through estimate
  of a rectangle kernel of width ``bandwidth`` (Rajamanoharan et al., 2024).

For ``relu`` and ``topk`` the decoder rows are kept at unit norm after each update (the
norm would otherwise trade against the activations). Everything is a function of a
parameter dict and the :class:`SAEConfig`, so one ``jax.jit`` traces a step once, and a
sharded batch shards the step like a training step.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax

__all__ = [
    "ARCHITECTURES",
    "SAEConfig",
    "decode",
    "encode",
    "init_params",
    "loss_and_metrics",
    "make_train_step",
    "measures",
]

ARCHITECTURES = ("topk", "jumprelu", "relu")

Params = dict[str, jax.Array]


@dataclasses.dataclass(frozen=True)
class SAEConfig:
    """What an SAE is: its sizes, architecture and the sparsity it is trained for.

    Args:
        d_in: the width of the activations it reads.
        width: its number of features (the dictionary's size).
        architecture: ``topk``, ``jumprelu`` or ``relu``.
        k: active features per example (``topk``).
        l1: the L1 coefficient (``relu``).
        l0: the L0 coefficient (``jumprelu``).
        threshold: the initial threshold (``jumprelu``).
        bandwidth: the rectangle kernel's width of the threshold's gradient (``jumprelu``).
    """

    d_in: int
    width: int
    architecture: str = "topk"
    k: int = 32
    l1: float = 1e-3
    l0: float = 1e-3
    threshold: float = 1e-3
    bandwidth: float = 1e-3

    def __post_init__(self) -> None:
        if self.architecture not in ARCHITECTURES:
            raise ValueError(
                f"SAE architecture {self.architecture!r} is not one of {', '.join(ARCHITECTURES)}."
            )
        if self.d_in < 1 or self.width < 1:
            raise ValueError(
                f"An SAE needs d_in >= 1 and width >= 1; got d_in={self.d_in}, width={self.width}."
            )
        if self.architecture == "topk" and not 1 <= self.k <= self.width:
            raise ValueError(f"topk needs 1 <= k <= width ({self.width}); got k={self.k}.")


def init_params(config: SAEConfig, key: jax.Array) -> Params:
    """Decoder rows of unit norm in random directions, the encoder their transpose
    (features start as matched detectors), zero biases."""
    rows = jax.random.normal(key, (config.width, config.d_in), jnp.float32)
    rows = rows / jnp.linalg.norm(rows, axis=1, keepdims=True)
    params = {
        "W_dec": rows,
        "W_enc": rows.T,
        "b_enc": jnp.zeros((config.width,), jnp.float32),
        "b_dec": jnp.zeros((config.d_in,), jnp.float32),
    }
    if config.architecture == "jumprelu":
        params["log_threshold"] = jnp.full((config.width,), math.log(config.threshold), jnp.float32)
    return params


@jax.custom_vjp
def _jump(z: jax.Array, threshold: jax.Array, bandwidth: float) -> jax.Array:
    return z * (z > threshold)


def _jump_forward(z: jax.Array, threshold: jax.Array, bandwidth: float) -> Any:
    return _jump(z, threshold, bandwidth), (z, threshold, bandwidth)


def _jump_backward(saved: Any, grad: jax.Array) -> Any:
    z, threshold, bandwidth = saved
    inside = (jnp.abs(z - threshold) < bandwidth / 2) / bandwidth  # the rectangle kernel
    grad_z = grad * (z > threshold)
    grad_threshold = -(threshold * inside * grad)
    return grad_z, jnp.sum(grad_threshold.reshape(-1, threshold.shape[-1]), axis=0), None


_jump.defvjp(_jump_forward, _jump_backward)


@jax.custom_vjp
def _step(z: jax.Array, threshold: jax.Array, bandwidth: float) -> jax.Array:
    return (z > threshold).astype(z.dtype)


def _step_forward(z: jax.Array, threshold: jax.Array, bandwidth: float) -> Any:
    return _step(z, threshold, bandwidth), (z, threshold, bandwidth)


def _step_backward(saved: Any, grad: jax.Array) -> Any:
    z, threshold, bandwidth = saved
    inside = (jnp.abs(z - threshold) < bandwidth / 2) / bandwidth
    grad_threshold = -(inside * grad)
    return jnp.zeros_like(z), jnp.sum(grad_threshold.reshape(-1, threshold.shape[-1]), axis=0), None


_step.defvjp(_step_forward, _step_backward)


def _pre(params: Params, x: jax.Array) -> jax.Array:
    return (x - params["b_dec"]) @ params["W_enc"] + params["b_enc"]


def _top_k(pre: jax.Array, k: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The top-k activations of ``pre [..., width]`` (the ``k`` largest, after a ReLU,
    scattered into zeros), and the kept ``values`` and their ``indices``, ``[rows, k]``."""
    width = pre.shape[-1]
    values, indices = jax.lax.top_k(pre, k)
    values, indices = jax.nn.relu(values.reshape(-1, k)), indices.reshape(-1, k)
    rows = jnp.arange(values.shape[0])[:, None]
    chosen = jnp.zeros((values.shape[0], width), pre.dtype).at[rows, indices].set(values)
    return chosen.reshape(pre.shape), values, indices


def encode(params: Params, x: jax.Array, config: SAEConfig) -> jax.Array:
    """The feature activations of ``x`` (``[..., d_in]`` to ``[..., width]``)."""
    pre = _pre(params, x)
    if config.architecture == "relu":
        return jax.nn.relu(pre)
    if config.architecture == "topk":
        return _top_k(pre, config.k)[0]
    threshold = jnp.exp(params["log_threshold"])
    return _jump(jax.nn.relu(pre), threshold, config.bandwidth)


def decode(params: Params, features: jax.Array) -> jax.Array:
    """The reconstruction of activations from features."""
    return features @ params["W_dec"] + params["b_dec"]


def loss_and_metrics(
    params: Params, x: jax.Array, config: SAEConfig
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The training loss of a batch ``[n, d_in]``, its parts (``mse``, ``sparsity``) and
    which features fired on it (``fired``, ``[width]``)."""
    if config.architecture == "topk":
        # Which features fired, from the kept indices: k of the width per row, where a
        # reduction over the dense activations would read all of them.
        features, values, indices = _top_k(_pre(params, x), config.k)
        kept = jnp.where(values > 0, indices, config.width)  # out of range: dropped
        fired = jnp.zeros(config.width, bool).at[kept].set(True, mode="drop")
    else:
        features = encode(params, x, config)
        fired = jnp.any(features > 0, axis=tuple(range(features.ndim - 1)))
    error = decode(params, features) - x
    mse = jnp.mean(jnp.sum(error**2, axis=-1))
    if config.architecture == "relu":
        norms = jnp.linalg.norm(params["W_dec"], axis=1)
        sparsity = config.l1 * jnp.mean(jnp.sum(features * norms, axis=-1))
    elif config.architecture == "jumprelu":
        threshold = jnp.exp(params["log_threshold"])
        active = _step(jax.nn.relu(_pre(params, x)), threshold, config.bandwidth)
        sparsity = config.l0 * jnp.mean(jnp.sum(active, axis=-1))
    else:
        sparsity = jnp.zeros((), mse.dtype)
    return mse + sparsity, {"mse": mse, "sparsity": sparsity, "fired": fired}


def _unit_rows(params: Params) -> Params:
    rows = params["W_dec"]
    return {
        **params,
        "W_dec": rows / jnp.maximum(jnp.linalg.norm(rows, axis=1, keepdims=True), 1e-8),
    }


def make_train_step(
    config: SAEConfig, optimizer: optax.GradientTransformation
) -> Callable[[Params, Any, jax.Array], tuple[Params, Any, dict[str, jax.Array]]]:
    """``step(params, opt_state, batch) -> (params, opt_state, metrics)``, not yet jitted."""

    def step(params: Params, opt_state: Any, batch: jax.Array) -> Any:
        (loss, parts), grads = jax.value_and_grad(loss_and_metrics, has_aux=True)(
            params, batch, config
        )
        updates, opt_state = optimizer.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        if config.architecture != "jumprelu":
            params = _unit_rows(params)
        return params, opt_state, {"loss": loss, **parts}

    return step


def measures(params: Params, x: jax.Array, config: SAEConfig) -> dict[str, jax.Array]:
    """On held-out activations ``[n, d_in]``: ``l0`` (mean active features per example),
    ``fvu`` (the fraction of variance unexplained: the squared error over the squared
    deviation from the batch's mean) and ``dead`` (the fraction of features active on no
    example)."""
    features = encode(params, x, config)
    error = decode(params, features) - x
    deviation = x - jnp.mean(x, axis=0, keepdims=True)
    return {
        "l0": jnp.mean(jnp.sum(features > 0, axis=-1)),
        "fvu": jnp.sum(error**2) / jnp.sum(deviation**2),
        "dead": jnp.mean(jnp.all(features <= 0, axis=0)),
    }
