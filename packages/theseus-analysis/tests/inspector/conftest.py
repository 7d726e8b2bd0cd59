"""Small models shared by the inspector tests, with weights set by hand."""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.tree_util import register_dataclass


@register_dataclass
@dataclass
class Linear:
    """``x @ weight + bias``."""

    weight: jax.Array
    bias: jax.Array

    def __call__(self, x: jax.Array) -> jax.Array:
        return jnp.dot(x, self.weight) + self.bias


@register_dataclass
@dataclass
class SubModel:
    """One linear layer."""

    linear: Linear

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.linear(x)


@register_dataclass
@dataclass
class Model:
    """The documented example: ``sub_model.linear``."""

    sub_model: SubModel

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.sub_model(x)


@register_dataclass
@dataclass
class TwoLayer:
    """``second(tanh(first(x))) * scale``, calling ``first`` twice when asked."""

    first: Linear
    second: Linear

    def __call__(self, x: jax.Array, twice: bool = False) -> jax.Array:
        h = jnp.tanh(self.first(x))
        if twice:
            h = h + jnp.tanh(self.first(x * 2.0))
        return self.second(h)


def make_linear(rng: np.random.Generator, n_in: int, n_out: int) -> Linear:
    """A Linear layer with Gaussian weights."""
    return Linear(
        jnp.asarray(rng.normal(size=(n_in, n_out)), jnp.float32),
        jnp.asarray(rng.normal(size=(n_out,)), jnp.float32),
    )


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(0)


@pytest.fixture
def doc_model(rng: np.random.Generator) -> Model:
    return Model(SubModel(make_linear(rng, 2, 2)))


@pytest.fixture
def two_layer(rng: np.random.Generator) -> TwoLayer:
    return TwoLayer(make_linear(rng, 3, 4), make_linear(rng, 4, 2))


@pytest.fixture
def x(rng: np.random.Generator) -> jax.Array:
    return jnp.asarray(rng.normal(size=(5, 3)), jnp.float32)
